"""The loader: an encoded stream (which samples, in which order, on this rank) composed with a decode
stage (which tensors). Each stage has one options object; the loader only hands them on."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NoReturn, SupportsIndex

from .comm import Comm
from .dataset import Dataset
from .decode.spec import DecodeOptions
from .decoding import DecodeStage
from .errors import OptionError, bound_to_its_process
from .loader_stats import LoaderStats
from .options import LOADER_STAGES, ReadOptions, apply_keywords
from .plan import EpochPlan, PlanOptions
from .staging import StageOptions
from .stream import EncodedStream

if TYPE_CHECKING:
    import torch
    from typing_extensions import Unpack

    from .options import LoaderKeywords
    from .service.client import ServiceStats
    from .staging import NodeStager


class Loader:
    """Batches of ``(images, labels)`` of this rank's samples, the same number on every rank: an
    :class:`~ddpipe.EncodedStream` decoded by a :class:`~ddpipe.DecodeStage`.

    ``path``: a directory, ``s3://bucket/prefix``, ``http(s)://host/prefix``, or a :class:`Dataset`.
    Options, one object per stage: ``plan`` (:class:`ddpipe.PlanOptions`), ``read``
    (:class:`ddpipe.ReadOptions`), ``stage`` (:class:`ddpipe.StageOptions`), ``decode``
    (:class:`ddpipe.DecodeOptions`); or any of their fields as a keyword, which wins over the
    object's (``Loader(path, 256, shuffle="partial", decoder="dali-gpu", on_error="skip")``;
    :mod:`ddpipe.options`). ``on_error="skip"`` skips what cannot be read and what does not decode,
    counted in ``stats``; batches keep their sizes.

    Call :meth:`set_epoch` before each epoch (a shuffled epoch begun again without it is said, once:
    :class:`~ddpipe.errors.RepeatedEpochWarning`); :meth:`state_dict` mid-epoch and
    :meth:`load_state_dict` in a fresh loader (any world size) continue with exactly the samples not
    yet yielded. What constructing one asks of the other ranks: see :class:`~ddpipe.EncodedStream`.
    """

    def __init__(self, path: str | os.PathLike[str] | Dataset, batch_size: int | None = None, *,
                 plan: PlanOptions | None = None, read: ReadOptions | None = None, stage: StageOptions | None = None,
                 decode: DecodeOptions | None = None, seed: int = 0, comm: Comm | None = None,
                 **keywords: Unpack[LoaderKeywords]) -> None:
        if isinstance(decode, str):
            raise OptionError(f"decode= takes a DecodeOptions; to name a decoder give decoder={decode!r}")
        size: dict[str, Any] = {} if batch_size is None else {"batch_size": batch_size}
        o = apply_keywords({PlanOptions: plan, ReadOptions: read, StageOptions: stage, DecodeOptions: decode},
                           {**keywords, **size}, LOADER_STAGES, "Loader")
        self.stream = EncodedStream(path, plan=o[PlanOptions], read=o[ReadOptions], stage=o[StageOptions], seed=seed,
                                    comm=comm)
        self.decoding = DecodeStage(self.stream, o[DecodeOptions])

    @property
    def dataset(self) -> Dataset:
        return self.stream.dataset

    @property
    def comm(self) -> Comm:
        return self.stream.comm

    @property
    def stager(self) -> NodeStager | None:
        return self.stream.stager

    @property
    def device(self) -> torch.device:
        return self.decoding.device

    @property
    def stats(self) -> LoaderStats:
        """The epoch's figures: reading's (``stats.read``) and decoding's (``stats.decode``)."""
        return LoaderStats(self.stream.stats, self.decoding.stats)

    @property
    def service_stats(self) -> ServiceStats | None:
        return self.decoding.service_stats

    def close(self) -> None:
        """Release the decoder (its DALI pipeline, threads or processes) and stop staging; iterating again
        makes a new decoder and stages the epoch's shards afresh."""
        self.decoding.close()
        self.stream.close()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def epoch(self) -> int:
        return self.stream.epoch

    def set_epoch(self, epoch: int) -> None:
        self.decoding.set_epoch(epoch)

    def plan(self) -> EpochPlan:
        """This epoch's plan (the same on every rank)."""
        return self.stream.plan()

    def __reduce_ex__(self, protocol: SupportsIndex) -> NoReturn:
        bound_to_its_process(self)

    def __len__(self) -> int:
        """Batches this epoch yields (what is left of it, after :meth:`load_state_dict`)."""
        return len(self.stream)

    @property
    def batches_per_epoch(self) -> int:
        """Batches a whole epoch yields, resumed or not: what learning-rate schedules count in."""
        return self.stream.batches_per_epoch

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return iter(self.decoding)

    def state_dict(self) -> dict[str, Any]:
        """Where this epoch stands: enough to continue, on any number of ranks, with exactly the rest."""
        return self.decoding.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.decoding.load_state_dict(state)
