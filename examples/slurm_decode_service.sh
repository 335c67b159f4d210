#!/bin/bash
# A heterogeneous Slurm job: CPU nodes decode and augment, GPU nodes train (ddpipe serve).
#
#   sbatch examples/slurm_decode_service.sh
#
# Component 0: CPU-only nodes, one `ddpipe serve` each, listening on PORT. Component 1: GPU nodes,
# ddpipe train with --decode-service naming every server. A trainer decodes itself while no server
# answers, so the servers may start after it or fail mid-run: only speed changes, never the batches.
#SBATCH --job-name=ddpipe-served
#SBATCH --nodes=4 --ntasks-per-node=1 --cpus-per-task=64 --partition=cpu
#SBATCH hetjob
#SBATCH --nodes=8 --ntasks-per-node=4 --gpus-per-node=4 --cpus-per-task=8 --partition=gpu
#SBATCH --time=12:00:00
set -euo pipefail

DATA=${DATA:-/lustre/datasets/imagenet-wds}
MODEL=${MODEL:-resnet50}
EPOCHS=${EPOCHS:-90}
BATCH=${BATCH:-256}                              # per GPU
PORT=${PORT:-5555}
WORKERS=${WORKERS:-${SLURM_CPUS_PER_TASK_HET_GROUP_0:-64}}
TRAIN_FLAGS=${TRAIN_FLAGS---amp --channels-last}

# every server, as the trainers will address it
SERVICE=$(scontrol show hostnames "$SLURM_JOB_NODELIST_HET_GROUP_0" | sed "s|.*|tcp://&:$PORT|" | paste -sd,)

# 1. the servers, in the background for the whole job (stateless: nothing to stage or save)
srun --het-group=0 ddpipe serve --listen "0.0.0.0:$PORT" --workers "$WORKERS" &
SERVERS=$!
# ended with training (srun, given SIGTERM, ends its step) and waited for; each epoch's line says how
# many of its batches the servers decoded
trap 'kill "$SERVERS" 2>/dev/null || true; wait "$SERVERS" 2>/dev/null || true' EXIT

# 2. the trainers: read, exchange and order as always; decoding goes to the servers
# shellcheck disable=SC2086  # TRAIN_FLAGS is a list of flags
srun --het-group=1 --kill-on-bad-exit=1 ddpipe train "$DATA" --model "$MODEL" --epochs "$EPOCHS" --batch-size "$BATCH" \
    --lr 0.1 --warmup-epochs 5 $TRAIN_FLAGS --shuffle partial --exchange-fraction 0.3 \
    --decode-service "$SERVICE" --checkpoint "${SLURM_SUBMIT_DIR:-.}/$MODEL.ckpt" --checkpoint-every 1000
