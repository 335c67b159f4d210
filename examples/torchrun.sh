#!/bin/bash
# The same training on one node of 8 GPUs, launched by torchrun instead of an MPI launcher.
# ddpipe's own collectives (the sample exchange) then go through a gloo group of its own, and
# gradients through DDP (NCCL); allreduce=mpi needs mpiexec or srun.
set -euo pipefail
DATA=${1:-/data/imagenet-wds}
ddpipe stage "$DATA" --local-dir /local/ssd/ddpipe    # one process: a node's single stager
torchrun --standalone --nproc-per-node 8 -m ddpipe train "$DATA" --model resnet50 --epochs 90 \
    --batch-size 256 --allreduce ddp --amp --channels-last --stage-dir /local/ssd/ddpipe
