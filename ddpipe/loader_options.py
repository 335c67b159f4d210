"""What a :class:`ddpipe.Loader` is built from: the option dataclasses of each stage, and the
keyword conveniences mapped onto them here, in one place.

- :class:`ddpipe.PlanOptions`: shuffle mode, exchange fraction, assignment, batch size, remainder.
- :class:`ReadOptions`: how far reading runs ahead, and a slow-source model.
- :class:`ddpipe.decode.DecodeOptions`: decoder, device, transform, output type, bad images.
- :class:`ddpipe.staging.StageOptions`: node-local staging (none by default).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from .decode.spec import DecodeOptions
from .errors import OptionError
from .plan import PlanOptions
from .staging import StageOptions
from .throttle import SourceLimits

if TYPE_CHECKING:
    from typing_extensions import Unpack


@dataclass(frozen=True)
class ReadOptions:
    prefetch: int = 256  # encoded samples read ahead of the consumer
    source_limits: SourceLimits | None = None  # a slow shared file system (tests, benchmarks)
    # each shard's bytes checked against the manifest's checksum before its samples are used (a
    # second pass over bytes the read leaves in the page cache: see benchmarks/loader.py for its cost)
    verify: bool = True

    def __post_init__(self) -> None:
        if self.prefetch < 1:
            raise OptionError(f"prefetch must be at least 1 sample, not {self.prefetch}")


class LoaderKeywords(TypedDict, total=False):
    """The keyword conveniences of ``Loader(...)``, each a field of one options object."""

    shuffle: str
    exchange_fraction: float
    shard_assignment: str
    drop_last: bool
    buffer_size: int
    round_size: int
    device: str
    on_error: str
    decode_options: DecodeOptions
    prefetch: int
    verify: bool
    source_limits: SourceLimits | str | None
    stage_dir: str | os.PathLike[str] | None
    stage_capacity: int | None


@dataclass(frozen=True)
class LoaderOptions:
    plan: PlanOptions
    read: ReadOptions
    decode: DecodeOptions
    stage: StageOptions | None


def loader_options(batch_size: int | None, plan: PlanOptions | None, decode: DecodeOptions | str | None,
                   stage: StageOptions | None, read: ReadOptions | None,
                   **keywords: Unpack[LoaderKeywords]) -> LoaderOptions:
    """The options objects, with the keywords (which win over the objects' fields) mapped onto them.
    A value an option cannot take raises :class:`ddpipe.errors.OptionError` (a ``ValueError``)."""
    try:
        return _map(batch_size, plan, decode, stage, read, keywords)
    except ValueError as e:
        raise OptionError(str(e)) from None


def _map(batch_size: int | None, plan: PlanOptions | None, decode: DecodeOptions | str | None,
         stage: StageOptions | None, read: ReadOptions | None, k: LoaderKeywords) -> LoaderOptions:
    unknown = sorted(set(k) - set(LoaderKeywords.__annotations__))
    if unknown:
        accepted = ", ".join(sorted(LoaderKeywords.__annotations__))
        raise TypeError(f"Loader() got unexpected keyword arguments: {', '.join(unknown)}; it takes batch_size, "
                        f"plan, decode, stage, read, seed, comm and {accepted}")
    plan = plan or PlanOptions()
    plan = PlanOptions(shuffle=k.get("shuffle", plan.shuffle),
                       exchange_fraction=k.get("exchange_fraction", plan.exchange_fraction),
                       assignment=k.get("shard_assignment", plan.assignment),
                       drop_last=k.get("drop_last", plan.drop_last),
                       batch_size=plan.batch_size if batch_size is None else batch_size,
                       buffer_size=k.get("buffer_size", plan.buffer_size),
                       round_size=k.get("round_size", plan.round_size))

    if isinstance(decode, DecodeOptions) and "decode_options" in k:  # two objects for one stage: which?
        raise ValueError("decode options given twice, as decode=DecodeOptions(...) and as decode_options=: give one")
    decoding = decode if isinstance(decode, DecodeOptions) else k.get("decode_options") or DecodeOptions()
    decoding = dataclasses.replace(decoding, decoder=decode if isinstance(decode, str) else decoding.decoder,
                                   device=k.get("device", decoding.device),
                                   on_error=k.get("on_error", decoding.on_error))

    read = read or ReadOptions()
    limits = k.get("source_limits", read.source_limits)
    read = ReadOptions(prefetch=k.get("prefetch", read.prefetch), verify=k.get("verify", read.verify),
                       source_limits=SourceLimits.parse(limits) if isinstance(limits, str) else limits)

    stage_dir, capacity = k.get("stage_dir"), k.get("stage_capacity")
    if stage is None and stage_dir is not None:
        stage = StageOptions(Path(stage_dir), capacity)  # "auto" and {node} are resolved on each node
    elif stage is not None:  # keywords win over the object's fields, as everywhere
        if stage_dir is not None:
            stage = dataclasses.replace(stage, stage_dir=Path(stage_dir))
        if capacity is not None:
            stage = dataclasses.replace(stage, capacity=capacity)
    if stage is not None and stage.limits is None:
        stage = dataclasses.replace(stage, limits=read.source_limits)
    return LoaderOptions(plan, read, decoding, stage)
