"""The ``ddpipe`` command line's arguments: one subparser per command, each bound to its handler."""

from __future__ import annotations

import argparse
import functools
import os
from collections.abc import Sequence

from ..decode.spec import DECODERS, DTYPES, ON_ERROR, READ_IN
from ..formats import FORMAT_NAMES
from ..plan import ASSIGNMENTS
from ..shufflers import SHUFFLERS
from ..throttle import ENV_VAR as THROTTLE_ENV
from . import arguments as arg
from .commands import cmd_bench, cmd_convert, cmd_inspect, cmd_serve, cmd_stage, cmd_synth, cmd_train, cmd_verify


class HelpWithDefaults(argparse.ArgumentDefaultsHelpFormatter):
    """Every subcommand's ``--help`` shows each option's default: where it has one (not None or an empty
    list, not a flag's False) and its help does not already say it (nor, for a default of 0, what 0 means)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default in (None, []) or action.nargs == 0 or "default" in text \
                or (action.default == 0 and "(0: " in text):
            return text
        return super()._get_help_string(action)


def _decode_service_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--decode-service", action="extend", type=arg.addresses, default=[],
                   metavar="ADDRESS[,ADDRESS...]",
                   help="decode on these servers (ddpipe serve), e.g. tcp://cpu-node-1:5555; here while none answers")


def _read_in_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--read-in", choices=READ_IN, default="auto",
                   help="where each rank's batches are read and prepared for a DALI decoder: its threads, or a "
                        "process of its own, off the training process's interpreter lock (auto: a process for "
                        "dali-gpu, else threads)")


def parse_command_line(argv: Sequence[str] | None) -> argparse.Namespace:
    """``argv`` parsed; an argument the command does not take is that command's error, shown with
    that command's usage (argparse's own shows the top parser's: the list of commands)."""
    parser, commands = _build()
    args, unknown = parser.parse_known_args(argv)
    command = commands.choices[args.command]  # a command is required: argparse ended without one
    if unknown:
        command.error(f"unrecognized arguments: {' '.join(unknown)}")
    for option, (needs, value) in _NEEDS.get(args.command, {}).items():  # given, yet it would change nothing
        dest, needed = _dest(option), getattr(args, _dest(needs))
        if getattr(args, dest) != command.get_default(dest) and (needed is None if value is None else needed != value):
            command.error(f"argument {option}: takes effect only with {needs}{'' if value is None else ' ' + value}")
    if getattr(args, "read_in", None) == "process" and (args.decode == "pil" or args.decode_service):
        # the library's refusal names its own option (read_in='process'), and comes after the banner
        other = "--decode pil" if args.decode == "pil" else "--decode-service"
        command.error(f"argument --read-in: process prepares batches for a DALI decoder in this process: "
                      f"not with {other}")
    return args


def _dest(option: str) -> str:
    return option.lstrip("-").replace("-", "_")


# options of a command that act only together with another (given at all, or given this value): given
# alone, they were passed over in silence (--checkpoint-every, --synsets, --exchange-fraction beside another
# shuffle) or refused by the library's name for them ("stage_dir=None stages nothing")
_PARTIAL_ONLY = {"--exchange-fraction": ("--shuffle", "partial")}
_NEEDS: dict[str, dict[str, tuple[str, str | None]]] = {
    "train": {"--stage-capacity": ("--stage-dir", None), "--checkpoint-every": ("--checkpoint", None),
              **_PARTIAL_ONLY},
    "convert": {"--synsets": ("--val-labels", None)},
    "bench": {"--compare-dir": ("--compare", None), **_PARTIAL_ONLY,
              **{f"--{o}": ("--project", None) for o in ("project-images", "gpus-per-node", "fs-bandwidth",
                                                         "local-bandwidth", "local-capacity", "link-bandwidth",
                                                         "link-latency", "model-step-time", "decode-rate")}},
}


def _build() -> tuple[argparse.ArgumentParser, argparse._SubParsersAction[argparse.ArgumentParser]]:
    from ..bench.peers import PEERS
    from ..version import __version__

    parser = argparse.ArgumentParser(prog="ddpipe", description="Distributed data pipeline for deep-learning training.")
    parser.add_argument("--version", action="version", version=f"ddpipe {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    command = functools.partial(sub.add_parser, formatter_class=HelpWithDefaults)  # each command's parser

    p = command("synth", help="write an ImageNet-like ImageFolder of real JPEGs")
    p.add_argument("out", type=arg.local, help="directory to write: OUT/<class>/<image>.jpg")
    p.add_argument("--n", type=arg.positive, default=1000, help="number of images")
    p.add_argument("--classes", type=arg.positive, default=10, help="number of classes, the images split evenly")
    p.add_argument("--seed", type=int, default=0, help="the same seed writes the same images")
    p.add_argument("--quality", type=arg.jpeg_quality, default=90, help="JPEG quality, 1 to 100")
    p.add_argument("--workers", type=arg.positive, default=1, help="processes encoding images")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_synth)

    p = command("convert", help="convert an ImageFolder, a list file or a dataset into shards")
    p.add_argument("src", type=arg.path,
                   help="ImageFolder root, list file (.csv/.tsv of 'path,label', Caffe's .txt of 'path label', "
                        "im2rec's .lst), or a ddpipe dataset")
    p.add_argument("out", type=arg.path, help="directory, or s3:// prefix, to write the shards and index.json to")
    p.add_argument("--format", choices=FORMAT_NAMES, default="wds",
                   help="wds: WebDataset tar shards; hdf5 or lmdb: one file per shard")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--shard-size", type=arg.size, default=None, help="target shard size, e.g. 256MB (default)")
    size.add_argument("--samples-per-shard", type=arg.positive, default=None,
                      help="a fixed number of samples per shard instead of a size")
    p.add_argument("--seed", type=int, default=None, help="shuffle samples across shards (default: keep source order)")
    p.add_argument("--workers", type=arg.positive, default=1, help="parallel shard writers")
    p.add_argument("--on-error", choices=ON_ERROR, default="fail",
                   help="an unreadable or non-image input: stop (default) or skip and record it")
    p.add_argument("--allow-empty", action="store_true",
                   help="write an empty dataset if every input is skipped, and keep class directories without "
                        "images as classes of no samples")
    p.add_argument("--val-labels", type=arg.local,
                   help="ImageNet's validation ground truth (LOC_val_solution.csv or "
                        "ILSVRC2012_validation_ground_truth.txt) for SRC, its flat directory")
    p.add_argument("--synsets", type=arg.local, help="the synset list (LOC_synset_mapping.txt, map_clsloc.txt)")
    p.add_argument("--no-decode-check", action="store_true",
                   help="check only each image's header, not that it decodes whole (faster; see README)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_convert)

    p = command("index", help="adopt tar shards, HDF5 files or an LMDB in place: write their index.json")
    from ..convert import index_command

    index_command.add_arguments(p)
    p.set_defaults(func=index_command.main)

    p = command("plan", help="score each shuffle at a world size from the manifest, and choose Q")
    from .. import plan_command

    plan_command.add_arguments(p)
    p.set_defaults(func=plan_command.main)

    p = command("stage", help="copy this node's shards to node-local storage ahead of a job")
    p.add_argument("dataset", type=arg.path, help="dataset directory, or s3:// or http(s):// prefix")
    p.add_argument("--local-dir", type=arg.local, required=True,
                   help="node-local directory (an SSD, or memory); {node} gives each node its own, "
                        "$VAR takes it from the node's environment")
    p.add_argument("--capacity", type=arg.size, default=None,
                   help="bytes of local storage to use, e.g. 100GB: the first epoch's shards that fit are staged")
    p.add_argument("--epochs", type=arg.positive, default=1, help="stage the shards of this many epochs")
    p.add_argument("--shuffle", choices=tuple(SHUFFLERS), default="partial",
                   help="the training job's shuffle mode (decides which shards each node reads)")
    p.add_argument("--shard-assignment", choices=ASSIGNMENTS, default="sticky", help=arg.ASSIGNMENT_HELP)
    p.add_argument("--seed", type=int, default=0, help="the training job's seed (decides its shard order)")
    p.add_argument("--source-throttle", type=arg.source_limits, default=os.environ.get(THROTTLE_ENV),
                   help=f"model a slow source, e.g. 100MB/s,5ms (default: ${THROTTLE_ENV})")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_stage)

    p = command("train", help="data-parallel training fed by the loader (under mpiexec, srun or torchrun)")
    p.add_argument("dataset", type=arg.path, help="dataset directory, or s3:// or http(s):// prefix")
    p.add_argument("--model", type=arg.model, default="resnet50", help=arg.MODELS_HELP)
    p.add_argument("--epochs", type=arg.positive, default=1, help="epochs to train")
    p.add_argument("--batch-size", type=arg.positive, default=64, help="per rank")
    p.add_argument("--allreduce", choices=["ddp", "mpi"], default="ddp",
                   help="average gradients with torch's DistributedDataParallel, or over MPI (under mpiexec)")
    p.add_argument("--lr", type=arg.above_zero, default=0.1, help="for a global batch of 256, scaled linearly")
    p.add_argument("--warmup-epochs", type=arg.at_least_zero, default=0.0,
                   help="epochs over which the learning rate rises linearly to --lr")
    p.add_argument("--eval", type=arg.path, help="a held-out dataset: top-1 accuracy after each epoch (its "
                   "classes matched to the training dataset's by name)")
    p.add_argument("--image-size", type=arg.image_size, default=224, help=arg.IMAGE_SIZE_HELP)
    p.add_argument("--dtype", choices=DTYPES, default="uint8",
                   help="loader output; uint8 is normalised on the training device")
    p.add_argument("--decode", default="auto", choices=DECODERS, help=arg.DECODE_HELP)
    p.add_argument("--device", default="auto", help="cpu, cuda or cuda:N (auto: this rank's GPU by local rank, "
                   "else the CPU)")
    _decode_service_argument(p)
    _read_in_argument(p)
    p.add_argument("--amp", action="store_true", help="mixed precision (GPU)")
    p.add_argument("--channels-last", action="store_true", help="the model and batches in channels-last layout")
    p.add_argument("--shuffle", choices=tuple(SHUFFLERS), default="partial", help=arg.SHUFFLE_HELP)
    p.add_argument("--exchange-fraction", type=arg.fraction, default=0.3, help=arg.EXCHANGE_HELP)
    p.add_argument("--shard-assignment", choices=ASSIGNMENTS, default="sticky", help=arg.ASSIGNMENT_HELP)
    p.add_argument("--stage-dir", type=arg.local, default=None,
                   help="node-local staging directory ('auto': $DDPIPE_LOCAL_DIR; {node} and $VAR are resolved "
                        "on each node)")
    p.add_argument("--stage-capacity", type=arg.size, default=None,
                   help="bytes of node-local storage to use, e.g. 100GB (default: no limit)")
    p.add_argument("--checkpoint", type=arg.local_path, default=None,
                   help="file to save to and resume from (also saved when SIGTERM or SIGUSR1 stops the job)")
    p.add_argument("--checkpoint-every", type=arg.count, default=0,
                   help="steps between mid-epoch checkpoints (0: at the end of each epoch only)")
    p.add_argument("--max-steps", type=arg.count, default=0,
                   help="stop after this many steps, saving the checkpoint (0: no limit)")
    p.add_argument("--log-every", type=arg.count, default=50,
                   help="a progress line every this many steps (0: epochs only)")
    p.add_argument("--on-error", choices=ON_ERROR, default="fail",
                   help="an image that does not decode: stop naming it, or skip and count it")
    p.add_argument("--num-classes", type=arg.positive, default=None,
                   help="when the dataset names no classes (default: 1000)")
    p.add_argument("--seed", type=int, default=0, help=arg.SEED_HELP)
    p.set_defaults(func=cmd_train)

    p = command("bench", help="measure each stage and the data wait of a training step, on this dataset")
    p.add_argument("dataset", type=arg.path, help="dataset directory, or s3:// or http(s):// prefix")
    p.add_argument("--batch-size", type=arg.positive, default=64, help="per rank")
    p.add_argument("--step-time", type=arg.seconds, default=0.05, help="seconds of a simulated training step")
    p.add_argument("--model", type=arg.model, default=None,
                   help=f"time a real model's SGD step instead of a simulated one: {arg.MODELS_HELP}")
    p.add_argument("--epochs", type=arg.positive, default=1, help="epochs of the full pipeline feeding the step")
    p.add_argument("--compare", nargs="*", default=None, choices=list(PEERS), metavar="PEER",
                   help=f"also run these peers on the same data ({', '.join(PEERS)}; none named: every one installed)")
    p.add_argument("--compare-dir", type=arg.local, default=None,
                   help="under which the peers' inputs are written once, in a directory of their own per "
                        "dataset (default: temp dir)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar or phase lines")
    p.add_argument("--shuffle", choices=tuple(SHUFFLERS), default="partial", help=arg.SHUFFLE_HELP)
    p.add_argument("--exchange-fraction", type=arg.fraction, default=0.3, help=arg.EXCHANGE_HELP)
    p.add_argument("--decode", default="auto", choices=DECODERS, help=arg.DECODE_HELP)
    _decode_service_argument(p)
    _read_in_argument(p)
    p.add_argument("--image-size", type=arg.image_size, default=224, help=arg.IMAGE_SIZE_HELP)
    p.add_argument("--cold", action="store_true", help="evict the dataset from the page cache before each epoch")
    p.add_argument("--stage-dir", type=arg.local, default=None,
                   help="node-local directory to stage the shards to first")
    p.add_argument("--source-throttle", type=arg.source_limits, default=os.environ.get(THROTTLE_ENV),
                   help=f"model a slow source, e.g. 100MB/s,5ms (default: ${THROTTLE_ENV})")
    p.add_argument("--json", type=arg.local, default=None, help="write every figure and the machine to this file")
    p.add_argument("--plot", type=arg.plot_file, default=None,
                   help="write a PNG of throughput by stage and stall over the epoch")
    p.add_argument("--project", type=arg.node_counts, default=None, metavar="nodes=1,8,64,512",
                   help="project to these cluster sizes")
    p.add_argument("--project-images", type=arg.positive, default=None,
                   help="dataset size to project (default: this one)")
    p.add_argument("--gpus-per-node", type=arg.positive, default=4, help="ranks per node of the projected clusters")
    p.add_argument("--fs-bandwidth", type=arg.size, default=10 * 10**9,
                   help="shared file system, aggregate, per second")
    p.add_argument("--local-bandwidth", type=arg.size, default=3 * 10**9, help="node-local storage, per second")
    p.add_argument("--local-capacity", type=arg.size, default=3800 * 10**9, help="node-local storage, bytes per node")
    p.add_argument("--link-bandwidth", type=arg.size, default=25 * 10**9, help="per node, per second")
    p.add_argument("--link-latency", type=arg.seconds, default=5e-6, help="seconds per message")
    # None, not 0, for "not given": a 0 given was taken for none (a rate of 0 for the one measured)
    p.add_argument("--model-step-time", type=arg.seconds, default=None,
                   help="the real model's step (default: --step-time)")
    p.add_argument("--decode-rate", type=arg.above_zero, default=None,
                   help="images/s one rank decodes on the cluster (default: measured here)")
    p.add_argument("--seed", type=int, default=0, help=arg.SEED_HELP)
    p.set_defaults(func=cmd_bench)

    p = command("serve", help="decode batches for trainers on other nodes (DecodeOptions(service=...))")
    p.add_argument("--listen", default="127.0.0.1:5555",
                   help="HOST:PORT to listen on (0.0.0.0 for every interface; port 0: any free one)")
    p.add_argument("--workers", type=arg.positive, default=max(1, len(os.sched_getaffinity(0))),
                   help="batches decoded at once, one core each (default: this process's cores)")
    p.add_argument("--queue", type=arg.count, default=0, help="requests waiting for a worker (default: 2 per worker); "
                   "past it, trainers are told the server is busy")
    p.add_argument("--max-request", type=arg.size, default=512 << 20, help="largest request taken, e.g. 512MB")
    p.add_argument("--log-every", type=arg.above_zero, default=60.0, help="seconds between log lines")
    p.set_defaults(func=cmd_serve)

    p = command("inspect", help="format, shards, samples, bytes, classes, per-field sizes")
    p.add_argument("dataset", type=arg.path, help="dataset directory, or s3:// or http(s):// prefix")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--no-scan", action="store_true", help="manifest only; skip per-field sizes")
    p.set_defaults(func=cmd_inspect)

    p = command("verify", help="check checksums and sample counts (and with --decode, every image)")
    p.add_argument("dataset", type=arg.path, help="dataset directory, or s3:// or http(s):// prefix")
    p.add_argument("--decode", action="store_true", help="also decode every image (slower)")
    p.add_argument("--stage-dir", type=arg.local, default=None,
                   help="check this dataset's copies staged there instead, named as the job named it ({node}: every "
                        "node's this machine sees)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_verify)
    return parser, sub
