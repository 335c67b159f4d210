#!/usr/bin/env bash
# A lent GPU machine starts bare, cannot fetch packages, runs Python 3.12 with torch, and takes at most
# 64 MiB of carried files a call. This packs what benchmarks/gpu_checks.sh needs beyond that image, so
# that a short lease is spent measuring:
#
#     benchmarks/gpu_lease.sh pack        # here: DALI in parts (.devcarry/), ddpipe's missing
#                                         # dependencies as wheels (.whl/), and the calls to make
#     benchmarks/gpu_lease.sh run [ARGS]  # there: install both under /tmp/site, then
#                                         # gpu_checks.sh "$OUT" ARGS
#
# Both folders are ignored by git; each call carries some of them, and what one call carried stays
# on the machine while it is warm.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
site=/tmp/site
# ddpipe's dependencies (pyproject.toml) that the machine's image lacks, and theirs
wheels=(lmdb simplejpeg webdataset braceexpand obstore pyzmq)

pack() {
    local packer=${DALI_PACKER:-$root/../shared/tools/dali-for-device}
    if ! ls .devcarry/dali.tar.xz.part* >/dev/null 2>&1; then
        [ -x "$packer" ] || { echo "gpu_lease.sh: no DALI packer at $packer (set DALI_PACKER)" >&2; exit 1; }
        "$packer" >/tmp/dali-for-device.log 2>&1 || { tail -5 /tmp/dali-for-device.log >&2; exit 1; }
    fi
    rm -rf .whl
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
        -d .whl "${wheels[@]}" 2>&1 | grep -v '^WARNING: Location' || true
    [ "$(ls .whl/*.whl | wc -l)" -eq "${#wheels[@]}" ] || { echo "gpu_lease.sh: some wheels are missing from .whl" >&2; exit 1; }
    local parts=(.devcarry/dali.tar.xz.part*) last
    last=${parts[-1]}
    echo "device calls, one after another (each within about a minute of the last, or the machine goes back):"
    for p in "${parts[@]}"; do
        [ "$p" = "$last" ] || echo "  run carry=[\"$p\"] command='ls .devcarry' timeout_s=60"
    done
    echo "  run carry=[\".whl\"] command='ls .whl' timeout_s=60"
    # two measuring commands: the rows need more than one 10-minute command leaves them beside the training
    # runs (gpu_checks.sh); the second finds DALI unpacked while the machine is warm
    echo "  run carry=[\"$last\"] command='bash benchmarks/gpu_lease.sh run 70 360 0 0' timeout_s=590"
    echo "  run command='bash benchmarks/gpu_lease.sh run 0 0 200 90' timeout_s=320"
}

run() {
    local out=${OUT:?run on the GPU machine, where OUT names the folder that comes back}
    if [ ! -e "$site/nvidia/dali" ]; then
        cat .devcarry/dali.tar.xz.part* | python3 -c \
            'import lzma, sys, tarfile; tarfile.open(fileobj=lzma.open(sys.stdin.buffer), mode="r|").extractall(sys.argv[1])' "$site"
    fi
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl
    export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
    { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; } >"$out/machine.txt" 2>&1 || true
    exec bash benchmarks/gpu_checks.sh "$out" "$@"
}

case ${1:-} in
    pack) pack ;;
    run) shift; run "$@" ;;
    *) echo "usage: benchmarks/gpu_lease.sh pack | run [gpu_checks.sh's limits]" >&2; exit 2 ;;
esac
