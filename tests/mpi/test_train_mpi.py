"""Data-parallel training equals one process with the same global batch, on 1, 2 and 4 real ranks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import ddpipe
from ddpipe.train.models import SmallCNN
from ddpipe.train.step import train_step

from ..conftest import mpiexec
from .train_worker import batches

pytestmark = pytest.mark.mpi
WORKER = Path(__file__).with_name("train_worker.py")


def single_process() -> dict[str, torch.Tensor]:
    torch.manual_seed(100)  # rank 0's initial weights
    model = SmallCNN(5, batch_norm=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for x, y in batches():
        train_step(model, opt, x, y)
    return model.state_dict()


@pytest.mark.parametrize("path", ["mpi", "ddp"])
@pytest.mark.parametrize("world", [1, 2, 4])
def test_same_weights_as_one_process(tmp_path: Path, path: str, world: int) -> None:
    out = tmp_path / "weights.pt"
    proc = mpiexec(world, WORKER, path, out, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got, want = torch.load(out), single_process()
    assert got.keys() == want.keys()
    for k in want:
        assert torch.allclose(got[k], want[k], atol=1e-5, rtol=1e-4), (k, (got[k] - want[k]).abs().max())
    moved = sum(float((got[k] - SmallCNN(5, batch_norm=False).state_dict()[k]).abs().sum()) for k in want)
    assert moved > 0  # the steps did train


@pytest.mark.parametrize("path", ["mpi", "ddp"])
def test_train_command_on_two_ranks(raw_images: Path, tmp_path: Path, path: str) -> None:
    from .ranks import indexed_samples

    ddpipe.convert(raw_images, tmp_path / "wds", ddpipe.ConvertOptions(samples_per_shard=6, progress=False))
    # 23 held-out images: two ranks cannot have as many, and each is counted once all the same; of the
    # training set's 3 classes (a label past them is refused before training)
    held_out = indexed_samples(23)
    for sample in held_out:
        sample["cls"] = b"%d" % (int(sample["cls"]) % 3)
    ddpipe.write_dataset(tmp_path / "held-out", iter(held_out), samples_per_shard=5)
    proc = mpiexec(2, "-m", "ddpipe", "train", tmp_path / "wds", "--model", "smallcnn", "--epochs", "2",
                   "--batch-size", "4", "--image-size", "32", "--allreduce", path, "--decode", "dali-cpu",
                   "--eval", tmp_path / "held-out", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("epoch ")]
    assert len(lines) == 2 and all("images/s" in ln and "data wait per rank" in ln for ln in lines)
    assert all("% of 23 images" in ln for ln in lines), lines
    assert proc.stdout.count("training smallcnn") == 1  # rank 0 reports for the job


def test_progress_lines_among_several_exchange_rounds_an_epoch(tmp_path: Path) -> None:
    """Each progress line gathers every rank's figures on the main thread while the loader's producer
    runs its exchange rounds: on one communicator the two were matched with each other, and the job hung
    at its first line once an epoch had several rounds (more than 512 samples a rank)."""
    import io

    from PIL import Image

    def tiny(c: int) -> bytes:
        buf = io.BytesIO()
        Image.new("RGB", (20, 20), (60 * c, 0, 0)).save(buf, "JPEG")
        return buf.getvalue()

    images = [tiny(c) for c in range(4)]
    samples = ({"__key__": f"i/{i:05d}", "jpg": images[i % 4], "cls": b"%d" % (i % 4)} for i in range(4800))
    ddpipe.write_dataset(tmp_path / "d", samples, samples_per_shard=200, classes=["a", "b", "c", "d"])
    proc = mpiexec(2, "-m", "ddpipe", "train", tmp_path / "d", "--model", "smallcnn", "--batch-size", "16",
                   "--image-size", "16", "--decode", "pil", "--dtype", "uint8", "--shuffle", "partial",
                   "--exchange-fraction", "0.5", "--log-every", "1", timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    # 2,400 samples a rank, 150 steps of 16: a line for each but the last, which the epoch's line stands for
    assert proc.stdout.count("epoch 0 step ") == 149 and "epoch 0: 4800 images" in proc.stdout, proc.stdout[-1000:]
