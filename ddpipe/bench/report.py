"""``ddpipe bench``'s output for people: the table, and the chart of stages and stall."""

from __future__ import annotations

import os
from typing import Any

from .figures import BenchReport


def format_report(report: BenchReport) -> str:
    lines = [f"{'stage':<16}{'images/s':>10}{'MB/s':>9}{'seconds':>9}",
             *(f"{s.name:<16}{s.images_per_s:>10.0f}{s.mb_per_s:>9.1f}{s.seconds:>9.2f}" for s in report.stages),
             "",
             f"epoch {report.epoch_seconds:.2f} s on {report.world_size} rank(s), {report.images} images, "
             f"step {report.step}: stall {100 * report.stall:.0f}% (fetch {100 * report.fetch_stall:.0f}%, "
             f"prep {100 * report.prep_stall:.0f}%)",
             f"bottleneck: {report.bottleneck}; the pipeline could feed {report.max_feed_images_per_s:.0f} images/s, "
             f"the step takes {report.step_images_per_s:.0f} images/s",
             f"overlap {100 * report.overlap:.0f}%: the epoch took {report.epoch_seconds:.2f} s; the step alone "
             f"{report.compute_seconds:.2f} s, the pipeline alone {report.feed_seconds:.2f} s (side by side "
             f"{report.side_by_side_seconds:.2f} s, in turns {report.in_turns_seconds:.2f} s)"]
    if report.service:
        s = report.service
        batches = s["remote_batches"] + s["local_batches"]
        decode, transfer = report.served_split
        per = 1000 / max(s["remote_batches"], 1)
        lines.append(f"decode service ({len(s['servers'])} server(s)): {s['remote_batches']} of {batches} batches "
                     f"decoded there, {s['local_batches']} here; a batch took {s['server_seconds'] * per:.0f} ms "
                     f"decoding on a server, {s['transfer_seconds'] * per:.0f} ms in transfer and queueing")
        lines.append(f"stall split: fetch {100 * report.fetch_stall:.0f}%, decode {100 * decode:.0f}%, "
                     f"transfer {100 * transfer:.0f}%; step {100 * (1 - report.stall):.0f}% of the epoch")
    if len(report.epochs) > 1:
        lines.append("epochs (s): " + ", ".join(f"{e:.2f}" for e in report.epochs))
    full = [r for r in report.per_rank if r.get("stage") == "full"]
    for r, felt in zip(full, report.latency, strict=True):
        wait = 100 * r["wait"] / r["seconds"] if r["seconds"] else 0.0
        lines.append(f"  rank {int(r['rank'])}: {int(r['steps'])} steps, {r['seconds']:.2f} s, data wait {wait:.0f}%"
                     + latency(felt))
    if report.compare:
        ours = report.decode_images_per_s
        lines += ["", "compare: the same data, transform, batch and cores per rank (ddpipe = its read+decode stage)",
                  f"  {'pipeline':<42}{'images/s':>10}{'ddpipe / it':>13}",
                  f"  {'ddpipe read+decode':<42}{ours:>10.0f}{1.0:>13.2f}"]
        for c in report.compare:
            rate = c["images_per_s"]
            ratio = f"{ours / rate:>13.2f}" if rate else f"{c.get('note', '-'):>13}"
            lines.append(f"  {c['pipeline']:<42}{rate:>10.0f}{ratio}")
    return "\n".join(lines)


def latency(felt: dict[str, Any]) -> str:
    """A rank's :func:`~ddpipe.bench.figures.rank_latency` in words."""
    if felt["first_batch_s"] is None:
        return ""
    text = f"; first batch {1000 * felt['first_batch_s']:.1f} ms"
    if felt["later_first_batch_s"] is not None:
        text += f" (later epochs {1000 * felt['later_first_batch_s']:.1f} ms)"
    if felt["wait_p50_s"] is not None:
        text += (f", then waits p50 {1000 * felt['wait_p50_s']:.1f} ms, p99 {1000 * felt['wait_p99_s']:.1f} ms, "
                 f"max {1000 * felt['wait_max_s']:.1f} ms")
    return text


def plot_report(report: BenchReport, path: str | os.PathLike[str]) -> None:
    """Throughput by stage, against what the step consumes; and each rank's data wait through the epoch."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        from ..errors import DdpipeError

        raise DdpipeError("--plot needs matplotlib: pip install matplotlib") from e
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    names = [s.name for s in report.stages] + [f"peer: {c['peer']}" for c in report.compare]
    rates = [s.images_per_s for s in report.stages] + [c["images_per_s"] for c in report.compare]
    colors = ["#c44e52" if n == report.bottleneck else "#999999" if n.startswith("peer") else "#4c72b0" for n in names]
    left.barh(names, rates, color=colors)
    left.invert_yaxis()  # the pipeline's stages in order from the top, the peers below them
    left.axvline(report.step_images_per_s, color="black", linestyle="--", label="the step consumes")
    # a log axis: the read stage runs orders of magnitude faster than decoding, and on a linear one the
    # decoding stages and the peers were slivers beside it
    left.set_xscale("log")
    left.set_xlabel("images/s (whole job, log scale)")
    left.set_title(f"throughput by stage (bottleneck: {report.bottleneck})")
    # below the axes, where no bar can be under it (inside, it covered the read bar)
    left.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), frameon=False)
    for r in report.per_rank:
        if r.get("stage") == "full" and r.get("waits"):
            waits = [1000 * w for w in r["waits"]]
            right.plot(range(1, len(waits) + 1), waits, marker=".", label=f"rank {int(r['rank'])}")
    right.xaxis.get_major_locator().set_params(integer=True)
    right.set_xlabel("step")
    right.set_ylabel("data wait per step (ms)")
    right.set_title(f"stall over the epoch: {100 * report.stall:.0f}% (fetch {100 * report.fetch_stall:.0f}%, "
                    f"prep {100 * report.prep_stall:.0f}%)")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
