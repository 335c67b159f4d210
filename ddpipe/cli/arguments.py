"""What the commands' arguments share: their types, each reading one value and refusing, as that
argument's usage error, what the command cannot take (argparse names the argument: ``argument --lr:
must be more than 0, not -1``) before any work starts; and the help of options several commands take."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from ..decode.spec import MAX_PIXELS
from ..errors import OptionError

# the help of options several commands share
SHUFFLE_HELP = ("partial: each rank shuffles what it reads and exchanges a fraction Q of it across the job; "
                "local: within each rank only; global: one permutation of the dataset (random reads); "
                "none: stored order")
EXCHANGE_HELP = "partial shuffle: the fraction Q of each rank's samples exchanged with other ranks (0 to 1)"
ASSIGNMENT_HELP = ("sticky: each rank reads the same shards every epoch (node-local copies are reused); "
                   "rotate: new ones each epoch")
DECODE_HELP = ("dali-gpu, dali-cpu or pil (auto: the GPU where CUDA and DALI are present, else DALI on the CPU, "
               "else PIL)")
IMAGE_SIZE_HELP = "side of the square images in a batch, in pixels"
SEED_HELP = "the epoch plan's seed: shard order, shuffles and augmentation"
# ddpipe.train.models.MODELS' names, written out: that module loads torch (tests/train/test_models.py: in step)
MODEL_NAMES = ("resnet18", "resnet34", "resnet50", "resnet101", "smallcnn")
MODELS_HELP = f"{', '.join(MODEL_NAMES[:-1])} or {MODEL_NAMES[-1]}"


def addresses(text: str) -> list[str]:
    """A comma-separated list of decode servers: at least one (``--decode-service ,`` said none, and
    the job decoded here without a word)."""
    given = [a for a in text.split(",") if a.strip()]
    if not given:
        raise argparse.ArgumentTypeError(f"no server address in {text!r}: give HOST:PORT[,HOST:PORT...]")
    return given


def model(text: str) -> str:
    """A model's name, refused as the usage error it is: it was the job's error once ranks were launched
    and the dataset read, after the training banner (exit 1, not a usage error's 2)."""
    if text not in MODEL_NAMES:
        raise argparse.ArgumentTypeError(f"unknown model {text!r}: choose {MODELS_HELP}")
    return text


def path(text: str) -> str:
    """A path (or a URL: left as it is), ``~`` expanded as the shell expands it, since the shell does not
    after ``--option=`` or in quotes: ``--local-dir=~/stage`` made a directory named ``~`` in the
    working directory. An empty one (``"$DATA"`` with the variable unset) is refused: ``Path("")`` is the
    working directory, which was converted, read or written as if named."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path (a variable not set?)")
    return os.path.expanduser(text)


def local(text: str) -> str:
    """A path on this machine, for an option that takes no URL: Path("s3://b/x") is "s3:/b/x", and a
    directory of that name was made in the working directory (a checkpoint, a stage, a report...)."""
    from ..storage.location import is_remote

    if is_remote(text):
        raise argparse.ArgumentTypeError(f"{text}: takes a path on this machine, not an object store's URL")
    return path(text)


def local_path(text: str) -> Path:
    return Path(local(text))


def plot_file(text: str) -> str:
    """A figure's file: its suffix names a format matplotlib writes (it chooses by the suffix, and
    adds ``.png`` to a name without one), checked before the run whose end it would have failed."""
    named = local(text)
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        raise argparse.ArgumentTypeError("needs matplotlib: pip install matplotlib") from None
    suffix = Path(named).suffix.lower().removeprefix(".")
    if suffix not in FigureCanvasBase.get_supported_filetypes():
        raise argparse.ArgumentTypeError(f"{text}: name a file ending .png, .svg or .pdf (the suffix chooses the "
                                         "format)")
    return named


def size(text: str) -> int:
    from ..convert.layout import parse_size

    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def source_limits(text: str) -> str:
    """A slow source's model, ``100MB/s,5ms``, checked and kept as written (``ReadOptions`` takes it
    so, and ``bench --json`` records it); given by the option or, where it is not, by the environment,
    which the error then names (argparse reads a default of text with this type too)."""
    from ..throttle import ENV_VAR, SourceLimits

    try:
        SourceLimits.parse(text)
        return text
    except (ValueError, OptionError) as e:
        given = f" (the value of ${ENV_VAR})" if os.environ.get(ENV_VAR) == text else ""
        raise argparse.ArgumentTypeError(f"{e}{given}") from None


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 <= value < float("inf"):  # inf slept forever, or raised OverflowError's traceback
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds, a finite number, not {text}")
    return value


def finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not -float("inf") < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number, not {text}")
    return value


def at_least_zero(text: str) -> float:
    """A finite number, 0 or more (a learning rate's warm-up, a rate where 0 means "measure it")."""
    value = finite(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text}")
    return value


def above_zero(text: str) -> float:
    """A finite number more than 0 (a learning rate, seconds between log lines)."""
    value = finite(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, not {text}")
    return value


def whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None


def positive(text: str) -> int:
    value = whole(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def image_size(text: str) -> int:
    """The side of a batch's square images: at least 1, and no image made larger than any image read
    may be (it was refused once the job had started, in DecodeOptions' words: "size 100000 makes
    images ... more than max_pixels allows")."""
    value = positive(text)
    if value ** 2 > MAX_PIXELS:
        raise argparse.ArgumentTypeError(f"must be at most {math.isqrt(MAX_PIXELS)}, not {text}: an image "
                                         f"{value} pixels square is more than any image read may have "
                                         f"({MAX_PIXELS:,} pixels)")
    return value


def node_counts(text: str) -> tuple[int, ...]:
    """--project's cluster sizes, ``nodes=1,8,64`` (or ``1,8,64``): read now, not after the benchmark."""
    try:
        nodes = tuple(int(n) for n in text.removeprefix("nodes=").split(",") if n.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"give node counts as nodes=1,8,64, not {text!r}") from None
    if not nodes or min(nodes) < 1:
        raise argparse.ArgumentTypeError(f"give node counts of at least 1, as nodes=1,8,64, not {text!r}")
    return nodes


def jpeg_quality(text: str) -> int:
    value = whole(text)
    if not 1 <= value <= 100:  # PIL takes more, and writes what 100 writes
        raise argparse.ArgumentTypeError(f"must be 1 to 100, not {text}")
    return value


def count(text: str) -> int:
    """A whole number, 0 or more (steps between checkpoints, where 0 says "never"; a buffer's size)."""
    value = whole(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text}")
    return value


def fraction(text: str) -> float:
    """A share of something, in [0, 1] (the fraction of samples a partial shuffle exchanges)."""
    value = finite(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], not {text}")
    return value
