"""convert decodes what it converts: a JPEG cut short is caught at conversion, not hours into training;
a dataset converted again is checked against its manifest as it is read; and what a conversion
records is the same from run to run."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ddpipe
from ddpipe.manifest import save_manifest

from ..conftest import run_cli
from ..helpers import flip_inside_sample, make_dataset, shard_file


def cut_short(images: Path, which: int = 9) -> Path:
    victim = sorted(images.rglob("*.jpg"))[which]
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])  # its header still reads: only decoding it whole tells
    return victim


def test_a_truncated_jpeg_stops_the_conversion_naming_it(raw_copy: Path, tmp_path: Path) -> None:
    victim = cut_short(raw_copy)
    proc = run_cli("convert", raw_copy, tmp_path / "out", "--samples-per-shard", "6", "--quiet")
    assert proc.returncode == 1 and str(victim) in proc.stderr and "does not decode" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "out" / "index.json").exists()


def test_a_truncated_jpeg_is_skipped_and_recorded_the_same_way_every_run(raw_copy: Path, tmp_path: Path) -> None:
    victim = cut_short(raw_copy)
    for out in ("a", "b"):
        proc = run_cli("convert", raw_copy, tmp_path / out, "--samples-per-shard", "6", "--on-error", "skip",
                       "--quiet")
        assert proc.returncode == 0, proc.stderr
    first, second = ((tmp_path / o / "index.json").read_bytes() for o in ("a", "b"))
    assert first == second  # no run-specific text (an object's address) in what is recorded
    manifest = ddpipe.load_manifest(tmp_path / "a")
    assert [s.path for s in manifest.skipped] == [str(victim)] and manifest.num_samples == 23


def test_not_an_image_is_recorded_without_run_specific_text(raw_copy: Path, tmp_path: Path) -> None:
    first_class = sorted(p for p in raw_copy.iterdir() if p.is_dir())[0]  # past synth's record of its options
    (first_class / "notes.jpg").write_bytes(b"not an image at all")
    for out in ("a", "b"):
        assert run_cli("convert", raw_copy, tmp_path / out, "--on-error", "skip", "--quiet").returncode == 0
    assert (tmp_path / "a" / "index.json").read_bytes() == (tmp_path / "b" / "index.json").read_bytes()


def test_the_decode_check_can_be_skipped_for_speed(raw_copy: Path, tmp_path: Path) -> None:
    cut_short(raw_copy)
    proc = run_cli("convert", raw_copy, tmp_path / "out", "--no-decode-check", "--quiet")
    assert proc.returncode == 0, proc.stderr  # only the header was read: the user's choice
    assert ddpipe.load_manifest(tmp_path / "out").num_samples == 24


def test_a_class_directory_without_images_is_refused_unless_allowed(raw_copy: Path, tmp_path: Path) -> None:
    """A zip's __MACOSX directory (its files all hidden) sorted first and took label 0, silently moving
    every real class's label one up from a tree without it; torchvision's ImageFolder refuses it too."""
    mac = raw_copy / "__MACOSX"
    mac.mkdir()
    (mac / "._a.jpg").write_bytes(b"\x00\x05\x16\x07")
    proc = run_cli("convert", raw_copy, tmp_path / "out", "--quiet")
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{raw_copy}: class directories without images: __MACOSX; each would still take a label" in proc.stderr
    assert "--allow-empty" in proc.stderr and not (tmp_path / "out").exists()
    kept = run_cli("convert", raw_copy, tmp_path / "out", "--allow-empty", "--quiet")
    assert kept.returncode == 0, kept.stderr
    assert ddpipe.load_manifest(tmp_path / "out").classes[0] == "__MACOSX"  # kept, as asked


def _pil_verdict(data: bytes, draft: bool) -> bool:
    """Whether PIL alone decodes the image whole: the check's verdict, by its definition."""
    import io

    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as img:
            if draft:
                img.draft("RGB", (max(1, img.width // 8), max(1, img.height // 8)))
            img.load()
    except (OSError, ValueError, SyntaxError):
        return False
    return True


def _jpegs() -> list[bytes]:
    import io

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(5)
    pixels = (rng.random((96, 128, 3)) * 255).astype(np.uint8)
    made = []
    kinds: list[tuple[str, dict[str, object]]] = [("RGB", {}), ("RGB", {"progressive": True}), ("L", {}), ("CMYK", {}),
                     ("RGB", {"subsampling": 0, "quality": 95})]
    for mode, kw in kinds:
        buf = io.BytesIO()
        Image.fromarray(pixels).convert(mode).save(buf, format="JPEG", **kw)
        made.append(buf.getvalue())
    return made


JPEGS = _jpegs()


@settings(max_examples=300, deadline=None)
@given(which=st.integers(0, len(JPEGS) - 1), draft=st.booleans(), cut=st.floats(0.0, 1.0),
       damage=st.lists(st.tuples(st.floats(0.0, 1.0), st.integers(0, 255)), max_size=4),
       how=st.sampled_from(["whole", "cut", "damaged", "both"]))
def test_the_check_passes_what_pil_decodes_and_no_more(which: int, draft: bool, cut: float,
                                                       damage: list[tuple[float, int]], how: str) -> None:
    """The check decodes a JPEG with libjpeg-turbo first and asks PIL only of one that fails there:
    its verdict is PIL's on JPEGs whole, cut short, or with bytes overwritten (baseline, progressive,
    grayscale, CMYK and 4:4:4 ones), in both scales."""
    from ddpipe.decode.spec import decode_check

    data = bytearray(JPEGS[which])
    if how in ("damaged", "both"):
        for where, value in damage:
            data[min(len(data) - 1, int(where * len(data)))] = value
    if how in ("cut", "both"):
        data = data[: max(4, int(cut * len(data)))]
    try:
        decode_check(bytes(data), draft=draft)
        passed = True
    except (OSError, ValueError, SyntaxError):
        passed = False
    assert passed == _pil_verdict(bytes(data), draft)


@pytest.mark.parametrize("digests", [True, False], ids=["sample digests", "shard checksums only"])
def test_a_dataset_changed_since_its_manifest_is_never_converted_into_new_checksums(digests: bool,
                                                                                   tmp_path: Path) -> None:
    """Converting a dataset checks what it reads as a loader does (each sample against its digest, or
    each shard against its checksum where the manifest has no digests): a changed sample stops the
    conversion naming its shard, or under ``--on-error skip`` is left out and listed, rather than
    copied into shards whose new checksums would vouch for it."""
    src = make_dataset(tmp_path / "src", "wds", [5, 5, 5])
    if not digests:
        manifest = ddpipe.load_manifest(src)
        save_manifest(src, replace(manifest, shards=tuple(replace(s, digests="") for s in manifest.shards)))
    before = {s["__key__"]: dict(s) for s in ddpipe.open_dataset(src)}
    changed = shard_file(src, 1)
    flip_inside_sample(changed, bytes(before["s/000007"]["bin"]))
    out = tmp_path / "out"
    proc = run_cli("convert", src, out, "--format", "lmdb", "--quiet")
    says = "digest differs" if digests else "checksum mismatch"
    assert proc.returncode == 1 and str(changed) in proc.stderr and says in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not (out / "index.json").exists()
    proc = run_cli("convert", src, tmp_path / "kept", "--format", "lmdb", "--on-error", "skip", "--quiet")
    assert proc.returncode == 0, proc.stderr
    left_out = {"s/000007"} if digests else {f"s/{i:06d}" for i in range(5, 10)}  # the sample, or its shard
    converted = ddpipe.open_dataset(tmp_path / "kept")
    assert {s["__key__"]: dict(s) for s in converted} == {k: s for k, s in before.items() if k not in left_out}
    assert [s.path for s in converted.manifest.skipped] == [str(changed)] * len(left_out)
    # each sample left out told apart: by its key, or, its shard failing whole, by its place in it
    named = [s.error.split(" is not the one")[0] if digests else s.error.split(", its shard failing its check")[0]
             for s in converted.manifest.skipped]
    assert named == (["sample 2 ('s/000007')"] if digests else [f"sample {i} unread" for i in range(5)]), named
