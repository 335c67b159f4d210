"""convert decodes what it converts: a JPEG cut short is caught at conversion, not hours into training;
and what a conversion records is the same from run to run."""

from __future__ import annotations

from pathlib import Path

import ddpipe

from ..conftest import run_cli


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
    (sorted(raw_copy.iterdir())[0] / "notes.jpg").write_bytes(b"not an image at all")
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
