"""``ddpipe.distributed``: the distributed part of your own training script, under any launcher.

    job = ddpipe.distributed.init()                                 # who am I; torch.distributed set up
    model = ddpipe.distributed.wrap(model.to(job.device), job, "ddp")  # or "mpi"
    model.backward(loss)                                            # gradients averaged across ranks
    with ddpipe.distributed.stop_on_signals(job) as stop: ...       # a scheduler's SIGTERM: all stop at one step

See :mod:`ddpipe.train.distributed`."""

from .train.distributed import (
    AVERAGING,
    DataParallel,
    Job,
    broadcast_parameters,
    init,
    init_process_group,
    shutdown,
    stop_on_signals,
    wrap,
)

__all__ = ["AVERAGING", "DataParallel", "Job", "broadcast_parameters", "init", "init_process_group", "shutdown",
           "stop_on_signals", "wrap"]
