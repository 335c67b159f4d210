"""The decode service: decoding and augmentation on other machines' CPUs, streamed to trainers.

- ``server``: ``ddpipe serve``, a stateless server decoding batches for any number of trainers;
- ``client``: the trainer's decoder, ``DecodeOptions(service=[...])``, spreading batches over the
  servers and decoding here when none answers;
- ``wire``: the messages; ``transport``: ZeroMQ, the one module that imports it.

A served batch is the batch local CPU decoding would give: every random choice of the transform is
a function of (seed, epoch, sample index), sent with the encoded bytes.
"""

from .server import DecodeServer, ServeOptions

__all__ = ["DecodeServer", "ServeOptions"]
