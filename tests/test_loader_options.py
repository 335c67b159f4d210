"""The Loader is built from the option dataclasses; its keyword conveniences map onto them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ddpipe
from ddpipe.decode import DecodeOptions
from ddpipe.errors import DdpipeError
from ddpipe.loader_options import ReadOptions, loader_options
from ddpipe.staging import StageOptions

from .decode.test_decode import labelled_samples


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("opts") / "wds"
    ddpipe.write_dataset(root, iter(labelled_samples(30, np.random.default_rng(2))), samples_per_shard=8)
    return root


def test_options_objects_and_keywords_give_the_same_loader(data: Path) -> None:
    by_objects = ddpipe.Loader(data, plan=ddpipe.PlanOptions(shuffle="partial", exchange_fraction=0.5, batch_size=4,
                                                             buffer_size=7, drop_last=True),
                               decode=DecodeOptions(decoder="none"), read=ReadOptions(prefetch=3), seed=5)
    by_keywords = ddpipe.Loader(data, 4, shuffle="partial", exchange_fraction=0.5, buffer_size=7, drop_last=True,
                                decode="none", prefetch=3, seed=5)
    assert by_objects.options == by_keywords.options and by_objects.read_options == by_keywords.read_options
    keys = [[s["__key__"] for s in b] for b in by_objects]
    assert keys == [[s["__key__"] for s in b] for b in by_keywords] and len(keys) == 7


def test_keywords_win_over_the_objects_fields(tmp_path: Path) -> None:
    o = loader_options(8, ddpipe.PlanOptions(shuffle="none", batch_size=2), DecodeOptions(dtype="uint8"),
                       StageOptions(tmp_path, capacity=10), None, shuffle="local", on_error="skip",
                       stage_capacity=20, source_limits="1MB/s")
    assert (o.plan.shuffle, o.plan.batch_size) == ("local", 8)
    assert (o.decode.dtype, o.decode.on_error, o.decode.decoder) == ("uint8", "skip", "auto")
    assert o.stage is not None and o.stage.capacity == 20 and o.stage.stage_dir == tmp_path
    assert o.read.source_limits is not None and o.read.source_limits.bandwidth == 1e6
    assert o.stage.limits is o.read.source_limits  # staging copies from the same slow source


def test_decoder_named_by_string_keeps_the_transform() -> None:
    o = loader_options(4, None, "pil", None, None, decode_options=DecodeOptions(size=32, resize_shorter=40))
    assert (o.decode.decoder, o.decode.size) == ("pil", 32)


@pytest.mark.parametrize("bad", [{"shuffle": "random"}, {"exchange_fraction": 1.5}, {"on_error": "ignore"},
                                 {"shard_assignment": "spread"}])
def test_values_an_option_cannot_take_are_one_clear_error(data: Path, bad: dict[str, object]) -> None:
    with pytest.raises(DdpipeError, match=next(iter(bad)).split("_")[-1]):
        ddpipe.Loader(data, 4, decode="none", **bad)  # type: ignore[arg-type]


def test_unknown_keywords_are_refused(data: Path) -> None:
    with pytest.raises(TypeError, match="num_workers"):
        ddpipe.Loader(data, 4, num_workers=2)  # type: ignore[call-arg]


def test_convert_and_stage_options_refuse_what_they_cannot_take() -> None:
    from ddpipe import ConvertOptions, OptionError

    for bad in ({"format": "zip"}, {"on_error": "ignore"}, {"samples_per_shard": 0}, {"shard_bytes": -5},
                {"workers": 0}, {"shard_bytes": 100, "samples_per_shard": 10}):
        with pytest.raises(OptionError):
            ConvertOptions(**bad)
    with pytest.raises(OptionError, match="capacity must be a positive number of bytes, not -1"):
        StageOptions(Path("x"), capacity=-1)


def test_a_staging_capacity_below_the_largest_shard_is_refused(tmp_path: Path) -> None:
    from ddpipe import OptionError

    from .helpers import make_dataset

    root = make_dataset(tmp_path / "wds", "wds", [10, 30], payload=1000)
    with pytest.raises(OptionError, match=r"less than the largest shard \(shard-000001\.tar"):
        ddpipe.Loader(root, 4, decode="none", stage_dir=tmp_path / "stage", stage_capacity=2000)


# every keyword of Loader(...): a value unlike the options object's, and where the mapped value lands.
# A keyword added without an entry here fails the completeness check below.
KEYWORD_CASES: dict[str, tuple[object, Callable[[Any], object]]] = {
    "shuffle": ("local", lambda o: o.plan.shuffle),
    "exchange_fraction": (0.7, lambda o: o.plan.exchange_fraction),
    "shard_assignment": ("rotate", lambda o: o.plan.assignment),
    "drop_last": (True, lambda o: o.plan.drop_last),
    "buffer_size": (33, lambda o: o.plan.buffer_size),
    "round_size": (17, lambda o: o.plan.round_size),
    "device": ("cpu", lambda o: o.decode.device),
    "on_error": ("skip", lambda o: o.decode.on_error),
    "decode_options": (DecodeOptions(size=48, resize_shorter=56), lambda o: (o.decode.size, o.decode.resize_shorter)),
    "prefetch": (5, lambda o: o.read.prefetch),
    "verify": (False, lambda o: o.read.verify),
    "source_limits": ("3MB/s", lambda o: o.read.source_limits.bandwidth),
    "stage_dir": ("/scratch/node{node}", lambda o: o.stage.stage_dir),
    "stage_capacity": (4096, lambda o: o.stage.capacity),
}
EXPECTED: dict[str, object] = {"decode_options": (48, 56), "source_limits": 3e6,
                               "stage_dir": Path("/scratch/node{node}")}


def test_every_keyword_is_covered() -> None:
    from ddpipe.loader_options import LoaderKeywords

    assert set(KEYWORD_CASES) == set(LoaderKeywords.__annotations__)


@pytest.mark.parametrize("keyword", sorted(KEYWORD_CASES))
def test_each_keyword_wins_over_its_options_objects_field(keyword: str, tmp_path: Path) -> None:
    """Objects with every field at another value (or the defaults), the keyword given: the keyword's
    value is the one the loader gets, whatever else is given with it."""
    value, where = KEYWORD_CASES[keyword]
    plan = ddpipe.PlanOptions(shuffle="partial", exchange_fraction=0.2, assignment="sticky", drop_last=False,
                              buffer_size=9, round_size=11)
    stage = StageOptions(tmp_path / "elsewhere", capacity=10)
    read = ReadOptions(prefetch=2, verify=True, source_limits=None)
    # a decoder by name: decode_options then carries the transform
    keywords: dict[str, Any] = {keyword: value}
    o = loader_options(4, plan, "dali-cpu", stage, read, **keywords)
    assert where(o) == EXPECTED.get(keyword, value)


def test_decode_options_given_twice_is_refused_not_dropped() -> None:
    from ddpipe.errors import OptionError

    with pytest.raises(OptionError, match="decode options given twice"):
        loader_options(4, None, DecodeOptions(dtype="uint8"), None, None, decode_options=DecodeOptions(size=32,
                                                                                                    resize_shorter=40))
