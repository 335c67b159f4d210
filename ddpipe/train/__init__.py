"""Data-parallel training: the distributed part of a training script (``ddpipe.distributed``), the
models, one training step, ``ddpipe train``'s loop, and virtual ranks (:mod:`ddpipe.train.virtual`:
data-parallel SGD for thousands of ranks carried out in one process)."""

from .distributed import AVERAGING, DataParallel, Job, broadcast_parameters, init, shutdown, stop_on_signals, wrap
from .loop import Trainer, TrainOptions
from .models import build_model
from .step import train_step
from .virtual import PerRankBatchNorm, per_rank_batch_norm, virtual_batches, virtual_step

__all__ = ["AVERAGING", "DataParallel", "Job", "PerRankBatchNorm", "TrainOptions", "Trainer", "broadcast_parameters",
           "build_model", "init", "per_rank_batch_norm", "shutdown", "stop_on_signals", "train_step", "virtual_batches",
           "virtual_step", "wrap"]
