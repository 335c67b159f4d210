"""ddpipe: a high-throughput distributed data pipeline for deep-learning training."""

from .convert import ConvertOptions, convert, index_tars, write_dataset
from .dataset import Dataset, open_dataset
from .errors import (
    ChecksumMismatchError,
    CorruptShardError,
    DdpipeError,
    DiskFullError,
    ManifestError,
    MissingShardError,
    SampleError,
    SourceError,
)
from .formats import FORMAT_NAMES, get_format
from .manifest import Manifest, ShardInfo, load_manifest
from .pipeline import Loader
from .plan import EpochPlan, PlanOptions, plan_epoch
from .synth import SynthOptions, synth
from .verify import verify_dataset

__version__ = "0.1.0"

__all__ = [
    "FORMAT_NAMES",
    "ChecksumMismatchError",
    "ConvertOptions",
    "CorruptShardError",
    "Dataset",
    "DdpipeError",
    "DiskFullError",
    "EpochPlan",
    "Loader",
    "Manifest",
    "ManifestError",
    "MissingShardError",
    "PlanOptions",
    "SampleError",
    "ShardInfo",
    "SourceError",
    "SynthOptions",
    "convert",
    "get_format",
    "index_tars",
    "load_manifest",
    "open_dataset",
    "plan_epoch",
    "synth",
    "verify_dataset",
    "write_dataset",
]
