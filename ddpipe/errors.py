"""Exceptions ddpipe raises on purpose.

Each subclasses the built-in a caller would expect (``FileNotFoundError`` for a missing shard,
``ValueError`` for bad content) and carries the path it is about, so that the CLI can print one
line naming the file and programs can still catch by type.
"""

from __future__ import annotations

import os
from typing import Any, NoReturn


class DdpipeError(Exception):
    """Base of every expected error: the CLI prints it as one line and exits non-zero."""

    # raised on every rank of the job alike (the ranks agreed on it): the CLI need not end the job, and
    # rank 0 alone says it (a line from each of 64 ranks said the same thing 64 times)
    job_wide = False

    def __init__(self, message: str, *, path: str | os.PathLike[str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.path = os.fspath(path) if path is not None else None

    def everywhere(self) -> DdpipeError:
        """This error, marked :attr:`job_wide`: every rank raises it alike and leaves."""
        self.job_wide = True
        return self

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message

    def __reduce__(self) -> tuple[Any, ...]:
        # rebuilt without __init__, whose signature differs per subclass, so that errors raised in
        # worker processes reach the caller whole
        return (_rebuild, (type(self), self.args, self.__dict__))


class OptionError(DdpipeError, ValueError):
    """An option with a value it cannot take (a shuffle mode, a decoder, a fraction out of range)."""


def bound_to_its_process(thing: object) -> NoReturn:
    """Raised where a loader or stream is pickled (``torch.multiprocessing.spawn``'s arguments, a
    ``DataLoader``'s dataset under spawn): its threads, mappings and communicator are its process's,
    and pickle's own error named some attribute deep inside it ('cannot pickle mappingproxy')."""
    raise DdpipeError(f"a ddpipe.{type(thing).__name__} cannot be pickled or sent to another process (its threads, "
                      "mappings and communicator are this process's): make one in the process that iterates it")


def _rebuild(cls: type[DdpipeError], args: tuple[Any, ...], state: dict[str, Any]) -> DdpipeError:
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


class ManifestError(DdpipeError, ValueError):
    """``index.json`` is missing, unreadable or not a ddpipe manifest."""


class ShardError(DdpipeError, OSError):
    """A shard file cannot be used."""


class MissingShardError(ShardError, FileNotFoundError):
    """A shard named by the manifest does not exist."""


class CorruptShardError(ShardError, ValueError):
    """A shard is truncated, malformed or disagrees with its manifest entry."""


class ChecksumMismatchError(CorruptShardError):
    """A shard's content does not hash to the checksum its manifest records."""

    def __init__(self, path: str | os.PathLike[str], *, expected: str, actual: str) -> None:
        super().__init__(f"checksum mismatch: manifest says {expected}, file hashes to {actual}", path=path)
        self.expected = expected
        self.actual = actual


class DigestMismatchError(CorruptShardError):
    """A sample of an adopted file is not the one its manifest records (its digest differs)."""

    def __init__(self, path: str | os.PathLike[str], *, position: int, key: str) -> None:
        super().__init__(f"sample {position} ({key!r}) is not the one index.json records (its digest differs)",
                         path=path)
        self.position = position
        self.key = key


class SampleError(DdpipeError, ValueError):
    """A sample is malformed (bad key or field name) or cannot be decoded."""

    def __init__(self, message: str, *, key: str | None = None, path: str | os.PathLike[str] | None = None):
        super().__init__(f"sample {key!r}: {message}" if key is not None else message, path=path)
        self.key = key


class SourceError(DdpipeError, ValueError):
    """An input of a conversion (an image file, a list file, a source tree) cannot be used."""


class DiskFullError(DdpipeError, OSError):
    """The output device ran out of space; what was finished before stays valid."""


class ConversionConflictError(DdpipeError, FileExistsError):
    """The output directory holds a different dataset or a conversion with other arguments."""


class NoBatchWarning(UserWarning):
    """An epoch yields no batch on this rank (a batch larger than its share, with ``drop_last``; an
    empty dataset): a training loop over it would do nothing, silently."""


class RepeatedEpochWarning(UserWarning):
    """A shuffled epoch read whole and begun again with no ``set_epoch`` between: the same order
    again (:mod:`ddpipe.epoch_repeats`)."""


class UnlabelledSamplesWarning(UserWarning):
    """Adopted samples without a class number: training skips or refuses each (``--on-error``)."""


class ChangedShardsWarning(UserWarning):
    """Files indexed again differ from the checksums the manifest they replace recorded: taken as
    they are now (``ddpipe verify`` before indexing says whether that is damage)."""
