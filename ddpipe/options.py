"""What a loader's stages are configured with, and the keyword conveniences generated from them.

Each stage has one options object, and each object validates itself on construction
(:class:`ddpipe.errors.OptionError`, a ``ValueError``, naming the field and what it accepts):

- :class:`ddpipe.PlanOptions`: shuffle mode, exchange fraction, shard assignment, batch size, remainder;
- :class:`ReadOptions`: how far reading runs ahead, checksums, unreadable samples, a slow-source model;
- :class:`ddpipe.StageOptions`: node-local staging (none by default);
- :class:`ddpipe.DecodeOptions`: decoder, device, transform, output type, bad images.

The flat keywords of :class:`ddpipe.EncodedStream` and :class:`ddpipe.Loader` are not a second set of
settings: they are the options' own fields, by name (a staging field prefixed ``stage_``). One rule:
a keyword sets the field it names in every options object of the call that has one (``on_error``
is reading's and decoding's), and wins over the same field of an object given. ``stage_dir=None``
is no staging.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict, cast

from .decode.spec import ON_ERROR, DecodeOptions
from .errors import OptionError
from .fields import refuse_non_boolean_flags, whole_option
from .plan import PlanOptions
from .staging import StageOptions
from .throttle import SourceLimits


@dataclass(frozen=True)
class ReadOptions:
    """How a rank reads its share. ``on_error``: a sample that cannot be read as ``index.json``
    records it (its shard fails its checksum or has another size, an adopted sample its digest) stops
    the epoch with an error naming it (``"fail"``; a shard of another size is refused as the stream
    is made), or is dropped and counted (``"skip"``)."""

    # encoded samples read ahead of the consumer; more where an exchange may have to run further
    # ahead for every rank to finish its batch (the plan's lead, ddpipe.plan.RankPlan.lead)
    prefetch: int = 256
    # each shard's bytes checked against the manifest's checksum before its samples are used (a
    # second pass over bytes the read leaves in the page cache: see benchmarks/loader.py for its cost)
    verify: bool = True
    on_error: str = "fail"
    # the mappings of a rank's shard files kept from one epoch to the next (checked reads of the
    # dataset's own files, or of staged copies no capacity evicts), so that its next epoch's check
    # does not map them again (up to 4 GiB a process: formats/mapped.py, KeptMappings); off, each
    # epoch maps its shards afresh, and pages dropped from the page cache between epochs are read
    # again from the device (a cold epoch: ``ddpipe bench --cold`` turns it off)
    keep_mapped: bool = True
    # a slow shared file system (tests, benchmarks): a SourceLimits, or its text, e.g. "100MB/s,5ms"
    source_limits: SourceLimits | None = None

    def __post_init__(self) -> None:
        refuse_non_boolean_flags(self)
        whole_option(self.prefetch, "prefetch (samples)", least=1)
        if self.on_error not in ON_ERROR:
            raise OptionError(f"on_error must be one of {', '.join(ON_ERROR)}, not {self.on_error!r}")
        if isinstance(self.source_limits, str):
            try:
                object.__setattr__(self, "source_limits", SourceLimits.parse(self.source_limits))
            except ValueError as e:
                raise OptionError(f"source_limits: {e}") from None
        elif not isinstance(self.source_limits, (SourceLimits, type(None))):
            raise OptionError(f"source_limits must be a SourceLimits or its text, e.g. '100MB/s,5ms', "
                              f"not {self.source_limits!r}")


#: The options objects whose fields are keywords, each with the prefix its keywords take.
PREFIXES: dict[type, str] = {PlanOptions: "", ReadOptions: "", StageOptions: "stage_", DecodeOptions: ""}
STREAM_STAGES: tuple[type, ...] = (PlanOptions, ReadOptions, StageOptions)
LOADER_STAGES: tuple[type, ...] = (*STREAM_STAGES, DecodeOptions)


class StreamKeywords(TypedDict, total=False):
    """The keywords of ``EncodedStream(...)``: the fields of PlanOptions, ReadOptions and StageOptions
    (tests/test_options.py holds this list to the fields), bar ``batch_size``, the positional parameter."""

    shuffle: str
    exchange_fraction: float
    shard_assignment: str
    drop_last: bool
    pad: bool
    buffer_size: int
    round_size: int
    prefetch: int
    verify: bool
    on_error: str
    keep_mapped: bool
    source_limits: SourceLimits | str | None
    stage_dir: str | os.PathLike[str] | None  # None: no staging
    stage_capacity: int | str | None  # bytes, or their text: "100GB"
    stage_limits: SourceLimits | None
    stage_wait_timeout: float
    stage_peers: bool


class LoaderKeywords(StreamKeywords, total=False):
    """The keywords of ``Loader(...)``: the stream's, and the fields of DecodeOptions."""

    decoder: str
    device: str
    train: bool
    size: int
    resize_shorter: int
    scale: tuple[float, float]
    ratio: tuple[float, float]
    flip: float
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    dtype: str
    channels_last: bool
    antialias: bool
    max_pixels: int
    threads: int
    service: Sequence[str]
    service_timeout: float
    read_in: str
    require_labels: bool


def keyword_fields(stages: Sequence[type]) -> dict[str, list[tuple[type, str]]]:
    """Each keyword of ``stages``' options, with the (options class, field) pairs it sets."""
    table: dict[str, list[tuple[type, str]]] = {}
    for cls in stages:
        prefix = PREFIXES[cls]
        for f in dataclasses.fields(cls):
            name = f.name if f.name.startswith(prefix) else prefix + f.name
            table.setdefault(name, []).append((cls, f.name))
    return table


def apply_keywords(given: Mapping[type, Any], keywords: Mapping[str, Any], stages: Sequence[type],
                   caller: str) -> dict[type, Any]:
    """The options objects of ``stages`` (those ``given``, else the defaults; staging's stays None
    unless given or a staging keyword names its directory), with ``keywords`` set on them."""
    table = keyword_fields(stages)
    unknown = sorted(set(keywords) - set(table))
    if unknown:
        raise TypeError(f"{caller}() got unexpected keyword arguments: {', '.join(unknown)}; its keywords are the "
                        f"fields of its options objects: {', '.join(sorted(table))}")
    out: dict[type, Any] = {}
    for cls in stages:
        fields = {field: keywords[kw] for kw, targets in table.items() if kw in keywords
                  for c, field in targets if c is cls}
        base = given.get(cls)
        if base is not None and not isinstance(base, cls):
            raise OptionError(f"{caller}() takes a {cls.__name__} where it was given {type(base).__name__} {base!r}")
        if cls is StageOptions and "stage_dir" in fields and fields["stage_dir"] is None:
            # stage_dir=None: no staging (a script's unset --stage-dir), and nothing else of it
            if base is not None or any(v is not None for v in fields.values()):
                raise OptionError("stage_dir=None stages nothing: give no other staging option with it")
            out[cls] = None
        elif not fields:
            out[cls] = base
        elif base is None and cls is StageOptions and "stage_dir" not in fields:
            raise OptionError(f"{', '.join('stage_' + f for f in sorted(fields))} needs stage_dir: the node-local "
                              "directory to stage into")
        else:
            out[cls] = cls(**fields) if base is None else dataclasses.replace(cast(Any, base), **fields)
    return out

