"""Samples handed from a reading process to its parent as places in their shard files
(:mod:`ddpipe.shard_places`), over a real socket pair with the files' descriptors passed across:
the parent's views hold the samples' bytes, whatever becomes of the path since; a file the path no
longer names, and samples that are no view of a mapped file, travel in the buffer; files are
forgotten once no sample of them is left."""

from __future__ import annotations

import gc
import os
import socket
from collections.abc import Generator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest

import ddpipe
from ddpipe.formats import get_format
from ddpipe.shard_places import IN_BUFFER, PlaceFinder, PlaceViews
from ddpipe.synth import encode_jpeg, render_image


def samples(n: int) -> Generator[dict[str, object], None, None]:
    for i in range(n):
        yield {"__key__": f"s/{i:03d}", "jpg": encode_jpeg(render_image(i, seed=3, long_side=48)),
               "cls": b"%d" % (i % 2)}


@pytest.fixture
def pair() -> Generator[tuple[PlaceFinder, PlaceViews, Connection], None, None]:
    child, parent = socket.socketpair()
    with Connection(child.detach()) as c, Connection(parent.detach()) as p:
        yield PlaceFinder(c, os.getpid()), PlaceViews(), p


def take_news(files: PlaceViews, conn: Connection) -> list[Any]:
    """What the parent's receive loop does: messages about files taken in; the others returned."""
    others = []
    while conn.poll():
        message = conn.recv()
        if not files.receive(message, conn):
            others.append(message)
    return others


def shard(tmp_path: Path, fmt: str, n: int = 12) -> Path:
    ddpipe.write_dataset(tmp_path / fmt, samples(n), format=fmt, samples_per_shard=n, classes=["a", "b"])
    return ddpipe.open_dataset(tmp_path / fmt).shard_path(0)


@pytest.mark.parametrize("fmt", ["wds", "hdf5", "lmdb"])
def test_every_image_is_found_in_the_parents_mapping_even_once_the_path_is_gone(
        tmp_path: Path, fmt: str, pair: tuple[PlaceFinder, PlaceViews, Connection]) -> None:
    finder, files, conn = pair
    path = shard(tmp_path, fmt)
    reader = get_format(fmt).reader(path)
    read = list(reader.scan_views())
    places = [finder.place(s["jpg"]) for s in read]
    assert take_news(files, conn) == []
    assert len(files) == 1 and {n for n, _ in places} == {places[0][0]} != {IN_BUFFER}
    path.unlink()  # the parent's mapping holds the file, as a staged copy evicted meanwhile would be
    for s, (number, offset) in zip(read, places, strict=True):
        assert bytes(files.view(number, offset, len(s["jpg"]))) == bytes(s["jpg"])
    reader.close()


@pytest.mark.parametrize("gone", ["replaced", "removed"])
def test_a_file_its_path_no_longer_names_travels_in_the_buffer(
        tmp_path: Path, gone: str, pair: tuple[PlaceFinder, PlaceViews, Connection]) -> None:
    finder, files, conn = pair
    path = shard(tmp_path, "wds")
    reader = get_format("wds").reader(path)
    first = next(iter(reader.scan_views()))  # mapped now
    if gone == "replaced":  # renamed over, as ddpipe replaces files: another file at the same path
        other = tmp_path / "other.tar"
        other.write_bytes(path.read_bytes())
        os.replace(other, path)
    else:
        path.unlink()
    assert finder.place(first["jpg"]) == (IN_BUFFER, 0)
    assert take_news(files, conn) == [] and len(files) == 0
    reader.close()


def test_samples_that_are_no_view_of_a_mapped_file_travel_in_the_buffer(
        tmp_path: Path, pair: tuple[PlaceFinder, PlaceViews, Connection]) -> None:
    import numpy as np

    finder, files, conn = pair
    path = shard(tmp_path, "wds")
    with get_format("wds").reader(path) as reader:
        copies = [bytes(s["jpg"]) for s in reader.scan_views()]  # as formats adopted in place give them
    assert {finder.place(c) for c in copies} == {(IN_BUFFER, 0)}
    assert finder.place(b"received from another rank") == (IN_BUFFER, 0)
    assert finder.place(memoryview(bytearray(b"an exchange's slot"))) == (IN_BUFFER, 0)
    assert finder.place(np.zeros(64, dtype=np.uint8)[8:40].data) == (IN_BUFFER, 0)
    assert take_news(files, conn) == [] and len(files) == 0


def test_a_file_is_forgotten_once_no_sample_of_it_is_left_and_views_outlive_that(
        tmp_path: Path, pair: tuple[PlaceFinder, PlaceViews, Connection]) -> None:
    finder, files, conn = pair
    first, second = (get_format("wds").reader(shard(tmp_path / d, "wds")) for d in ("a", "b"))
    a, b = next(iter(first.scan_views()))["jpg"], next(iter(second.scan_views()))["jpg"]
    (na, oa), (nb, ob) = finder.place(a), finder.place(b)
    assert na != nb
    take_news(files, conn)
    held = files.view(na, oa, len(a))  # a batch DALI still holds
    want = bytes(a)
    first.close()
    del a
    gc.collect()
    finder.send_news()
    assert take_news(files, conn) == [] and len(files) == 1
    assert bytes(held) == want
    assert bytes(files.view(nb, ob, len(b))) == bytes(b)  # the other file's number still stands
    second.close()
