#!/usr/bin/env bash
# Every check that needs a GPU, in the order a short lease on a GPU machine should spend it:
# the CUDA tests, the benchmarks/gpu.py record (written after every run, so a run cut short keeps
# what it measured), then the probe. Each step is bounded; logs go to OUTDIR.
#
#     benchmarks/gpu_checks.sh OUTDIR [TESTS_S GPU_S PROBE_S]    # defaults: 120 420 90 seconds
#
# Needs DALI, torch with CUDA, and ddpipe's dependencies importable (PYTHONPATH may point at them).
# On a 16-core H200 machine the tests took about a minute, and gpu.py's 25 runs about seven.
set -u
out=${1:?usage: benchmarks/gpu_checks.sh OUTDIR [TESTS_S GPU_S PROBE_S]}
tests_s=${2:-120} gpu_s=${3:-420} probe_s=${4:-90}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
cd "$root" || exit 1
export PYTHONUNBUFFERED=1 PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
py=${PYTHON:-python3}
start=$SECONDS
step() { echo "== $1: done at $((SECONDS - start)) s (exit $2)"; }
"$py" -c 'import torch, nvidia.dali, simplejpeg; assert torch.cuda.is_available(), "no CUDA device"' || exit 1
timeout "$tests_s" "$py" -m pytest -q -p no:cacheprovider tests/train/test_gpu.py tests/decode/test_decode.py \
    -k "gpu or cuda or pinned" >"$out/tests.log" 2>&1
step "CUDA tests ($(tail -1 "$out/tests.log"))" $?
timeout "$gpu_s" "$py" benchmarks/gpu.py --n 8000 --epochs 3 --repeats 2 >"$out/gpu.log" 2>&1
step "benchmarks/gpu.py" $?
cp benchmarks/results/gpu.json "$out/" 2>/dev/null
timeout "$probe_s" "$py" benchmarks/gpu.py --n 8000 --epochs 3 --probe >"$out/probe.log" 2>&1
step "benchmarks/gpu.py --probe" $?
