"""Turning raw datasets into shards: ``convert``, and ``index_tars`` to adopt existing tar shards."""

from .adopt import index_tars
from .converter import ConvertOptions, convert
from .layout import parse_size
from .writer import write_dataset

__all__ = ["ConvertOptions", "convert", "index_tars", "parse_size", "write_dataset"]
