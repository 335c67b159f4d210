"""ddpipe: a high-throughput distributed data pipeline for deep-learning training.

The public API, in three groups (the README's "Public API" lists the same names):

- runtime: what a training job uses: the ``Loader``, which composes an ``EncodedStream`` (which
  samples, in which order, on this rank) with a ``DecodeStage`` (which tensors), the options each
  stage is built from and the figures each counts, the job's world, the dataset and its manifest,
  the pure epoch plan;
- tools: what makes and checks datasets: ``convert``, ``write_dataset``, ``index_tars``,
  ``verify_dataset``, and ``advise_exchange`` (``ddpipe plan``: which Q a dataset needs at a scale)
  (the test-data generator is ``ddpipe.synth``, outside the API);
- errors: what ddpipe raises on purpose, each a subclass of the built-in a caller would expect.
"""

from typing import Any

from .comm import Comm, World, init_comm
from .convert import ConvertOptions, convert, index_tars, write_dataset
from .dataset import Dataset, open_dataset
from .decode.spec import DecodeOptions
from .decoding import DecodeStage
from .errors import (
    ChecksumMismatchError,
    ConversionConflictError,
    CorruptShardError,
    DdpipeError,
    DigestMismatchError,
    DiskFullError,
    ManifestError,
    MissingShardError,
    OptionError,
    SampleError,
    ShardError,
    SourceError,
)
from .formats import FORMAT_NAMES, get_format
from .loader_stats import DecodeStats, ExchangeStats, LoaderStats, ReadStats, SkippedSample
from .manifest import Manifest, ShardInfo, load_manifest
from .options import ReadOptions
from .pipeline import Loader
from .plan import EpochPlan, PlanOptions, plan_epoch
from .quality import ExchangeAdvice, advise_exchange
from .sample import SampleBatch
from .staging import StageOptions
from .storage import StorageError, StorageOptions
from .stream import EncodedStream
from .throttle import SourceLimits
from .verify import verify_dataset
from .version import __version__ as __version__


def __getattr__(name: str) -> Any:
    if name == "normalize":  # torch loads only when something decodes
        from .decode.output import normalize

        return normalize
    raise AttributeError(f"module 'ddpipe' has no attribute {name!r}")


__all__ = [
    "FORMAT_NAMES",
    "ChecksumMismatchError",
    "Comm",
    "ConversionConflictError",
    "ConvertOptions",
    "CorruptShardError",
    "Dataset",
    "DdpipeError",
    "DecodeOptions",
    "DecodeStage",
    "DecodeStats",
    "DigestMismatchError",
    "DiskFullError",
    "EncodedStream",
    "EpochPlan",
    "ExchangeAdvice",
    "ExchangeStats",
    "Loader",
    "LoaderStats",
    "Manifest",
    "ManifestError",
    "MissingShardError",
    "OptionError",
    "PlanOptions",
    "ReadOptions",
    "ReadStats",
    "SampleBatch",
    "SampleError",
    "ShardError",
    "ShardInfo",
    "SkippedSample",
    "SourceError",
    "SourceLimits",
    "StageOptions",
    "StorageError",
    "StorageOptions",
    "World",
    "advise_exchange",
    "convert",
    "get_format",
    "index_tars",
    "init_comm",
    "load_manifest",
    "normalize",
    "open_dataset",
    "plan_epoch",
    "verify_dataset",
    "write_dataset",
]
