"""Data-parallel training: the distributed part of a training script (``ddpipe.distributed``), the
models, one training step, and ``ddpipe train``'s loop."""

from .distributed import AVERAGING, DataParallel, Job, broadcast_parameters, init, shutdown, wrap
from .loop import Trainer, TrainOptions
from .models import build_model
from .step import train_step

__all__ = ["AVERAGING", "DataParallel", "Job", "TrainOptions", "Trainer", "broadcast_parameters", "build_model",
           "init", "shutdown", "train_step", "wrap"]
