"""A tar's files read from its headers by ddpipe are what Python's tarfile lists, for tars written
by tarfile in each of its formats and by GNU tar in each of its, long names, directories and
damage included; and the common tars are read without tarfile."""

from __future__ import annotations

import io
import random
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddpipe.formats.tar_scan import list_plain_tar

FORMATS = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}


def tarfiles_listing(path: Path) -> list[tuple[str, int, int]] | None:
    """tarfile's regular files, or None where it refuses the tar."""
    try:
        with tarfile.open(path, mode="r:") as tf:
            return [(i.name, i.offset_data, i.size) for i in tf if i.isfile()]
    except (tarfile.TarError, EOFError):
        return None


_part = st.from_regex(r"[A-Za-z0-9_\-]{10,70}", fullmatch=True)
_entries = st.lists(st.tuples(st.lists(_part, min_size=1, max_size=4).map("/".join),
                              st.sampled_from(["file", "file", "file", "dir"]), st.integers(0, 3000)),
                    min_size=0, max_size=12)


def write_tar(path: Path, fmt: str, entries: list[tuple[str, str, int]]) -> None:
    with tarfile.open(path, mode="w", format=FORMATS[fmt]) as tf:
        for name, kind, size in entries:
            info = tarfile.TarInfo(name)
            if kind == "dir":
                info.type = tarfile.DIRTYPE
                tf.addfile(info)
            else:
                info.size = size
                tf.addfile(info, io.BytesIO(bytes([size % 251]) * size))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fmt=st.sampled_from(sorted(FORMATS)), entries=_entries, seed=st.integers(0, 2**16),
       damage=st.integers(0, 3), cut=st.none() | st.floats(0.0, 1.0))
def test_the_headers_read_are_tarfiles(tmp_path: Path, fmt: str, entries: list[tuple[str, str, int]], seed: int,
                                       damage: int, cut: float | None) -> None:
    """Names up to 280 bytes (ustar's prefix, GNU long names, PAX path records); where ustar cannot
    hold one, tarfile refuses to write it and there is nothing to compare. ``damage`` bytes are then
    overwritten at random, and the tar is ``cut`` short: ddpipe's reading either agrees with
    tarfile's (a refusal included) or leaves the tar to it."""
    path = tmp_path / f"t-{fmt}-{seed}-{len(entries)}.tar"
    try:
        write_tar(path, fmt, entries)
    except ValueError:  # a name ustar cannot hold
        return
    ours = list_plain_tar(path)
    whole = tarfiles_listing(path)
    assert ours == whole  # whole, every format's tar is read without tarfile
    members_end = max((offset + size for _, offset, size in whole or []), default=0)  # not in the padding
    data = bytearray(path.read_bytes())
    rng = random.Random(seed)
    for _ in range(damage):
        data[rng.randrange(len(data))] = rng.randrange(256)
    path.write_bytes(bytes(data if cut is None else data[: int(cut * members_end)]))
    ours = list_plain_tar(path)
    assert ours is None or ours == tarfiles_listing(path)


@pytest.mark.parametrize("fmt", ["gnu", "posix", "ustar", "v7"])
def test_gnu_tars_archives_are_read_as_tarfile_reads_them(tmp_path: Path, fmt: str) -> None:
    if shutil.which("tar") is None:
        pytest.fail("GNU tar is needed")
    tree = tmp_path / "tree"
    names = ["a/x.jpg", "a/x.cls", "b/" + "long" * 30 + ".jpg", "c/" + "dir" * 30 + "/e.png"]  # ustar: a prefix
    for i, name in enumerate(names):
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_bytes(bytes([i]) * (700 * i + 3))
    (tree / "link.jpg").symlink_to("a/x.jpg")
    path = tmp_path / f"{fmt}.tar"
    subprocess.run(["tar", f"--format={fmt}", "--sort=name", "-C", str(tree), "-cf", str(path), "a", "b", "c"],
                   check=fmt != "v7" and fmt != "ustar", capture_output=True)
    listing = tarfiles_listing(path)
    assert listing and list_plain_tar(path) == listing
    subprocess.run(["tar", f"--format={fmt}", "-C", str(tree), "-cf", str(path), "."], capture_output=True)
    ours = list_plain_tar(path)
    assert ours is None or ours == tarfiles_listing(path)  # a symbolic link: tarfile's to read


@pytest.mark.parametrize("fmt", ["gnu", "pax"])
def test_two_extended_headers_in_a_row_name_the_member_as_tarfile_does(tmp_path: Path, fmt: str) -> None:
    """A long name's extended header written twice before its member, with two names: ddpipe's index
    names the member as tarfile does (the outer one)."""
    from ddpipe.formats.tar_index import scan_tar_members

    one, two = tmp_path / "one.tar", tmp_path / "two.tar"
    write_tar(one, fmt, [("a" * 120 + "/x.jpg", "file", 10)])
    write_tar(two, fmt, [("b" * 120 + "/x.jpg", "file", 10)])
    first, second = one.read_bytes(), two.read_bytes()
    extended = 1024  # the extended header and its one block of data (the long name)
    path = tmp_path / "both.tar"
    path.write_bytes(second[:extended] + first)
    expected = tarfiles_listing(path)
    assert expected is not None
    assert [(m[3], m[1], m[2]) for g in scan_tar_members(path) for m in g] == expected
