"""Each stage has one options object; the flat keywords of EncodedStream and Loader are those objects'
fields, generated from them, with one precedence rule: a keyword wins over an object's field."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ddpipe
from ddpipe import ConvertOptions, DecodeOptions, OptionError, PlanOptions, ReadOptions, SourceLimits, StageOptions
from ddpipe.options import LOADER_STAGES, STREAM_STAGES, LoaderKeywords, StreamKeywords, apply_keywords, keyword_fields
from ddpipe.service.server import ServeOptions
from ddpipe.train.loop import TrainOptions

from .decode.images import labelled_samples


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("opts") / "wds"
    ddpipe.write_dataset(root, iter(labelled_samples(30, np.random.default_rng(2))), samples_per_shard=8)
    return root


# Values each field may take, by field: a field added to an options object without an entry here fails
# test_every_field_has_values, so the property test below covers every field there is.
VALUES: dict[tuple[type, str], st.SearchStrategy[Any]] = {
    (PlanOptions, "shuffle"): st.sampled_from(["none", "local", "partial", "global"]),
    (PlanOptions, "exchange_fraction"): st.floats(0.0, 1.0),
    (PlanOptions, "shard_assignment"): st.sampled_from(["sticky", "rotate"]),
    (PlanOptions, "drop_last"): st.booleans(),
    (PlanOptions, "pad"): st.booleans(),
    (PlanOptions, "batch_size"): st.integers(1, 4096),
    (PlanOptions, "buffer_size"): st.integers(0, 100_000),
    (PlanOptions, "round_size"): st.integers(1, 10_000),
    (ReadOptions, "prefetch"): st.integers(1, 10_000),
    (ReadOptions, "verify"): st.booleans(),
    (ReadOptions, "keep_mapped"): st.booleans(),
    (ReadOptions, "on_error"): st.sampled_from(["fail", "skip"]),
    (ReadOptions, "source_limits"): st.builds(SourceLimits, st.floats(1e3, 1e10), st.floats(0, 1)),
    (StageOptions, "stage_dir"): st.sampled_from([Path("/scratch/node{node}"), Path("$TMPDIR/x"), Path("auto")]),
    (StageOptions, "capacity"): st.one_of(st.none(), st.integers(1, 2**40)),
    (StageOptions, "limits"): st.builds(SourceLimits, st.floats(1e3, 1e10), st.floats(0, 1)),
    (StageOptions, "wait_timeout"): st.floats(0.1, 1e4),
    (StageOptions, "peers"): st.booleans(),
    (DecodeOptions, "decoder"): st.sampled_from(["auto", "dali-cpu", "pil"]),
    (DecodeOptions, "device"): st.sampled_from(["auto", "cpu"]),
    (DecodeOptions, "on_error"): st.sampled_from(["fail", "skip"]),
    (DecodeOptions, "train"): st.booleans(),
    (DecodeOptions, "size"): st.integers(1, 224),
    (DecodeOptions, "resize_shorter"): st.integers(224, 512),
    (DecodeOptions, "scale"): st.tuples(st.floats(0.01, 0.5), st.floats(0.5, 1.0)),
    (DecodeOptions, "ratio"): st.tuples(st.floats(0.5, 1.0), st.floats(1.0, 2.0)),
    (DecodeOptions, "flip"): st.floats(0.0, 1.0),
    (DecodeOptions, "mean"): st.tuples(*[st.floats(0, 1)] * 3),
    (DecodeOptions, "std"): st.tuples(*[st.floats(0.1, 1)] * 3),
    (DecodeOptions, "dtype"): st.sampled_from(["float32", "float16", "uint8"]),
    (DecodeOptions, "channels_last"): st.booleans(),
    (DecodeOptions, "antialias"): st.booleans(),
    # at least the largest image the drawn sizes make: no image made may be larger than any read
    (DecodeOptions, "max_pixels"): st.integers(512**2, 10**9),
    (DecodeOptions, "threads"): st.integers(0, 64),
    (DecodeOptions, "service"): st.sampled_from([(), ("tcp://a:1",), ("tcp://a:1", "tcp://b:2")]),
    (DecodeOptions, "service_timeout"): st.floats(0.1, 100),
    (DecodeOptions, "read_in"): st.sampled_from(["auto", "thread", "process"]),
    (DecodeOptions, "require_labels"): st.booleans(),
}
# objects given beside the keyword: each field at a value of its own (staging's directory included)
GIVEN = {PlanOptions: PlanOptions(shuffle="local", exchange_fraction=0.2, buffer_size=9, round_size=11),
         ReadOptions: ReadOptions(prefetch=2, verify=False),
         StageOptions: StageOptions(Path("/elsewhere"), capacity=10**9),
         DecodeOptions: DecodeOptions(decoder="pil", size=32, resize_shorter=40, dtype="uint8")}


def test_every_field_has_values() -> None:
    fields = {(cls, f.name) for cls in LOADER_STAGES for f in dataclasses.fields(cls)}
    assert fields == set(VALUES)


def test_the_typed_keywords_are_the_fields() -> None:
    """The TypedDicts that type the keywords for users' checkers name exactly the generated keywords
    (``batch_size`` is the positional parameter), and a shared name (``on_error``) is typed once."""
    assert set(StreamKeywords.__annotations__) | {"batch_size"} == set(keyword_fields(STREAM_STAGES))
    assert set(typing.get_type_hints(LoaderKeywords)) | {"batch_size"} == set(keyword_fields(LOADER_STAGES))
    assert {kw for kw, targets in keyword_fields(LOADER_STAGES).items() if len(targets) > 1} == {"on_error"}


@settings(max_examples=300, deadline=None)
@given(data=st.data(), with_objects=st.booleans())
def test_a_keyword_sets_its_field_and_wins_over_the_objects(data: st.DataObject, with_objects: bool) -> None:
    table = keyword_fields(LOADER_STAGES)
    chosen = data.draw(st.lists(st.sampled_from(sorted(table)), unique=True, max_size=6), label="keywords")
    keywords: dict[str, Any] = {}
    for kw in chosen:
        cls, field = table[kw][0]
        keywords[kw] = data.draw(VALUES[cls, field], label=kw)
    if "resize_shorter" in keywords or "size" in keywords:  # the one constraint between two fields
        keywords["resize_shorter"] = max(keywords.get("resize_shorter", 256), keywords.get("size", 224))
    if keywords.get("service") and keywords.get("decoder") == "dali-gpu":
        del keywords["service"]
    given = GIVEN if with_objects else {}
    if not with_objects and any(kw.startswith("stage_") for kw in keywords) and "stage_dir" not in keywords:
        keywords["stage_dir"] = Path("/x")
    out = apply_keywords(given, keywords, LOADER_STAGES, "Loader")
    for kw, value in keywords.items():
        for cls, field in table[kw]:
            assert getattr(out[cls], field) == value, (kw, cls.__name__)
    for cls in LOADER_STAGES:  # a field no keyword named keeps the object's value, or the default
        base = given.get(cls)
        named = {field for kw in keywords for c, field in table[kw] if c is cls}
        for f in dataclasses.fields(cls):
            if f.name in named or out[cls] is None:
                continue
            expected = getattr(base, f.name) if base is not None else f.default
            assert getattr(out[cls], f.name) == expected, (cls.__name__, f.name)


def test_objects_and_keywords_give_the_same_stream(data: Path) -> None:
    by_objects = ddpipe.EncodedStream(data, plan=PlanOptions(shuffle="partial", exchange_fraction=0.5, batch_size=4,
                                                             buffer_size=7, drop_last=True),
                                      read=ReadOptions(prefetch=3), seed=5)
    by_keywords = ddpipe.EncodedStream(data, 4, shuffle="partial", exchange_fraction=0.5, buffer_size=7,
                                       drop_last=True, prefetch=3, seed=5)
    assert by_objects.options == by_keywords.options and by_objects.read_options == by_keywords.read_options
    keys = [[s["__key__"] for s in b] for b in by_objects]
    assert keys == [[s["__key__"] for s in b] for b in by_keywords] and len(keys) == 7


def test_on_error_as_a_keyword_is_reading_and_decoding(data: Path) -> None:
    loader = ddpipe.Loader(data, 4, decoder="pil", on_error="skip", size=16, resize_shorter=20, threads=1)
    assert loader.stream.read_options.on_error == loader.decoding.options.on_error == "skip"
    apart = ddpipe.Loader(data, 4, read=ReadOptions(on_error="skip"), decode=DecodeOptions(decoder="pil"))
    assert (apart.stream.read_options.on_error, apart.decoding.options.on_error) == ("skip", "fail")


@pytest.mark.parametrize("bad", [{"shuffle": "random"}, {"exchange_fraction": 1.5}, {"on_error": "ignore"},
                                 {"shard_assignment": "spread"}, {"prefetch": 0}, {"source_limits": "fast"},
                                 {"stage_capacity": 5}, {"decoder": "opencv"}, {"decoder": "none"},
                                 {"scale": (0.5, 0.1)}, {"scale": (0.0, 1.0)}, {"ratio": (2.0, 1.0)}, {"flip": 1.5},
                                 {"threads": -1}, {"std": (0.0, 1.0, 1.0)}, {"mean": (0.5, 0.5)},
                                 {"mean": (float("nan"), 0.5, 0.5)}, {"std": (float("inf"), 0.2, 0.2)},
                                 {"service_timeout": float("nan")}, {"stage_wait_timeout": float("nan")},
                                 # a fraction or a string where a whole number goes: a float size reached
                                 # shared memory's, which left an empty segment in /dev/shm
                                 {"batch_size": 2.5}, {"batch_size": True}, {"size": 32.5}, {"resize_shorter": 40.5},
                                 {"threads": 1.5}, {"round_size": 3.5}, {"buffer_size": 0.5}, {"prefetch": 2.5},
                                 {"seed": 1.5}, {"seed": "1"}, {"exchange_fraction": "0.5"},
                                 # torch's RuntimeError, at the first batch, named twenty device types
                                 {"device": "tpu"}, {"device": "cuda:x"}, {"device": "cuda:-1"},
                                 # images larger than any input may be: a worker's allocation failed
                                 {"size": 10_000, "resize_shorter": 10_000},
                                 # a flag's string from a configuration file was taken as true (or None as
                                 # false); None or a number for the others was compared deep inside
                                 {"verify": "no"}, {"drop_last": "yes"}, {"pad": None}, {"channels_last": "false"},
                                 {"stage_peers": "no", "stage_dir": "unused"}, {"exchange_fraction": None},
                                 {"source_limits": 5}])
def test_a_value_an_option_cannot_take_is_one_clear_error(data: Path, bad: dict[str, object]) -> None:
    name = next(iter(bad))
    before = set(os.listdir("/dev/shm"))
    with pytest.raises(OptionError, match=name if name != "stage_capacity" else "needs stage_dir"):
        ddpipe.Loader(data, **{"batch_size": 4, "decoder": "pil", **bad})  # type: ignore[arg-type]
    assert set(os.listdir("/dev/shm")) <= before


@pytest.mark.parametrize("make, says", [
    (lambda: PlanOptions(batch_size=0), "batch_size must be a whole number of at least 1, not 0"),
    (lambda: PlanOptions(buffer_size=-1), "buffer_size must be a whole number of at least 0, not -1"),
    (lambda: DecodeOptions(size=0), "size must be a whole number of at least 1, not 0"),
    (lambda: DecodeOptions(size=64, resize_shorter=32),
     "resize_shorter must be a whole number of at least 64, not 32"),
    (lambda: TrainOptions(checkpoint_every=-1), "checkpoint_every must be a whole number of at least 0, not -1"),
    (lambda: TrainOptions(momentum=1.0), "momentum must be in [0, 1), not 1.0"),
    # a string or None where a number goes was compared with one deep inside: TypeError's traceback
    (lambda: TrainOptions(lr="0.1"), "lr must be a number, not '0.1'"),  # type: ignore[arg-type]
    (lambda: TrainOptions(momentum=None), "momentum must be a number, not None"),  # type: ignore[arg-type]
    (lambda: ServeOptions(log_every="60"), "log_every must be a number, not '60'"),  # type: ignore[arg-type]
    (lambda: DecodeOptions(service_timeout=None),  # type: ignore[arg-type]
     "service_timeout must be a number, not None"),
    (lambda: StageOptions(Path("x"), wait_timeout="1"),  # type: ignore[arg-type]
     "stage_wait_timeout must be a number, not '1'"),
    (lambda: DecodeOptions(max_pixels=1.5),  # type: ignore[arg-type]
     "max_pixels must be a whole number of at least 1, not 1.5"),
    # a URL taken for a local path: Path("s3://b/x") is "s3:/b/x", made in the working directory
    (lambda: StageOptions(""),  # type: ignore[arg-type]  # Path("") is ".": staged into the working directory
     "stage_dir is empty: name a node-local directory, or None for no staging"),
    (lambda: StageOptions("s3://b/x"), "stage_dir is a node-local directory, not an object store's URL: s3://b/x"),  # type: ignore[arg-type]
    (lambda: ddpipe.verify_dataset("d", stage_dir="s3://b/x"),  # its report said "nothing staged there"
     "stage_dir is a node-local directory, not an object store's URL: s3://b/x"),
    (lambda: ddpipe.verify_dataset("d", stage_dir=""),
     "stage_dir is empty: name a node-local directory, or None for no staging"),
    (lambda: TrainOptions(checkpoint="s3://b/c.pt"),  # type: ignore[arg-type]
     "checkpoint is a file on this machine, not an object store's URL: s3://b/c.pt"),
    # the library took them as a local "s3:/b/x" (no such file), "" as "." (is a directory), and
    # synsets without val_labels in silence, where the command line refuses all three
    (lambda: ConvertOptions(val_labels="s3://b/x"),
     "val_labels is a file on this machine, not an object store's URL: s3://b/x"),
    (lambda: ConvertOptions(val_labels=""), "val_labels is empty: name a file on this machine, or None"),
    (lambda: ConvertOptions(synsets="map_clsloc.txt"),
     "synsets takes effect only with val_labels (ImageNet's validation ground truth)"),
    # a flag's string was taken as true
    (lambda: TrainOptions(amp="no"), "amp must be True or False, not 'no'"),  # type: ignore[arg-type]
    (lambda: ConvertOptions(decode_check="false"),  # type: ignore[arg-type]
     "decode_check must be True or False, not 'false'"),
    (lambda: TrainOptions(weight_decay=float("nan")), "weight_decay must be a finite number, 0 or more, not nan"),
    (lambda: ServeOptions(queue=-1), "queue must be a whole number of at least 0, not -1"),
    # zmq's bind took it: AttributeError 'startswith'; a checkpoint of another kind failed at the first look
    (lambda: ServeOptions(listen=5555), "listen must be an address, HOST:PORT, tcp://... or ipc://..., not int 5555"),  # type: ignore[arg-type]
    (lambda: TrainOptions(checkpoint=3), "checkpoint must be a path, not int 3"),  # type: ignore[arg-type]
    # pathlib's TypeError; a number kept for val_labels until it was read; "" a checkpoint of "." (the
    # working directory), which train tried to resume from ("cannot be read: Is a directory")
    (lambda: StageOptions(3), "stage_dir must be a path, not int 3"),  # type: ignore[arg-type]
    (lambda: ConvertOptions(val_labels=3), "val_labels must be a path, not int 3"),  # type: ignore[arg-type]
    (lambda: TrainOptions(checkpoint=" "),  # type: ignore[arg-type]
     "checkpoint is empty: name a file on this machine, or None"),
    (lambda: ddpipe.Loader(3, 4), "a dataset is a path or a URL, not int 3"),  # type: ignore[arg-type]
    (lambda: ddpipe.open_dataset(None), "a dataset is a path or a URL, not NoneType None"),  # type: ignore[arg-type]
])
def test_an_option_out_of_bounds_is_named_alone_with_its_value(make: Callable[[], object], says: str) -> None:
    """Each refusal named every bound of its group and none of the values ("batch_size and round_size
    must be at least 1, buffer_size at least 0, not 0, 512 and 1024"; "size must be positive and
    resize_shorter at least size"): the caller had to find which of them was theirs."""
    with pytest.raises(OptionError) as refused:
        make()
    assert str(refused.value) == says


@pytest.mark.parametrize("make", [ddpipe.EncodedStream, ddpipe.Loader])
def test_an_epoch_with_no_batch_is_said_once(data: Path, make: type) -> None:
    """A batch larger than a rank's share, with drop_last: every epoch was empty, and a training loop
    over it did nothing, without a word (``ddpipe train`` refuses it; a script did not hear of it)."""
    import warnings

    from ddpipe.errors import NoBatchWarning

    loader = make(data, 64, drop_last=True, decoder="pil") if make is ddpipe.Loader else make(data, 64, drop_last=True)
    with pytest.warns(NoBatchWarning, match=r"/wds: batch_size 64 is more than a rank's share of the dataset "
                                            r"\(30 of 30 samples on 1 rank\(s\)\) and drop_last is set"):
        assert list(loader) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader.set_epoch(1)
        assert list(loader) == [] and len(loader) == 0
    loader.close()


def test_a_decoder_for_an_undecoded_stream_points_to_the_stream() -> None:
    with pytest.raises(OptionError, match="EncodedStream"):
        DecodeOptions(decoder="none")


def test_decode_takes_an_options_object_not_a_name(data: Path) -> None:
    with pytest.raises(OptionError, match="decoder='pil'"):
        ddpipe.Loader(data, 4, decode="pil")  # type: ignore[arg-type]


def test_comm_takes_ddpipes_communicator_not_mpi4pys(data: Path) -> None:
    """mpi4py's COMM_WORLD, a natural thing to pass under mpiexec, was AttributeError 'channel'. In a
    process of its own: importing mpi4py initialises MPI, which this one stays out of."""
    code = ("import ddpipe, sys\nfrom mpi4py import MPI\nfor caller in (ddpipe.EncodedStream, ddpipe.Loader):\n"
            "    try:\n        caller(sys.argv[1], 4, comm=MPI.COMM_WORLD)\n"
            "    except ddpipe.OptionError as e:\n        print(e)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(data)], capture_output=True, text=True, timeout=300)
    said = "comm must be a ddpipe Comm (ddpipe.init_comm(), which under MPI spans COMM_WORLD), not mpi4py.MPI.Intracomm"
    assert proc.stdout.splitlines() == [said, said], proc.stdout + proc.stderr


@pytest.mark.parametrize("caller", [ddpipe.EncodedStream, ddpipe.Loader])
def test_unknown_keywords_are_refused_naming_the_accepted_ones(data: Path, caller: type) -> None:
    with pytest.raises(TypeError, match=r"num_workers.*fields of its options objects: .*buffer_size"):
        caller(data, 4, num_workers=2)


def test_a_stream_takes_no_decoding_keyword(data: Path) -> None:
    with pytest.raises(TypeError, match="EncodedStream\\(\\) got unexpected keyword arguments: size"):
        ddpipe.EncodedStream(data, 4, size=32)  # type: ignore[call-arg]


def test_convert_and_stage_options_refuse_what_they_cannot_take() -> None:
    for bad in ({"format": "zip"}, {"on_error": "ignore"}, {"samples_per_shard": 0}, {"shard_bytes": -5},
                {"workers": 0}, {"shard_bytes": 100, "samples_per_shard": 10}):
        with pytest.raises(OptionError):
            ConvertOptions(**bad)
    with pytest.raises(OptionError, match="stage_capacity must be a whole number of bytes, at least 1, or a size"):
        StageOptions(Path("x"), capacity=-1)


@pytest.mark.parametrize(("given", "taken"), [("100GB", 10**11), ("1GiB", 2**30), (4096, 4096), (8e10, 8 * 10**10)])
def test_a_number_of_bytes_is_taken_as_the_command_line_takes_it(given: object, taken: int) -> None:
    """A size's text, as --stage-capacity and --shard-size take it, or a number of bytes (a float: a
    share of a disk). A string was compared with a number deep inside: TypeError's traceback."""
    assert StageOptions(Path("x"), capacity=given).capacity == taken  # type: ignore[arg-type]
    assert ConvertOptions(shard_bytes=given).shard_bytes == taken  # type: ignore[arg-type]


@pytest.mark.parametrize(("given", "says"), [
    ("abc", "cannot parse size 'abc'"), ("0MB", "size '0MB' is less than one byte"),
    ([100], "must be a whole number of bytes, at least 1, or a size such as '100GB', not [100]"),
    (True, "must be a whole number of bytes, at least 1, or a size such as '100GB', not True"),
    (float("nan"), "must be a whole number of bytes, at least 1, or a size such as '100GB', not nan"),
])
def test_what_is_no_number_of_bytes_is_refused_naming_the_option(given: object, says: str) -> None:
    with pytest.raises(OptionError) as stage:
        StageOptions(Path("x"), capacity=given)  # type: ignore[arg-type]
    with pytest.raises(OptionError) as convert:
        ConvertOptions(shard_bytes=given)  # type: ignore[arg-type]
    assert str(stage.value).startswith("stage_capacity") and says in str(stage.value)
    assert str(convert.value).startswith("shard_bytes") and says in str(convert.value)


def test_a_staging_capacity_below_the_largest_shard_is_refused(tmp_path: Path) -> None:
    from .helpers import make_dataset

    root = make_dataset(tmp_path / "wds", "wds", [10, 30], payload=1000)
    with pytest.raises(OptionError, match=r"less than the largest shard \(shard-000001\.tar"):
        ddpipe.EncodedStream(root, 4, stage_dir=tmp_path / "stage", stage_capacity=2000)


def test_staging_reads_from_the_slow_source_the_reading_models(tmp_path: Path) -> None:
    from .helpers import make_dataset

    root = make_dataset(tmp_path / "wds", "wds", [10])
    stream = ddpipe.EncodedStream(root, 4, stage_dir=tmp_path / "stage", source_limits="3MB/s")
    assert stream.stager is not None and stream.stager.options.limits is stream.read_options.source_limits
    assert stream.read_options.source_limits is not None and stream.read_options.source_limits.bandwidth == 3e6


def test_no_stage_dir_is_no_staging(data: Path) -> None:
    """A script's unset ``--stage-dir`` passed on as ``stage_dir=None``: nothing is staged."""
    assert ddpipe.EncodedStream(data, 4, stage_dir=None, stage_capacity=None).stager is None
    with pytest.raises(OptionError, match="stage_dir=None stages nothing"):
        ddpipe.EncodedStream(data, 4, stage_dir=None, stage_capacity=10**9)


@pytest.mark.parametrize("epoch", [-1, 2.5, "3", None])
def test_an_epoch_that_is_no_whole_number_is_refused_when_set(data: Path, epoch: Any) -> None:
    stream = ddpipe.EncodedStream(data, 4)
    with pytest.raises(OptionError, match="epoch must be a whole number"):
        stream.set_epoch(epoch)
    stream.set_epoch(np.int64(1))  # type: ignore[arg-type]  # a script's numpy integers are whole numbers too
    assert stream.epoch == 1 and sum(len(b.indices) for b in stream) == 30


@pytest.mark.parametrize("state", [None, [], {"version": 1}, {"version": 1, "epoch": 0, "seed": 0}])
def test_a_state_that_is_not_one_state_dict_gave_is_refused(data: Path, state: Any) -> None:
    with pytest.raises(ddpipe.DdpipeError, match="loader state"):
        ddpipe.EncodedStream(data, 4).load_state_dict(state)


@settings(max_examples=200, deadline=None)
@given(key=st.sampled_from(["epoch", "seed", "batches", "world_size", "options", "pending", "num_samples",
                            "dataset"]),
       value=st.one_of(st.none(), st.booleans(), st.integers(-5, 2**70), st.floats(), st.text(max_size=4),
                       st.binary(max_size=9), st.lists(st.integers(), max_size=2),
                       st.dictionaries(st.sampled_from(["shuffle", "batch_size", "nope"]), st.integers(-1, 9))))
def test_a_damaged_state_resumes_or_is_one_error(state_data: tuple[Path, dict[str, Any], int], key: str,
                                                   value: Any) -> None:
    """A checkpoint's loader state with any field replaced: it resumes, or is refused with a DdpipeError
    naming what is wrong, never another exception or an unbounded plan (a world of 2**70 ranks). One
    batch into an epoch of 30 samples, another seed, epoch or plan leaves samples to read (a byte
    of junk as 'pending' gave an empty rest); more batches, ranks or pending bits can leave none."""
    root, state, epoch_batches = state_data
    damaged = {**state, key: value}
    stream = ddpipe.EncodedStream(root, 4)
    try:
        stream.load_state_dict(damaged)
    except ddpipe.DdpipeError:
        return
    rest = sum(len(b.indices) for b in stream)
    assert rest <= 30 + 4 * 8 and (rest > 0 or key in ("batches", "world_size", "pending"))
    if key == "batches":
        assert (rest == 0) == (value == epoch_batches)


def test_a_state_resumes_only_over_the_dataset_it_was_saved_from(state_data: tuple[Path, dict[str, Any], int],
                                                                 tmp_path: Path) -> None:
    """The same samples in other shards: the state's count matched, and the epoch resumed with other
    samples than it had left. A copy elsewhere, the same shards, resumes; so does a state written
    before the dataset was recorded in it."""
    import shutil

    root, state, _ = state_data
    resharded = tmp_path / "resharded"
    ddpipe.convert(root, resharded, ddpipe.ConvertOptions(samples_per_shard=7, progress=False))
    assert len(ddpipe.open_dataset(resharded)) == len(ddpipe.open_dataset(root))
    with pytest.raises(ddpipe.DdpipeError, match=r"the state is of another dataset: as many samples \(30\), in "
                                                 r"other shards or other files"):
        ddpipe.EncodedStream(resharded, 4).load_state_dict(state)
    moved = tmp_path / "moved"
    shutil.copytree(root, moved)
    expected = sum(len(b.indices) for b in _resumed(root, state))
    assert sum(len(b.indices) for b in _resumed(moved, state)) == expected
    older = {k: v for k, v in state.items() if k != "dataset"}
    assert sum(len(b.indices) for b in _resumed(resharded, older)) == expected


def _resumed(root: Path, state: dict[str, Any]) -> ddpipe.EncodedStream:
    stream = ddpipe.EncodedStream(root, 4)
    stream.load_state_dict(state)
    return stream


@pytest.fixture(scope="module")
def state_data(data: Path) -> tuple[Path, dict[str, Any], int]:
    """A dataset, a state one batch into its first epoch, and that epoch's batches."""
    stream = ddpipe.EncodedStream(data, 4)
    batches = iter(stream)
    next(batches)
    state = stream.state_dict()
    batches.close()
    return data, state, stream.plan().num_batches


@pytest.mark.parametrize("limits", [(float("nan"), 0.0), (-5.0, 0.0), (1e9, -1.0), (1e9, float("inf"))])
def test_source_limits_no_link_has_are_refused(limits: tuple[float, float]) -> None:
    """A negative latency reached time.sleep (ValueError at the first open); NaN passed every check
    written as ``x <= 0``."""
    with pytest.raises(OptionError, match="source limits"):
        SourceLimits(*limits)
