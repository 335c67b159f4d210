#!/bin/bash
# Stage, then train: ResNet-50 on ImageNet-sized shards, 64 nodes x 4 GPUs.
#SBATCH --job-name=ddpipe-resnet50
#SBATCH --nodes=64
#SBATCH --ntasks-per-node=4
#SBATCH --gpus-per-node=4
#SBATCH --cpus-per-task=16
#SBATCH --time=12:00:00
set -euo pipefail

DATA=/lustre/datasets/imagenet-wds          # made once with: ddpipe convert ImageFolder DATA --format wds
LOCAL=${DDPIPE_LOCAL_DIR:-/local/ssd/$USER}  # node-local NVMe
export DDPIPE_LOCAL_DIR=$LOCAL

# 1. one stager per node copies the shards its 4 ranks will read (sticky assignment: the same shards
#    every epoch, so this is the only time the shared file system is read)
srun --mpi=pmix ddpipe stage "$DATA" --local-dir "$LOCAL" --shuffle partial --seed 0

# 2. train: each rank reads its staged shards, exchanges 30% of its samples with other ranks every
#    epoch, decodes on its GPU with DALI and averages gradients with DDP (NCCL)
srun --mpi=pmix ddpipe train "$DATA" --model resnet50 --epochs 90 --batch-size 256 \
    --allreduce ddp --lr 0.1 --warmup-epochs 5 --amp --channels-last \
    --shuffle partial --exchange-fraction 0.3 --stage-dir "$LOCAL" \
    --eval /lustre/datasets/imagenet-val-wds --checkpoint "$SLURM_SUBMIT_DIR/resnet50.ckpt" --checkpoint-every 1000
