#!/usr/bin/env bash
# Every check that needs a GPU, in the order a short lease on a GPU machine should spend it: the
# CUDA tests; the rows that decide the GPU target (DALI's own webdataset pipeline and ddpipe's
# dali-gpu loader on each format, in one run: gpu.json); ResNet-50 fed by the loader against the
# model alone, and in a plain loop fed by the Loader and by DALI's own pipeline (gpu-train.json);
# the probe; then, with what is left, every other row (gpu-all.json).
# gpu.py writes its result after every run, so a step cut short keeps what it measured. Each step
# is bounded; logs and results go to OUTDIR.
#
#     benchmarks/gpu_checks.sh OUTDIR [TESTS_S ROWS_S TRAIN_S PROBE_S ALL_S]
#
# A limit of 0 skips its step. The defaults (70 270 185 65 0 seconds) fit one 10-minute command, but on an
# H200 at e51d624 the rows needed more than their 270 s (the run was cut before DALI's own pipeline ran a
# second time) and the training runs 183 s: gpu_lease.sh splits the steps over two commands
# (70 360 0 0, then 0 0 200 90), which fit a 15-minute lease with its start and the carried parts.
# Needs DALI, torch with CUDA, and ddpipe's dependencies importable (PYTHONPATH may point at them).
# On a 16-core H200 machine the tests took about a minute, the rows (the data made first) under four,
# the training runs two to four minutes, and gpu.py's 25 runs of the full record about seven.
set -u
out=${1:?usage: benchmarks/gpu_checks.sh OUTDIR [TESTS_S ROWS_S TRAIN_S PROBE_S ALL_S]}
tests_s=${2:-70} rows_s=${3:-270} train_s=${4:-185} probe_s=${5:-65} all_s=${6:-0}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
cd "$root" || exit 1
export PYTHONUNBUFFERED=1 PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
py=${PYTHON:-python3}
start=$SECONDS
step() { echo "== $1: done at $((SECONDS - start)) s (exit $2)"; }
gpu() {  # gpu.py with a time limit; its result, complete or not, kept in OUTDIR under the name $1
    local name=$1 limit=$2
    shift 2
    rm -f benchmarks/results/gpu.json
    timeout "$limit" "$py" benchmarks/gpu.py --n 8000 --epochs 3 "$@" >"$out/$name.log" 2>&1
    local status=$?
    cp benchmarks/results/gpu.json "$out/$name.json" 2>/dev/null
    step "benchmarks/gpu.py -> $name.json" $status
}
"$py" -c 'import torch, nvidia.dali, simplejpeg; assert torch.cuda.is_available(), "no CUDA device"' || exit 1
if [ "$tests_s" -gt 0 ]; then
    timeout "$tests_s" "$py" -m pytest -q -p no:cacheprovider tests/train/test_gpu.py tests/decode/test_dali_path.py \
        tests/decode/test_batch_memory.py -k "gpu or cuda or pinned" >"$out/tests.log" 2>&1
    step "CUDA tests ($(tail -1 "$out/tests.log"))" $?
fi
if [ "$rows_s" -gt 0 ]; then
    gpu gpu "$rows_s" --repeats 2 --skip-train --only 'DALI webdataset' 'dali-gpu, local' --exclude float16 uint8
fi
if [ "$train_s" -gt 0 ]; then  # no pipeline's name: the decode limit, then the training run
    gpu gpu-train "$train_s" --repeats 1 --only zzz
fi
if [ "$probe_s" -gt 0 ]; then
    timeout "$probe_s" "$py" benchmarks/gpu.py --n 8000 --epochs 3 --probe >"$out/probe.log" 2>&1
    step "benchmarks/gpu.py --probe" $?
fi
if [ "$all_s" -gt 0 ]; then
    gpu gpu-all "$all_s" --repeats 2
fi
