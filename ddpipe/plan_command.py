"""``ddpipe plan DATASET --world-size W``: how well each shuffle mixes this dataset at that scale,
and the smallest exchange fraction Q that comes close to a global shuffle, before any job runs.

Pure planning: the epoch plans the Loader would carry out for W ranks, scored from the manifest
(the shards' label runs), without MPI and without reading a shard, so it answers for an
ImageNet-sized dataset at thousands of ranks in seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

import numpy as np

from .cli import arguments as arg
from .errors import DdpipeError
from .manifest import numbered_class_limit
from .plan import ASSIGNMENTS, PlanOptions
from .quality import advise_exchange
from .reading import read_samples
from .sample import class_of, unlabelled
from .shufflers import get_shuffler

if TYPE_CHECKING:
    from .dataset import Dataset

DEFAULT_FRACTIONS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.8, 0.9)


def _share(text: str) -> float:
    """--within: a share of the gap, in [0, 1] (checked by advise_exchange too, but only after the labels
    are read, and as the command's usage error here)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be a share of the gap, in [0, 1], not {text}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dataset", type=arg.path,
                   help="dataset directory, or s3:// or http(s):// prefix (only its index.json is read)")
    p.add_argument("--world-size", "-W", type=arg.positive, required=True, help="ranks of the job (GPUs)")
    p.add_argument("--batch-size", type=arg.positive, default=32, help="per rank")
    p.add_argument("--exchange-fraction", type=float, nargs="+", default=list(DEFAULT_FRACTIONS), metavar="Q",
                   help="the Q values to score")
    p.add_argument("--within", type=_share, default=0.25,
                   help="choose the smallest Q leaving at most this share of local shuffling's batch-skew "
                        "gap to a global shuffle (default 0.25; the README relates it to accuracy)")
    p.add_argument("--shard-assignment", choices=ASSIGNMENTS, default="sticky", help=arg.ASSIGNMENT_HELP)
    p.add_argument("--buffer-size", type=arg.count, default=PlanOptions.buffer_size,
                   help="samples in each rank's shuffle buffer (local shuffle)")
    p.add_argument("--round-size", type=arg.positive, default=PlanOptions.round_size,
                   help="samples each rank reads between two exchanges (partial shuffle)")
    p.add_argument("--seed", type=int, default=0, help=arg.SEED_HELP)
    p.add_argument("--json", action="store_true", help="print the scores as JSON")


def sample_labels(data: Dataset) -> np.ndarray:
    """Every sample's class: from the manifest's label runs, else read from the shards."""
    labels = data.manifest.sample_labels()
    if labels is not None:
        return labels
    if (wrong := unlabelled(data.manifest.fields)) is not None:  # from the manifest: no shard need be read
        raise DdpipeError(f"{wrong}: shuffles are scored by class", path=data.where)
    from tqdm import tqdm

    print(f"ddpipe: {data.where}/index.json records no labels (written by an older ddpipe, or adopted): "
          "reading every sample's label from the shards", file=sys.stderr)
    read = read_samples(data, np.arange(len(data)))
    named = len(data.manifest.classes)
    try:  # the bar closed on its line as it ends, by an error too (its text went on after the bar)
        with tqdm(read, total=len(data), unit="sample", file=sys.stderr) as bar:
            labels = np.fromiter((class_of(s, named) for s in bar), dtype=np.int64, count=len(data))
    except ValueError as e:
        raise DdpipeError(f"a sample's label is no class: {e}", path=data.where) from None
    if (labels < 0).any():
        raise DdpipeError("some samples have no 'cls' label: shuffles are scored by class", path=data.where)
    if not named and len(labels) and labels.max() >= numbered_class_limit(len(data)):  # as the manifest's runs
        raise DdpipeError(f"a sample's label is {labels.max()}, more classes than a dataset of {len(data)} samples "
                          "is taken to have", path=data.where)
    return labels


def main(args: argparse.Namespace) -> int:
    if any(not 0 < q <= 1 for q in args.exchange_fraction):
        raise DdpipeError("each --exchange-fraction must be in (0, 1]")
    from .dataset import open_dataset

    # every shard's size as recorded (a stat, no read): a manifest consistent with itself may still claim
    # more samples than its files hold, and planning that many would run out of memory instead of failing
    data = open_dataset(args.dataset)
    dataset, manifest = data.where, data.manifest
    if len(data) == 0:  # as the loaders say it ("0 samples cannot be shared by 2 ranks" blamed the world)
        raise DdpipeError("the dataset holds no samples: nothing to plan", path=dataset)
    labels = sample_labels(data)
    if len(labels) < args.world_size:
        raise DdpipeError(f"{len(labels)} samples cannot be shared by {args.world_size} ranks", path=dataset)
    if len(labels) // args.world_size < args.batch_size:
        raise DdpipeError(f"each of {args.world_size} ranks holds {len(labels) // args.world_size} samples, "
                          f"less than one batch of {args.batch_size}: batches are what is scored", path=dataset)
    try:
        options = PlanOptions(batch_size=args.batch_size, shard_assignment=args.shard_assignment,
                              buffer_size=args.buffer_size, round_size=args.round_size)
    except ValueError as e:
        raise DdpipeError(str(e)) from None
    advice = advise_exchange(manifest, labels, args.world_size, args.exchange_fraction, options, args.within,
                             args.seed)
    if args.json:
        print(json.dumps({"dataset": str(dataset), "samples": len(labels), **advice.to_dict()}, indent=1))
        return 0
    print(f"{dataset}: {len(labels)} samples of {int(labels.max()) + 1} classes, {args.world_size} ranks "
          f"({advice.samples_per_rank} samples each), local batch {args.batch_size}")
    print("| shuffle | Q | batch skew | rank skew | step skew | order correlation | batch-skew gap closed |")
    print("|---|---|---|---|---|---|---|")
    for m in advice.scores:
        q = f"{m.exchange_fraction:g}" if get_shuffler(m.shuffle).exchanges else "-"
        print(f"| {m.shuffle} | {q} | {m.score.batch_skew:.3f} | {m.score.rank_skew:.3f} | {m.score.step_skew:.3f} | "
              f"{m.score.order_correlation:.3f} | {100 * m.gap_closed:.0f}% |")
    print(f"uniformly random batches (the floor): batch skew {advice.scores[0].score.random_skew:.3f}")
    if advice.chosen is None:
        print(f"no Q scored closes {100 * (1 - args.within):.0f}% of the gap: try larger ones, or shuffle globally")
    else:
        print(f"smallest Q closing {100 * (1 - args.within):.0f}% of the gap: --exchange-fraction {advice.chosen:g}")
    if advice.buffer_bound:
        print(f"note: each step's batches, all ranks together, are {advice.scores[0].score.step_skew:.2f} from the "
              f"class mix against {advice.scores[-1].score.step_skew:.2f} for a global shuffle: the job reads few "
              "classes at a time, which no exchange changes; score a larger --buffer-size")
    return 0
