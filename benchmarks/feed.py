"""The host side of the GPU path, measured without a GPU: how fast ddpipe can feed DALI when decoding
costs nothing.

    python benchmarks/feed.py [--n 3000] [--repeats 3] [--epochs 5] [--reference CHECKOUT ...]

On an H200, DALI's own pipeline decoded 20,000 images/s and ddpipe's dali-gpu Loader delivered two
thirds of that (gpu.json), while its encoded stream alone ran faster than DALI's pipeline. The
rest of the time goes to the host: the threads that read samples, prepare each batch for DALI (its
headers, crop windows, the arrays DALI reads in place) and run the pipeline share one interpreter
lock. This benchmark replaces the decoding by a DALI graph that decodes nothing (it cuts each
sample's first bytes), so that what is left is that host-side work, on the CPU of any machine:

- **encoded stream alone**: the Loader's reading (local shuffle, every shard checked), nothing
  decoded: the reference;
- **ddpipe's DALI decoder fed from memory**: the same samples, already read, through ddpipe's
  DALI decoder as the dali-gpu path runs it (its feed thread, crop windows, hand-over to torch);
- **Loader**: both together, as the dali-gpu Loader runs them;
- **Loader beside a training step of Python**: the Loader, its caller spending ``STEP_S`` in Python
  after each batch (holding the interpreter lock, as a model's forward and backward dispatched op by
  op do): the fraction of the time the caller waits for batches (*stalled*; *steady*: without each
  epoch's first batch, and the ratios to the references are of this one). The Loader's threads
  then get the lock only between the step's switch intervals, and a call that lets go of it for a
  moment waits that long to take it back.
- **Loader beside a step of launches**: its caller's step is ``LAUNCHES`` short calls that each let
  go of the lock (a hash of a few KB), as PyTorch lets go of it around each op it launches on a GPU:
  each call then takes the lock back from whichever of the Loader's threads holds it. *Slowed*: the
  caller's time per batch, waits included, over its step's time alone (steady); the ratios to the
  references are of it. *First batch*: its wait for each epoch's first batch (the epoch's start:
  a shuffle buffer filled, its first shards checked); *slowed, first batch in*: slowed, counting it.
  On an H200, ResNet-50 fed by the Loader ran at 0.62 of its rate alone where DALI's own pipeline
  let it run at 0.82 (gpu-train.json).
- **Loader beside a step that waits for its device**: its caller's step is ``DEVICE_LAUNCHES`` of
  those calls, then a wait of ``DEVICE_S`` that lets go of the lock, as a training step with AMP
  launches its ops, then waits for the GPU (GradScaler reads whether a gradient overflowed); the
  step is longer than the Loader's time per batch, as ResNet-50's on an H200 is (45 ms for 256
  images). Whatever the Loader does on the caller's thread when asked for a batch, its device
  waits for; what it does on threads of its own runs during the wait. *Stalled, steady* is then
  the share of the time the device would sit idle.
- **read in a process** (``read_in="process"``; in a reference, where it has it): the Loader and
  the step of launches again with the batches read and prepared in a process of their own; *vs
  threads* is the ratio to the same row read by threads, in the same run.

- **DALI's own webdataset reader** (tar shards; this tree's run only, as it runs no ddpipe): DALI's
  pipeline as its users run it over the same shards (its reader shuffling at random, the same graph
  decoding nothing, DALI's iterator handing batches to torch), alone and beside the step of
  launches: the host-side share of the reference a GPU run sets ddpipe against (gpu_train.py). It
  checks no checksum; the Loader checks every shard. *vs DALI's own* sets each of the Loader's tar
  rows against it.

``--stage``: the Loader's rows read the copies they stage (``stage_dir``, no capacity) in a directory
beside each dataset's: every epoch after the first reads node-local copies, as a job that stages does.

``--global-shuffle``: the encoded stream's and the Loader's rows shuffle the whole dataset
(``shuffle="global"``): each sample is read on its own, from a few shards kept open, each shard
checked whole as an epoch first opens it.

``--ranks N`` runs each of the Loader's rows on N MPI ranks (mpiexec), shuffling partially across
them (each rank exchanges a share of its samples every round): read in a process, those rounds go
through the training process's relay thread (``ddpipe/comm/relay.py``). Each figure is then the
slowest rank's. *Processor us a sample* (the Loader's rows alone): the processor time this process
and its reading process took per sample, over the epochs after the first (on several ranks, the
rank that took most).

Where the Loader runs at the stream's rate, the feed costs reading nothing; where it runs at the
rate of the two costs added, the threads only take turns. Fresh processes, their order alternated,
medians of ``--repeats``; each run's rate is the median of its epochs after the first.
``--reference`` (repeatable) measures an earlier commit's ddpipe beside this one's, run for run, so
that a change is judged against its own before in the same run, not against a record made at another
time; each row of this tree's gives its ratio to each reference (``vs_at_<commit>``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from _common import commit_of, env_of, save, synth_shards, trees_to_measure
from feed_runs import BATCH, DALI_KINDS, child

from ddpipe.bench.harness import machine, median, table
from ddpipe.units import parse_size

FORMATS = ("wds", "hdf5", "lmdb")
KINDS = {"stream": "encoded stream alone", "memory": "ddpipe's DALI decoder fed from memory",
         "loader": "Loader", "stall": "Loader beside a training step of Python",
         "launches": "Loader beside a step of launches",
         "loader-process": "Loader, read in a process",
         "launches-process": "Loader, read in a process, beside a step of launches",
         "dali-wds": "DALI's own webdataset reader (no checksums)",
         "launches-dali-wds": "DALI's own webdataset reader (no checksums), beside a step of launches",
         "device": "Loader beside a step that waits for its device",
         "device-process": "Loader, read in a process, beside a step that waits for its device",
         "device-dali-wds": "DALI's own webdataset reader (no checksums), beside a step that waits for its device"}
# the kinds that need read_in="process" (measured in a reference only where it has it), and the kind each is set against
PROCESS_KINDS = {"loader-process": "loader", "launches-process": "launches", "device-process": "device"}
# each kind's figure that ratios compare: a rate (higher is better), or a share of time or a slowing (lower)
MAIN = {"stall": "stall_steady", "launches": "slowdown", "launches-process": "slowdown",
        "launches-dali-wds": "slowdown", "device": "slowdown", "device-process": "slowdown",
        "device-dali-wds": "slowdown"}
# the kinds --stage has read staged copies: the Loader's
STAGED_KINDS = {*DALI_KINDS, "stall"}
# the shards' size: a dozen shards of the synth set (3,000 images), fewer than a random access keeps open
SHARD_BYTES = 32_000_000
# the kinds --global-shuffle shuffles globally: the stream's and the Loader's
SHUFFLED_KINDS = {*STAGED_KINDS, "stream"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--reference", type=Path, action="append", default=[],
                    help="a checkout of an earlier commit (git worktree add): its ddpipe measured too, each of "
                         "its runs beside this tree's, and each figure of this tree's as a ratio to its; "
                         "may be given more than once")
    ap.add_argument("--kinds", nargs="*", choices=list(KINDS), default=list(KINDS), help="the rows to measure")
    ap.add_argument("--name", default="feed", help="the result's name: benchmarks/results/NAME.json")
    ap.add_argument("--ranks", type=int, default=1,
                    help="MPI ranks (mpiexec) for each run of the Loader's kinds, shuffling partially across "
                         "them: each figure is the slowest rank's")
    ap.add_argument("--stage", action="store_true",
                    help="the Loader's kinds read the copies they stage (no capacity) in a directory beside each "
                         "dataset's, rather than the dataset's own files")
    # named as ddpipe convert and benchmarks/convert.py name it; --shard-bytes, its name before, stays for the
    # recorded commands
    ap.add_argument("--shard-size", "--shard-bytes", dest="shard_bytes", type=parse_size, default=SHARD_BYTES,
                    metavar="SIZE", help="the shards' size (32MB, 1500000): smaller, more shards than a random access "
                                         "keeps open (OPEN_SHARDS)")
    ap.add_argument("--global-shuffle", action="store_true",
                    help="the stream's and the Loader's kinds shuffle the whole dataset (random access)")
    ap.add_argument("--stage-dir", type=Path, help=argparse.SUPPRESS)  # a child's: where --stage stages
    ap.add_argument("--run", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.run:
        got = child(args.run[0], Path(args.run[1]), args.epochs, args.stage_dir,
                    "global" if args.global_shuffle else None)
        if got is not None:
            print(json.dumps(got))
        return
    launcher: list[str] = []
    if args.ranks > 1:
        mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or "mpiexec"
        launcher = [mpiexec, "-n", str(args.ranks)]
    name = "loader" if args.shard_bytes == SHARD_BYTES else f"loader-{args.shard_bytes}"
    roots = {fmt: synth_shards(args.n, name, fmt, shard_bytes=args.shard_bytes, seed=0) for fmt in FORMATS}
    trees = trees_to_measure(args.reference)
    references = [tree for tree in trees if tree != "this"]
    kinds = {kind: KINDS[kind] for kind in KINDS if kind in args.kinds}
    todo = [(tree, fmt, kind) for fmt in FORMATS for kind in kinds for tree in trees
            if (kind not in PROCESS_KINDS or (trees[tree] / "ddpipe" / "read_process.py").exists())
            and (kind not in DALI_KINDS.values() or (tree == "this" and fmt == "wds"))]
    results: dict[tuple[str, str, str], list[dict[str, float]]] = {}
    for rep in range(args.repeats):
        for tree, fmt, kind in todo if rep % 2 == 0 else reversed(todo):  # alternated: drift hits all alike
            # the child imports the ddpipe of its tree (this script runs it either way: the same measurement),
            # and runs in it: a reading process before 597b022 imported the ddpipe of its working directory
            env = env_of(trees[tree])
            options = ["--stage-dir", str(roots[fmt].with_name(f"{fmt}-staged"))] if args.stage else []
            options += ["--global-shuffle"] if args.global_shuffle else []
            out = subprocess.run([*launcher, sys.executable, __file__, "--epochs", str(args.epochs), *options, "--run",
                                  kind, str(roots[fmt])], timeout=600, capture_output=True, text=True, env=env,
                                 cwd=trees[tree])
            if out.returncode != 0:  # what the child said, not only that it failed
                sys.exit(f"feed.py: {tree} {fmt} {kind} exited {out.returncode}:\n{out.stderr[-4000:]}")
            results.setdefault((tree, fmt, kind), []).append(json.loads(out.stdout.splitlines()[-1]))
            got = results[tree, fmt, kind][-1]
            print(f"  {tree} {fmt} {kind}: " + ", ".join(f"{k} {v:.3f}" for k, v in got.items()), file=sys.stderr)
    commits = {tree: commit_of(path) for tree, path in trees.items()}

    def figure(tree: str, fmt: str, kind: str, key: str | None = None) -> float:
        """The median over the runs of ``kind``'s figure ``key`` (its main one, :data:`MAIN`, if None)."""
        return median([r[key or MAIN.get(kind, "samples_s")] for r in results[tree, fmt, kind]])

    rows: list[dict[str, Any]] = []
    for tree in trees:
        for fmt in FORMATS:
            for kind, name in kinds.items():
                if (tree, fmt, kind) not in results:
                    continue
                got = {key: figure(tree, fmt, kind, key) for key in results[tree, fmt, kind][0]}
                mine = figure(tree, fmt, kind)
                versus = {f"vs_at_{ref}": mine / figure(ref, fmt, kind)
                          if tree == "this" and (ref, fmt, kind) in results else None for ref in references}
                staged = " (staged copies)" if args.stage and kind in STAGED_KINDS else ""
                staged += " (global shuffle)" if args.global_shuffle and kind in SHUFFLED_KINDS else ""
                row = {"format": fmt, "pipeline": name + staged, "tree": tree, "commit": commits[tree],
                       "samples_s": got.get("samples_s"), "stall": got.get("stall"),
                       "stall_steady": got.get("stall_steady"), "slowdown": got.get("slowdown"),
                       "cpu_us": got.get("cpu_us"), "first_ms": got.get("first_ms"),
                       "slowdown_all": got.get("slowdown_all"), **versus}
                if "samples_s" in got and (tree, fmt, "stream") in results:
                    row["vs_stream"] = got["samples_s"] / figure(tree, fmt, "stream")
                if kind == "loader" and {(tree, fmt, "stream"), (tree, fmt, "memory")} <= results.keys():
                    # the rate the stream and the decoder's feed would reach taking turns, each at its rate alone
                    row["vs_in_turns"] = got["samples_s"] / (1 / (1 / figure(tree, fmt, "stream")
                                                                  + 1 / figure(tree, fmt, "memory")))
                if kind in PROCESS_KINDS and (tree, fmt, PROCESS_KINDS[kind]) in results:
                    row["vs_threads"] = mine / figure(tree, fmt, PROCESS_KINDS[kind])
                if kind in DALI_KINDS and ("this", fmt, DALI_KINDS[kind]) in results:
                    row["vs_dali"] = mine / figure("this", fmt, DALI_KINDS[kind])
                rows.append(row)
    columns = [("format", "format", "s"), ("pipeline", "pipeline", "s"), ("commit", "commit", "s"),
               ("samples_s", "samples/s", ".0f"), ("stall", "stalled", ".1%"),
               ("stall_steady", "stalled, steady", ".1%"), ("slowdown", "slowed", ".2f"),
               ("first_ms", "first batch ms", ".1f"), ("slowdown_all", "slowed, first batch in", ".2f"),
               ("vs_stream", "/ stream alone", ".2f"), ("vs_in_turns", "/ the two in turns", ".2f"),
               ("vs_threads", "/ read by threads", ".2f"), ("vs_dali", "/ DALI's own", ".2f"),
               ("cpu_us", "processor us a sample", ".1f")]
    columns += [(f"vs_at_{ref}", f"/ at {ref}", ".2f") for ref in references]
    used = [c for c in columns if any(r.get(c[0]) is not None for r in rows)]
    text = table(rows, used)
    command = f"python benchmarks/feed.py --n {args.n} --repeats {args.repeats} --epochs {args.epochs}"
    command += "".join(f" --reference <checkout of {ref}>" for ref in references)
    if args.kinds != list(KINDS):
        command += " --kinds " + " ".join(args.kinds)
    if args.name != "feed":
        command += f" --name {args.name}"
    if args.ranks > 1:
        command += f" --ranks {args.ranks}"
    if args.stage:
        command += " --stage"
    if args.global_shuffle:
        command += " --global-shuffle"
    if args.shard_bytes != SHARD_BYTES:
        command += f" --shard-size {args.shard_bytes}"
    from ddpipe.formats.mapped import open_files_limit  # this tree's (a child may run a reference's ddpipe)
    from ddpipe.manifest import load_manifest

    doc = {"benchmark": "feed", "command": command, "commits": commits, "machine": machine(), "batch": BATCH,
           "ranks": args.ranks, "staged": args.stage, "global_shuffle": args.global_shuffle,
           "shard_bytes": args.shard_bytes,
           "shards": {fmt: len(load_manifest(root).shards) for fmt, root in roots.items()},
           "open_files_limit": open_files_limit(),  # how many files a dataset keeps mapped follows it (kept_files)
           "rows": rows, "runs": {f"{tree} {fmt} {kind}": r for (tree, fmt, kind), r in results.items()},
           "table": text}
    path = save(args.name, doc)
    print(text)
    print(f"\nwrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
