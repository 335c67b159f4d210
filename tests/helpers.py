"""Small datasets written straight through ddpipe.write_dataset (no images needed)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ddpipe.checksum import file_checksum
from ddpipe.convert import write_dataset
from ddpipe.dataset import open_dataset
from ddpipe.formats import get_format
from ddpipe.manifest import Manifest, ShardInfo, load_manifest, save_manifest
from ddpipe.sample import Sample


def tiny_samples(total: int, classes: int, payload: int) -> Iterator[Sample]:
    """Sample i: key ``s/<i>``, ``cls`` = class (class-sorted), ``bin`` = ``payload`` bytes derived from i."""
    per_class = -(-total // classes)
    for i in range(total):
        yield {"__key__": f"s/{i:06d}", "cls": str(i // per_class).encode(),
               "bin": (i.to_bytes(4, "little") * (payload // 4 + 1))[:payload]}


def make_dataset(root: Path, fmt: str, sizes: list[int], classes: int = 4, payload: int = 64) -> Path:
    """Shards of the given (possibly uneven) sample counts, of :func:`tiny_samples`."""
    if len(set(sizes)) == 1:
        write_dataset(root, tiny_samples(sum(sizes), classes, payload), format=fmt, samples_per_shard=sizes[0],
                      classes=[str(c) for c in range(classes)])
        return root
    f = get_format(fmt)
    root.mkdir(parents=True, exist_ok=True)
    samples = tiny_samples(sum(sizes), classes, payload)
    shards = []
    for k, n in enumerate(sizes):
        path = root / f"shard-{k:06d}{f.suffix}"
        with f.writer(path) as w:
            for _ in range(n):
                w.write(next(samples))
        shards.append(ShardInfo(path.name, n, path.stat().st_size, file_checksum(path)))
    save_manifest(root, Manifest(fmt, ("bin", "cls"), tuple(str(c) for c in range(classes)), tuple(shards)))
    return root


def tar_of(path: Path, names: list[str]) -> Path:
    """A tar of one-byte members of these names, in this order (as plain ``tar`` may store them)."""
    import io
    import tarfile

    with tarfile.open(path, "w") as tf:
        for name in names:
            info = tarfile.TarInfo(name)
            info.size = 1
            tf.addfile(info, io.BytesIO(b"1"))
    return path


def mapped_under(root: Path) -> set[str]:
    """The files under ``root`` this process maps (one deleted since ends in " (deleted)")."""
    with open("/proc/self/maps") as maps:
        names = (line.split(maxsplit=5)[5].strip() for line in maps if len(line.split(maxsplit=5)) == 6)
        return {name for name in names if name.startswith(str(root))}


def descendants(pid: int) -> list[int]:
    """Every process under ``pid`` (pool workers, the resource tracker), read from /proc."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        kids = [c for c, p in parents.items() if p in frontier]
        found += kids
        frontier = kids
    return found


def alive(pid: int) -> bool:
    """Running (a zombie awaiting its reaper counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


_READ_ALL = """import sys, ddpipe
try:
    stream = ddpipe.EncodedStream(sys.argv[1], 4, shuffle="none", verify=sys.argv[2] == "checked")
    print(sum(len(b.indices) for b in stream))
except ddpipe.CorruptShardError as e:
    print("refused:", e)
"""


def read_in_own_process(root: Path, verify: bool = True) -> subprocess.CompletedProcess[str]:
    """Every sample of the dataset at ``root`` read in a fresh Python process, which prints how many, or
    ``refused: <the CorruptShardError>``: a damaged file that crashes the reader (SIGBUS, SIGABRT)
    shows as its exit status instead of ending the test run."""
    return subprocess.run([sys.executable, "-c", _READ_ALL, str(root), "checked" if verify else "unchecked"],
                          capture_output=True, text=True, timeout=120)


def as_a_user_file_modes_refuse() -> list[str]:
    """The command prefix that runs a process as one whom a file's mode can refuse: none for a user;
    for root, setpriv without root's override of file modes. The test is skipped where that fails."""
    import pytest

    if os.geteuid() != 0:
        return []
    drop = ["-dac_override,-dac_read_search"]
    prefix = [shutil.which("setpriv") or "setpriv", "--bounding-set", *drop, "--inh-caps", *drop]
    try:
        works = subprocess.run([*prefix, "true"], capture_output=True).returncode == 0
    except OSError:
        works = False
    if not works:
        pytest.skip("setpriv cannot drop root's override of file modes here")
    return prefix


def started_threads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the threads started from now on, in order, as they start: a thread whose work is
    quickly done may have ended before a test looks for it among the living (``threading.enumerate``)."""
    import threading

    names: list[str] = []
    start = threading.Thread.start

    def recorded(thread: threading.Thread) -> None:
        names.append(thread.name)
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", recorded)
    return names


def shard_file(root: Path, k: int) -> Path:
    """The file of the ``k``-th shard of the dataset at ``root``."""
    return root / load_manifest(root).shards[k].file


def flip_middle_keeping_time(path: Path) -> None:
    """Flip a byte in the middle of the file, keeping its size and time."""
    before = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # the size and time a quick check trusts


def flip_inside_sample(path: Path, image: bytes) -> None:
    """Flip a byte in the middle of one sample's image where the file holds it, keeping the time."""
    before = path.stat()
    data = bytearray(path.read_bytes())
    at = data.find(image)
    assert at >= 0 and data.find(image, at + 1) < 0  # the sample's bytes, and only they
    data[at + len(image) // 2] ^= 0x40
    path.write_bytes(bytes(data))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def image_of(root: Path, position: int) -> tuple[str, bytes]:
    """The key and image of the sample at ``position`` of the dataset at ``root``."""
    sample = list(open_dataset(root))[position]
    return sample["__key__"], bytes(sample["jpg"])


def adopted(name: str, tmp_path: Path) -> Path:
    """Files of another tool (``name``: tests/convert/adopted.py), adopted in place."""
    from .convert.adopted import adopt

    return adopt(name, tmp_path)
