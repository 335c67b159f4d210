"""``ddpipe convert``: write any source as shards of any format, resumably and deterministically.

The layout (which items go to which shard) is a pure function of the source listing and the
options, so it is the same on every rank and every rerun. Each shard is written atomically, and a
small record of it goes to ``OUT/.ddpipe-convert/`` only once it is committed; a rerun with the
same arguments keeps the shards whose records and checksums hold and writes the rest. The manifest
is written last, so a dataset becomes visible only when complete.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import xxhash

from ..comm import Comm, init_comm
from ..decode.spec import ON_ERROR
from ..errors import ConversionConflictError, DdpipeError, OptionError, SourceError
from ..fields import bytes_option, local_path_option, refuse_non_boolean_flags, seed_option, whole_option
from ..formats import FORMAT_NAMES, get_format
from ..formats.atomic import atomic_write_bytes
from ..manifest import MANIFEST_NAME, Manifest, find_manifest, load_manifest, save_manifest
from ..storage import ObjectStorage, is_remote, open_storage
from ..storage.location import is_web
from ..workers import end_if_importing_parents_script
from . import to_objects
from .adopt import refuse_unwritable_out
from .imagenet import imagenet_val_source
from .layout import pack_shards, sample_order
from .shard_job import ShardJob, ShardResult
from .shard_runner import run_jobs
from .sources import Source, SourceItem, open_source

STATE_DIR = ".ddpipe-convert"
PLAN_FILE = "plan.json"
SENT_DIR = "sent"  # into a bucket: what each shard's upload left there (to_objects.ShardSender)


@dataclass(frozen=True)
class ConvertOptions:
    """How to convert. Without a shard size, a dataset source keeps its shard boundaries and any
    other source gets 256 MB shards."""

    format: str = "wds"
    shard_bytes: int | None = None  # or its text, "256MB"
    samples_per_shard: int | None = None
    seed: int | None = None
    workers: int = 1
    on_error: Literal["fail", "skip"] = "fail"
    progress: bool = True
    prefix: str = "shard"
    # decode every image fully, so that one cut short is caught here rather than hours into training
    decode_check: bool = True
    # a conversion that skipped every input writes an empty dataset, and an ImageFolder's class directory
    # without images is a class of no samples (a held-out tree's, kept for its labels), not an error
    allow_empty: bool = False
    val_labels: str | None = None  # ImageNet's validation ground truth, for its flat directory (imagenet.py)
    synsets: str | None = None  # the synset list that maps the devkit's class ids

    def __post_init__(self) -> None:
        refuse_non_boolean_flags(self)
        if self.format not in FORMAT_NAMES:
            raise OptionError(f"format must be one of {', '.join(FORMAT_NAMES)}, not {self.format!r}")
        if self.on_error not in ON_ERROR:
            raise OptionError(f"on_error must be one of {', '.join(ON_ERROR)}, not {self.on_error!r}")
        if self.shard_bytes is not None:  # or its text, "256MB", as the command line takes it
            object.__setattr__(self, "shard_bytes", bytes_option(self.shard_bytes, "shard_bytes"))
        if self.samples_per_shard is not None:
            whole_option(self.samples_per_shard, "samples_per_shard", least=1)
        if self.shard_bytes is not None and self.samples_per_shard is not None:
            raise OptionError("give shard_bytes or samples_per_shard, not both")
        whole_option(self.workers, "workers", least=1)
        if self.seed is not None:
            seed_option(self.seed)
        for name in ("val_labels", "synsets"):  # Path() made "." of "" and a local "s3:/b/x" of a URL
            given = getattr(self, name)
            if given is not None:
                local_path_option(given, name, "a file on this machine")
        if self.synsets is not None and self.val_labels is None:  # passed over in silence, as the CLI refuses
            raise OptionError("synsets takes effect only with val_labels (ImageNet's validation ground truth)")

    def layout_args(self) -> dict[str, object]:
        """The options that decide the output bytes (and so the resume fingerprint)."""
        return {"format": self.format, "shard_bytes": self.shard_bytes, "samples_per_shard": self.samples_per_shard,
                "seed": self.seed, "on_error": self.on_error, "prefix": self.prefix,
                "decode_check": self.decode_check}


def _hash(*parts: object) -> str:
    h = xxhash.xxh3_128()
    for part in parts:
        h.update(json.dumps(part, sort_keys=True).encode())
    return h.hexdigest()


@dataclass(frozen=True)
class ConversionPlan:
    """What a conversion writes, the same on every rank and every rerun: the source's items in the
    order written, the shards' ranges of them, and the fingerprints that say which input and
    arguments made it."""

    source: Source
    options: ConvertOptions
    items: list[SourceItem]
    ranges: list[tuple[int, int]]
    # what a resumed run must share with the interrupted one: options, layout, keys and labels; file
    # sizes are left to each shard's own fingerprint, so fixing one bad input redoes only its shard
    plan_fingerprint: str
    fingerprint: str  # the whole input, recorded in the manifest

    @classmethod
    def of(cls, source: Source, options: ConvertOptions) -> ConversionPlan:
        order = sample_order(len(source.items), options.seed)
        items = [source.items[i] for i in order]
        if source.kind == "dataset" and options.shard_bytes is None and options.samples_per_shard is None \
                and options.seed is None:
            ranges = list(source.shard_ranges)
        else:
            ranges = pack_shards([it.size for it in items], shard_bytes=options.shard_bytes,
                                 samples_per_shard=options.samples_per_shard)
        listing = [(it.key or it.path, it.index, it.label) for it in items]
        content = source.identity if source.kind == "dataset" else ""
        plan = _hash({"kind": source.kind, **options.layout_args()}, ranges, listing, content)
        return cls(source, options, items, ranges, plan, _hash(plan, source.identity))

    def jobs(self, out: Path, state: Path) -> list[ShardJob]:
        """A job for each shard, writing it in ``out`` and its record in ``state``."""
        o = self.options
        suffix = get_format(o.format).suffix
        jobs = []
        for i, (a, b) in enumerate(self.ranges):
            shard, name = tuple(self.items[a:b]), f"{o.prefix}-{i:06d}"
            fingerprint = _hash(self.plan_fingerprint, [(it.path, it.size) for it in shard])
            jobs.append(ShardJob(self.source.kind, self.source.root, shard, str(out / f"{name}{suffix}"),
                                 str(state / f"{name}.json"), o.format, o.on_error, fingerprint, o.decode_check))
        return jobs

    def manifest(self, done: list[ShardResult], out: Path) -> Manifest:
        """The manifest of the shards ``done`` (one result a job, in order)."""
        skipped = self.source.skipped + tuple(s for r in done for s in r.skipped)
        if not any(r.shard is not None for r in done) and not self.options.allow_empty:
            example = f", e.g. {skipped[0].path}: {skipped[0].error}" if skipped else ""
            raise SourceError(f"every input was skipped ({len(skipped)}): no dataset written{example}", path=out)
        return Manifest(format=self.options.format, fields=tuple(sorted({f for r in done for f in r.fields})),
                        classes=self.source.classes, shards=tuple(r.shard for r in done if r.shard is not None),
                        skipped=skipped, origin={"fingerprint": self.fingerprint})

    def refuse_other_input(self, existing: Manifest, where: str | Path) -> None:
        """A dataset found at the output was made from this input and these arguments, or is refused."""
        if existing.origin.get("fingerprint") != self.fingerprint:
            raise ConversionConflictError("already holds a dataset made from other input or arguments; "
                                          "choose another output", path=where)


def _all_ranks(comm: Comm, action: Callable[[], object]) -> None:
    """Run ``action``, then agree across ranks: if any rank failed, every rank raises its message.

    A failure on one rank must not leave the others waiting forever in a later collective.
    """
    error: str | None = None
    caught: BaseException | None = None
    try:
        action()
    except (DdpipeError, OSError) as e:
        error, caught = str(e), e
    errors = comm.allgather(error)
    if caught is not None:
        caught.job_wide = True  # type: ignore[attr-defined]  # every rank raises it: nothing to abort
        raise caught
    for rank, message in enumerate(errors):
        if message is not None:
            raise DdpipeError(f"rank {rank} failed: {message}").everywhere()


def _see_what_rank_0_made(out: Path, made: tuple[Path, ...], host: str, patience: float = 5.0) -> None:
    """The ranks write one dataset in ``out``: each must see there what rank 0 found or made (``made``, one of
    them), or it would write its shards where rank 0 never looks. On a node-local path of each node, those
    of the other nodes failed writing their first shard's record, naming only that file. A shared file system
    may show another client's new file late: it is looked for again, for ``patience`` seconds."""
    import time

    deadline = time.monotonic() + patience
    while not any(path.exists() for path in made):
        if time.monotonic() > deadline:
            raise DdpipeError(f"not seen{f' from {host}' if host else ''} as rank 0 left it (with "
                              f"{' or '.join(p.name for p in made)}): give an output every node sees (a shared file "
                              "system), or an s3:// prefix", path=out)
        time.sleep(0.1)


def convert(
    src: str | os.PathLike[str],
    out: str | os.PathLike[str],
    options: ConvertOptions | None = None,
    comm: Comm | None = None,
) -> Manifest:
    """Convert ``src`` (ImageFolder tree, list file or dataset) into a dataset at ``out``.

    Under MPI, rank r writes shards r, r + size, ... and rank 0 writes the manifest.
    """
    end_if_importing_parents_script()  # a worker spawned by an earlier convert() of an unguarded script
    options = options or ConvertOptions()
    comm = comm or init_comm()
    _refuse_paths(src, out)
    plan = ConversionPlan.of(_source_of(src, options), options)
    objects = open_storage(str(out)) if is_remote(out) else None
    if objects is not None:  # written here, then uploaded (to_objects.py)
        existing = find_manifest(objects)
        if existing is not None:
            plan.refuse_other_input(existing, objects.url())
            return existing
        out = to_objects.work_dir(objects)
        out.mkdir(parents=True, exist_ok=True)  # on every node: each writes its ranks' shards
    out = Path(out)
    root = plan.source.root
    if plan.source.kind == "imagefolder" and out.resolve().is_relative_to(Path(root).resolve()):
        # its shards would be a class of the tree's next conversion (and name clashes within it)
        raise ConversionConflictError(f"is inside the ImageFolder it would be made from ({root}): "
                                      "choose an output outside it", path=out)
    if plan.source.kind == "dataset" and not is_remote(root) and out.resolve() == Path(root).resolve():
        # refused anyway (its manifest is not this conversion's), but as "made from other input"
        raise ConversionConflictError("is the dataset it would be converted from: a conversion writes a new "
                                      "dataset, choose another output", path=out)
    state = out / STATE_DIR
    _all_ranks(comm, lambda: _claim(out, state, plan) if comm.world.rank == 0 else None)
    if objects is None:  # into a bucket, each node writes in a work directory of its own (to_objects.py)
        _all_ranks(comm, lambda: _see_what_rank_0_made(out, (out / MANIFEST_NAME, state / PLAN_FILE),
                                                       comm.world.host))
        if (out / MANIFEST_NAME).exists():  # converted before with the same arguments
            return load_manifest(out)
    # into a bucket: a conversion written here before, whose upload stopped, is only sent again
    written = objects is not None and any(comm.allgather((out / MANIFEST_NAME).exists()))
    made = None if written else _write(plan, out, state, objects, comm)
    if objects is None:
        return made if made is not None else load_manifest(out)
    if made is None and (out / MANIFEST_NAME).exists():
        made = load_manifest(out)
    return _publish(objects, out, made, comm)


def _refuse_paths(src: str | os.PathLike[str], out: str | os.PathLike[str]) -> None:
    """Paths no conversion can use, refused before the source is listed and read."""
    for named, given in (("src", src), ("out", out)):
        if isinstance(given, str) and not given.strip():  # Path("") is the working directory
            raise OptionError(f"convert's {named} is an empty path: name a directory")
    if is_web(out):
        raise OptionError("a web server is read-only to ddpipe: convert into a directory or an s3:// prefix", path=out)
    if not is_remote(out) and not (Path(out) / MANIFEST_NAME).exists():  # a finished one is only read again
        refuse_unwritable_out(Path(out), role="the output")


def _source_of(src: str | os.PathLike[str], options: ConvertOptions) -> Source:
    """The source at ``src``: ImageNet's flat validation directory where its ground truth is given."""
    if options.val_labels is not None:
        if is_remote(src):
            raise OptionError("ImageNet's validation ground truth (--val-labels) goes with its flat validation "
                              "directory on a local disk, not a URL", path=src)
        source = imagenet_val_source(Path(src), Path(options.val_labels),
                                     None if options.synsets is None else Path(options.synsets))
    else:
        source = open_source(src)
    if source.empty_classes and not options.allow_empty:
        raise SourceError(f"class directories without images: {', '.join(source.empty_classes)}; each would still "
                          "take a label, and every class after it another label than a tree without it gives "
                          "(torchvision's ImageFolder refuses them too): remove them, or --allow-empty keeps them "
                          "as classes of no samples", path=source.root)
    return source


def _claim(out: Path, state: Path, plan: ConversionPlan) -> None:
    """Rank 0's look at the output: a dataset this conversion made, or its unfinished record in
    ``state``, or nothing, where the record is started; anything else is refused."""
    if (out / MANIFEST_NAME).exists():
        plan.refuse_other_input(load_manifest(out), out)
        return
    if state.is_dir():
        record = json.loads((state / PLAN_FILE).read_text()) if (state / PLAN_FILE).exists() else {}
        if record.get("fingerprint") != plan.plan_fingerprint:
            raise ConversionConflictError("holds an unfinished conversion with other input or arguments; rerun that "
                                          f"command, or remove {out} to start over", path=out)
        return
    if out.exists() and any(out.iterdir()):
        raise ConversionConflictError("output directory is not empty and holds no ddpipe conversion", path=out)
    state.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(state / PLAN_FILE, json.dumps({"fingerprint": plan.plan_fingerprint}).encode())


def _write(plan: ConversionPlan, out: Path, state: Path, objects: ObjectStorage | None, comm: Comm) -> Manifest | None:
    """Each rank's shards written (into a bucket: each sent as it is finished), then rank 0's manifest,
    which it returns (the other ranks None)."""
    options, world = plan.options, comm.world
    jobs = plan.jobs(out, state)
    mine = list(range(world.rank, len(jobs), world.size))
    results: dict[int, ShardResult] = {}
    progress = f"convert -> {options.format}" if options.progress and world.rank == 0 else None

    def write() -> None:
        if objects is None:
            results.update(run_jobs(jobs, mine, options.workers, progress))
            return
        # into a bucket: each shard sent as it is finished and removed here; one sent before is not written
        with to_objects.ShardSender(objects, out, get_format(options.format), state / SENT_DIR) as sender:
            results.update({i: r for i in mine if (r := sender.sent_before(jobs[i])) is not None})
            rest = [i for i in mine if i not in results]
            results.update(run_jobs(jobs, rest, options.workers, progress, sender.send))

    _all_ranks(comm, write)
    gathered = comm.allgather(results)
    finished: list[Manifest] = []

    def finish() -> None:
        if world.rank != 0:
            return
        merged = {i: r for part in gathered for i, r in part.items()}
        manifest = plan.manifest([merged[i] for i in range(len(jobs))], out)
        save_manifest(out, manifest)
        shutil.rmtree(state, ignore_errors=True)
        finished.append(manifest)

    _all_ranks(comm, finish)
    return finished[0] if finished else None


def _publish(objects: ObjectStorage, out: Path, made: Manifest | None, comm: Comm) -> Manifest:
    """Into a bucket: the shards each rank left in ``out``, then (rank 0) the manifest, ``made`` on
    rank 0; a failure is every rank's. ``out``, a work directory, is removed."""
    manifest, run = to_objects.agreed_manifest(objects, made, comm)
    _all_ranks(comm, lambda: to_objects.send_leftovers(objects, out, manifest, run))

    def publish() -> None:
        if comm.world.rank == 0:
            to_objects.publish_manifest(objects, manifest, out)

    _all_ranks(comm, publish)
    shutil.rmtree(out, ignore_errors=True)
    return manifest
