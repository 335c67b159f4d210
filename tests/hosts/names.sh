#!/bin/bash
# The emulated hosts' names in /etc/hosts (mnodeK at 127.0.0.(K+1)), as a cluster's DNS gives them:
# a rank that publishes its host name (torch.distributed's rendezvous address) must be found by the
# others. Lines are tagged, added only if missing, and removed in place (/etc/hosts is often a bind
# mount that cannot be replaced).
#
#   tests/hosts/names.sh add [N]     # mnode1..mnodeN (default 3); prints "added" if it added them
#   tests/hosts/names.sh remove      # the tagged lines
set -euo pipefail
TAG="# ddpipe test hosts"

case ${1:-} in
add)
    if grep -q "$TAG" /etc/hosts; then
        exit 0
    fi
    for k in $(seq "${2:-3}"); do
        echo "127.0.0.$((k + 1)) mnode$k $TAG"
    done >>/etc/hosts
    echo added
    ;;
remove)
    kept=$(grep -v "$TAG" /etc/hosts || true)
    printf '%s\n' "$kept" >/etc/hosts
    ;;
*)
    echo "usage: $0 add [N] | remove" >&2
    exit 2
    ;;
esac
