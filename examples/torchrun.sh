#!/bin/bash
# The same training on one node of 8 GPUs, launched by torchrun instead of an MPI launcher.
# ddpipe's own collectives (the sample exchange) then go through a gloo group of its own, and
# gradients through DDP (NCCL); allreduce=mpi needs mpiexec or srun.
#
#   bash examples/torchrun.sh /data/imagenet-wds
#
# Every setting below is a variable with a GPU node's value as its default, so the same script runs
# elsewhere by overriding them (tests/examples runs it on 2 CPU processes):
#   NPROC=2 MODEL=smallcnn EPOCHS=1 BATCH=8 TRAIN_FLAGS= LOCAL=/tmp/ddpipe bash examples/torchrun.sh DATA
set -euo pipefail

DATA=${1:-/data/imagenet-wds}
LOCAL=${LOCAL:-/local/ssd/ddpipe}                # node-local storage
NPROC=${NPROC:-8}                                # one process per GPU
MODEL=${MODEL:-resnet50}
EPOCHS=${EPOCHS:-90}
BATCH=${BATCH:-256}                              # per GPU
TRAIN_FLAGS=${TRAIN_FLAGS---amp --channels-last} # GPU settings

ddpipe stage "$DATA" --local-dir "$LOCAL"    # one process: a node's single stager
# shellcheck disable=SC2086  # TRAIN_FLAGS is a list of flags
torchrun --standalone --nproc-per-node "$NPROC" -m ddpipe train "$DATA" --model "$MODEL" --epochs "$EPOCHS" \
    --batch-size "$BATCH" --allreduce ddp $TRAIN_FLAGS --stage-dir "$LOCAL"
