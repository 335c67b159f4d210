"""Images that do not decode and labels no class names: named with their key and shard, or skipped
and counted with the batches kept full, and the decoder serving the next epoch."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import ddpipe
from ddpipe.decode import DecodeOptions
from ddpipe.errors import SampleError

from .images import (
    DECODERS,
    corrupt_dataset,
    fewer_names_than_labels,
    labelled_samples,
    stops_dali,
)


@pytest.mark.parametrize("decode", DECODERS)
def test_corrupt_image_fails_naming_key_and_shard(tmp_path: Path, decode: str) -> None:
    root = corrupt_dataset(tmp_path / "bad")
    with pytest.raises(SampleError, match=r"img/0005.*|img/0013.*") as info:
        list(ddpipe.Loader(root, 4, decoder=decode, device="cpu", shuffle="none",
                           decode=DecodeOptions(size=16, resize_shorter=16, threads=1)))
    assert "shard-00000" in str(info.value) and info.value.key in ("img/0005", "img/0013")


@pytest.mark.parametrize("decode", DECODERS)
def test_corrupt_images_skipped_and_counted_batches_stay_equal(tmp_path: Path, decode: str) -> None:
    root = corrupt_dataset(tmp_path / "bad")
    ld = ddpipe.Loader(root, 4, decoder=decode, device="cpu", shuffle="none", on_error="skip",
                       decode=DecodeOptions(size=16, resize_shorter=16, dtype="uint8", threads=1))
    batches = list(ld)
    assert len(batches) == len(ld) == 5  # every rank still yields the same number of batches
    assert [len(labels) for _, labels in batches] == [4] * 5  # refilled: every batch keeps its size
    assert ld.stats.skipped == 2 and sorted(k for k, _, _ in ld.stats.skipped_samples) == ["img/0005", "img/0013"]
    assert ld.stats.decode.repeated == 2  # the stream ran 2 short: the last batch repeats 2 of its samples
    # said alike by every decoder, with no run's particulars (PIL's named its buffer's address)
    reasons = {k: reason for k, _, reason in ld.stats.skipped_samples}
    assert reasons["img/0013"] == "does not decode: not an image: no image format recognises it", reasons




@pytest.mark.parametrize(("decode", "read_in"), [("pil", "thread"), ("dali-cpu", "thread"), ("dali-cpu", "process")])
def test_a_label_outside_the_named_classes_is_a_bad_sample(tmp_path: Path, decode: str, read_in: str) -> None:
    """A training loss fails on such a label (on a GPU, a device-side assert that names no sample)."""
    root, unnamed = fewer_names_than_labels(tmp_path / "d", 3)
    assert 0 < len(unnamed) < 20

    def loader(on_error: str) -> ddpipe.Loader:
        options = DecodeOptions(size=16, resize_shorter=16, dtype="uint8", threads=1, read_in=read_in)
        return ddpipe.Loader(root, 4, decoder=decode, device="cpu", shuffle="none", on_error=on_error, decode=options)

    with loader("fail") as ld, pytest.raises(SampleError, match=r"cls [3-5] is outside the dataset's 3 ") as info:
        list(ld)
    assert info.value.key in unnamed and "shard-00000" in str(info.value)
    with loader("skip") as ld:
        labels = torch.cat([y for _, y in ld])
    assert len(labels) == 20 and int(labels.max()) < 3  # refilled with named samples
    assert ld.stats.skipped == len(unnamed) and {k for k, _, _ in ld.stats.skipped_samples} == unnamed


@pytest.mark.parametrize("read_in", ["thread", "process"])
def test_where_labels_are_required_a_sample_without_one_is_a_bad_sample(tmp_path: Path, read_in: str) -> None:
    """Without require_labels it comes with label -1, for a loss's ignore_index; with it (ddpipe train's
    loss needs a class for every sample) it is named, or skipped and refilled."""
    samples = labelled_samples(20, np.random.default_rng(1))
    for i in (3, 11):
        del samples[i]["cls"]
    samples[14]["cls"] = b"-1"
    ddpipe.write_dataset(tmp_path / "d", iter(samples), samples_per_shard=8, classes=[str(c) for c in range(6)])
    unlabelled = {"img/0003", "img/0011", "img/0014"}

    def loader(on_error: str, required: bool) -> ddpipe.Loader:
        options = DecodeOptions(size=16, resize_shorter=16, dtype="uint8", threads=1, read_in=read_in,
                                require_labels=required)
        return ddpipe.Loader(tmp_path / "d", 4, decoder="dali-cpu", device="cpu", shuffle="none", on_error=on_error,
                             decode=options)

    with loader("fail", False) as ld:
        assert int((torch.cat([y for _, y in ld]) == -1).sum()) == 3
    with loader("fail", True) as ld, pytest.raises(SampleError, match=r"has no label \(no cls field\)") as info:
        list(ld)
    assert info.value.key == "img/0003"
    with loader("skip", True) as ld:
        labels = torch.cat([y for _, y in ld])
    assert len(labels) == 20 and int(labels.min()) >= 0  # refilled with labelled samples
    assert {k for k, _, _ in ld.stats.skipped_samples} == unlabelled
    assert any("has no label (cls -1)" in why for _, _, why in ld.stats.skipped_samples)




def test_the_pipeline_rebuilt_after_a_bad_image_serves_the_next_epoch(tmp_path: Path) -> None:
    """An image whose header reads but whose data stops right after it passes the crop window's
    check and stops DALI itself; the decoder finds it, rebuilds its pipeline mid-epoch, and the
    rebuilt one, reset, gives the next epoch the batches a fresh loader gives it."""
    root = stops_dali(tmp_path / "bad")

    def skipping() -> ddpipe.Loader:
        return ddpipe.Loader(root, 4, decoder="dali-cpu", device="cpu", shuffle="local", on_error="skip", seed=1,
                             decode=DecodeOptions(size=16, resize_shorter=16, dtype="uint8", threads=1))

    ld = skipping()
    list(ld)
    ld.set_epoch(1)
    again = [(x.clone(), y.clone()) for x, y in ld]
    fresh = skipping()
    fresh.set_epoch(1)
    want = [(x.clone(), y.clone()) for x, y in fresh]
    assert len(again) == len(want) == 5 and ld.stats.skipped == fresh.stats.skipped == 1
    assert [k for k, _, _ in ld.stats.skipped_samples] == ["img/0006"]  # the last epoch's
    assert all(torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(again, want, strict=True))
    ld.close()
    fresh.close()
