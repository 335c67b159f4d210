#!/bin/bash
# Stage, then train: ResNet-50 on ImageNet-sized shards, 64 nodes x 4 GPUs.
#
#   sbatch examples/slurm_train.sh
#
# Every setting below is a variable with the cluster's value as its default, so the same script runs
# elsewhere by overriding them (tests/slurm submits it on a one-node test cluster, CPUs only):
#   sbatch --nodes=2 --ntasks=4 --cpus-per-task=1 --gpus-per-node=0 \
#          --export=ALL,DATA=...,MODEL=smallcnn,EPOCHS=1,BATCH=8,TRAIN_FLAGS= examples/slurm_train.sh
#SBATCH --job-name=ddpipe-resnet50
#SBATCH --nodes=64
#SBATCH --ntasks-per-node=4
#SBATCH --gpus-per-node=4
#SBATCH --cpus-per-task=16
#SBATCH --time=12:00:00
#SBATCH --signal=USR1@120  # 2 minutes before the time limit: ddpipe train saves its step and stops
set -euo pipefail

DATA=${DATA:-/lustre/datasets/imagenet-wds}         # made once with: ddpipe convert ImageFolder DATA --format wds
EVAL=${EVAL-/lustre/datasets/imagenet-val-wds}       # empty: no evaluation
LOCAL=${LOCAL:-${DDPIPE_LOCAL_DIR:-/local/ssd/$USER}} # node-local NVMe; {node} gives each node its own
MODEL=${MODEL:-resnet50}
EPOCHS=${EPOCHS:-90}
BATCH=${BATCH:-256}                                  # per GPU
TRAIN_FLAGS=${TRAIN_FLAGS---amp --channels-last}     # GPU settings
CHECKPOINT=${CHECKPOINT:-${SLURM_SUBMIT_DIR:-.}/$MODEL.ckpt}
# srun starts the ranks with the cluster's MpiDefault (pmix for Open MPI, pmi2 for MPICH's wheel);
# ddpipe takes rank, size and node from MPI itself. --kill-on-bad-exit: a rank that fails before
# ddpipe is up (in MPI_Init) ends the step, rather than leaving the others waiting to the time limit
SRUN=${SRUN:-srun}

# 1. one stager per node copies the shards its 4 ranks will read (sticky assignment: the same shards
#    every epoch, so this is the only time the shared file system is read)
$SRUN --kill-on-bad-exit=1 ddpipe stage "$DATA" --local-dir "$LOCAL" --shuffle partial --seed 0

# 2. train: each rank reads its staged shards, exchanges 30% of its samples with other ranks every
#    epoch, decodes on its GPU with DALI and averages gradients with DDP (NCCL on GPUs)
# shellcheck disable=SC2086  # TRAIN_FLAGS is a list of flags
$SRUN --kill-on-bad-exit=1 ddpipe train "$DATA" --model "$MODEL" --epochs "$EPOCHS" --batch-size "$BATCH" \
    --allreduce ddp --lr 0.1 --warmup-epochs 5 $TRAIN_FLAGS \
    --shuffle partial --exchange-fraction 0.3 --stage-dir "$LOCAL" \
    ${EVAL:+--eval "$EVAL"} --checkpoint "$CHECKPOINT" --checkpoint-every 1000
