"""Does partial exchange recover the accuracy that local-only shuffling loses on class-sorted shards?

    python benchmarks/shuffle_accuracy.py [--ranks 4] [--epochs 30] [--seeds 3]

scikit-learn's digits (1,797 real 8x8 images, 10 classes; shipped with the package) are written as
PNG files in class order and converted to class-sorted WebDataset shards with ``ddpipe convert``.
A small CNN with batch normalisation trains on 4 real ranks under mpiexec, each reading through
``ddpipe.Loader`` with one shuffle mode; gradients are averaged with MPI Allreduce after every step
and batch-norm buffers follow rank 0, as PyTorch DDP does. The table gives the final test accuracy
of each mode (mean and spread over seeds), in the manner of Nguyen et al., IPDPS 2022. The
reference measured in the same run is ``global`` shuffling.
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import sys
from pathlib import Path

import numpy as np
from _common import DATA, mpiexec, save

from ddpipe.bench.harness import machine, table

CONFIGS = [("global", 0.0), ("partial", 0.5), ("partial", 0.3), ("partial", 0.1), ("local", 0.0), ("none", 0.0)]
BATCH = 16  # per rank


def make_data(root: Path) -> None:
    from PIL import Image
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    import ddpipe

    digits = load_digits()
    images = (digits.images * (255 / 16)).astype(np.uint8)
    train_x, test_x, train_y, test_y = train_test_split(images, digits.target, test_size=0.2, random_state=0,
                                                        stratify=digits.target)
    shutil.rmtree(root, ignore_errors=True)
    raw = root / "raw"
    for i, (img, label) in enumerate(zip(train_x, train_y, strict=True)):
        path = raw / f"digit{label}" / f"{i:05d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(img).save(path)
    # source order is class order, so shards come out class-sorted; ~one class per shard, as when
    # ImageNet's 1.28 M images in class order are cut into ~1,000 shards
    ddpipe.convert(raw, root / "train", ddpipe.ConvertOptions(format="wds", samples_per_shard=128, progress=False))
    np.savez(root / "test.npz", x=test_x, y=test_y)


def worker(root: Path, out: Path, epochs: int, seeds: int) -> None:
    import torch
    from mpi4py import MPI
    from PIL import Image
    from torch import nn

    import ddpipe
    from ddpipe.comm import init_comm

    torch.set_num_threads(1)
    comm = init_comm()
    world, rank = comm.world.size, comm.world.rank
    mpi = MPI.COMM_WORLD
    test = np.load(root / "test.npz")
    test_x = torch.tensor(test["x"], dtype=torch.float32).unsqueeze(1) / 255
    test_y = torch.tensor(test["y"])

    def decode(batch: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
        x = np.stack([np.asarray(Image.open(io.BytesIO(s["png"]))) for s in batch])
        return torch.tensor(x, dtype=torch.float32).unsqueeze(1) / 255, torch.tensor([int(s["cls"]) for s in batch])

    results = []
    for mode, q in CONFIGS:
        for seed in range(seeds):
            torch.manual_seed(seed)  # the same initial weights on every rank
            model = nn.Sequential(
                nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                nn.Flatten(), nn.Linear(32 * 16, 10))
            opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
            params = [p for p in model.parameters()]
            loader = ddpipe.Loader(root / "train", BATCH, decode="none", shuffle=mode, exchange_fraction=q, seed=seed,
                                   buffer_size=256, round_size=64, drop_last=True, comm=comm)
            for epoch in range(epochs):
                loader.set_epoch(epoch)
                model.train()
                for batch in loader:
                    x, y = decode(batch)
                    for buf in model.buffers():  # DDP's broadcast_buffers: BN statistics follow rank 0
                        mpi.Bcast(buf.detach().numpy(), root=0)
                    opt.zero_grad()
                    nn.functional.cross_entropy(model(x), y).backward()
                    flat = torch.cat([p.grad.reshape(-1) for p in params]).numpy()
                    mpi.Allreduce(MPI.IN_PLACE, flat, op=MPI.SUM)
                    at = 0
                    for p in params:
                        n = p.numel()
                        p.grad.copy_(torch.from_numpy(flat[at : at + n] / world).reshape(p.shape))
                        at += n
                    opt.step()
            if rank == 0:
                model.eval()
                with torch.no_grad():
                    acc = float((model(test_x).argmax(1) == test_y).float().mean())
                results.append({"mode": mode, "q": q, "seed": seed, "accuracy": acc})
                print(f"  {mode} Q={q} seed={seed}: {acc:.4f}", file=sys.stderr, flush=True)
    if rank == 0:
        out.write_text(json.dumps(results))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--worker", nargs=2, metavar=("DATA", "OUT"))
    args = ap.parse_args()
    if args.worker:
        worker(Path(args.worker[0]), Path(args.worker[1]), args.epochs, args.seeds)
        return
    root, out = DATA / "shuffle-accuracy", DATA / f"shuffle-accuracy-{args.ranks}.json"
    make_data(root)
    mpiexec(args.ranks, __file__, "--epochs", args.epochs, "--seeds", args.seeds, "--worker", root, out)
    runs = json.loads(out.read_text())
    rows = []
    best = None
    for mode, q in CONFIGS:
        accs = [r["accuracy"] for r in runs if r["mode"] == mode and r["q"] == q]
        row = {"mode": mode if mode != "partial" else f"partial Q={q}", "accuracy": 100 * float(np.mean(accs)),
               "spread": 100 * float(np.std(accs)), "min": 100 * min(accs), "max": 100 * max(accs)}
        best = best if best is not None else row["accuracy"]  # global shuffling, measured first
        row["vs_global"] = row["accuracy"] - best
        rows.append(row)
    cols = [("mode", "shuffle", "s"), ("accuracy", "top-1 % (mean)", ".2f"), ("spread", "std", ".2f"),
            ("min", "min", ".2f"), ("max", "max", ".2f"), ("vs_global", "vs global (points)", "+.2f")]
    text = table(rows, cols)
    command = f"python benchmarks/shuffle_accuracy.py --ranks {args.ranks} --epochs {args.epochs} --seeds {args.seeds}"
    doc = {"benchmark": "shuffle_accuracy", "command": command, "machine": machine(), "ranks": args.ranks,
           "batch_per_rank": BATCH, "epochs": args.epochs, "rows": rows, "runs": runs, "table": text}
    path = save(f"shuffle_accuracy_{args.ranks}ranks", doc)
    print(text)
    print(f"\nwrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
