"""Projecting an epoch to cluster scale: an explicit cost model fed with figures measured per rank.

Every stage of the pipeline overlaps with the others (bounded queues), so an epoch takes as long as
its slowest stage, and the step waits for the difference:

    T_epoch = max(T_compute, T_fetch, T_exchange, T_prep)      stall = 1 - T_compute / T_epoch

with, for D images of s bytes on N nodes of G ranks (R = N G), batch b, step time t:

- T_compute  = (D / R) / b * t
- T_prep     = (D / R) / p                      p: images/s one rank decodes (measured)
- T_fetch    = D s / B_fs                       reading the shared file system (aggregate B_fs), or,
               (D s / N) / B_local             staged, from the second epoch, when a node's share
                                                 (D s / N) fits its local storage; the first epoch
                                                 still reads the source
- T_exchange = k R alpha + Q (D s / N) f / beta the alpha-beta model (Hockney): k rounds of an
                                                 all-to-all among R ranks, each message paying the
                                                 latency alpha, and the bytes leaving a node
                                                 (a fraction f = (R - G) / (R - 1) of what it
                                                 exchanges) crossing its link at beta bytes/s

``global`` shuffling reads each sample on its own: every image also pays ``open_latency`` on the
shared file system, divided over the R ranks reading in parallel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..shufflers import compared_modes, get_shuffler


@dataclass(frozen=True)
class Cluster:
    nodes: int
    gpus_per_node: int = 4
    fs_bandwidth: float = 10e9  # bytes/s, the shared file system's aggregate
    open_latency: float = 2e-3  # seconds a random read of one sample pays on the shared file system
    local_bandwidth: float = 3e9  # bytes/s per node, node-local storage
    local_capacity: float = 3.8e12  # bytes per node
    link_bandwidth: float = 25e9  # bytes/s per node (beta)
    link_latency: float = 5e-6  # seconds per message (alpha)


@dataclass(frozen=True)
class Workload:
    images: int  # D
    image_bytes: float  # s, the mean encoded size
    batch_size: int  # per rank
    step_time: float  # seconds per step (the model's)
    decode_rate: float  # images/s one rank decodes (measured with ddpipe bench)
    shuffle: str = "partial"
    exchange_fraction: float = 0.3
    round_size: int = 512


@dataclass(frozen=True)
class Projection:
    nodes: int
    ranks: int
    staging: bool
    compute: float
    prep: float
    fetch: float
    exchange: float

    @property
    def epoch(self) -> float:
        return max(self.compute, self.prep, self.fetch, self.exchange)

    @property
    def stall(self) -> float:
        return 1 - self.compute / self.epoch if self.epoch else 0.0

    @property
    def bottleneck(self) -> str:
        times = {"step": self.compute, "decode": self.prep, "fetch": self.fetch, "exchange": self.exchange}
        return max(times, key=lambda k: times[k])


def project(cluster: Cluster, work: Workload, *, staging: bool, later_epoch: bool = True) -> Projection:
    """One epoch's figures; ``later_epoch``: the second or later (staged copies reused)."""
    n, g = cluster.nodes, cluster.gpus_per_node
    r = n * g
    per_rank = work.images / r
    share_bytes = work.images * work.image_bytes / n
    compute = per_rank / work.batch_size * work.step_time
    prep = per_rank / work.decode_rate
    mode = get_shuffler(work.shuffle)
    if mode.random_access:
        fetch = work.images * work.image_bytes / cluster.fs_bandwidth + work.images * cluster.open_latency / r
    elif staging and later_epoch and share_bytes <= cluster.local_capacity:
        fetch = share_bytes / cluster.local_bandwidth
    else:
        fetch = work.images * work.image_bytes / cluster.fs_bandwidth
    exchange = 0.0
    if mode.exchanges and r > 1 and work.exchange_fraction > 0:
        rounds = max(1.0, per_rank / work.round_size)
        leaving = (r - g) / (r - 1)
        exchange = rounds * (r - 1) * cluster.link_latency + \
            work.exchange_fraction * share_bytes * leaving / cluster.link_bandwidth
    return Projection(n, r, staging, compute, prep, fetch, exchange)


def projection_table(cluster: Cluster, work: Workload, nodes: list[int]) -> tuple[list[dict[str, Any]], str]:
    """Rows (and a printed table) for each scale, with and without staging, for each shuffle mode."""
    rows: list[dict[str, Any]] = []
    for n in nodes:
        c = Cluster(**{**cluster.__dict__, "nodes": n})
        for shuffle in (m for role in ("start", "between", "end") for m in compared_modes(role)):
            w = Workload(**{**work.__dict__, "shuffle": shuffle})
            for staging in (False, True):
                if get_shuffler(shuffle).random_access and staging:
                    continue  # random access reads the whole dataset: a node's share is not what it reads
                p = project(c, w, staging=staging)
                rows.append({"nodes": n, "gpus": p.ranks, "shuffle": shuffle, "staging": staging,
                             "epoch_s": p.epoch, "stall": p.stall, "bottleneck": p.bottleneck,
                             "compute_s": p.compute, "fetch_s": p.fetch, "exchange_s": p.exchange, "prep_s": p.prep})
    head = f"{'nodes':>6}{'GPUs':>7}  {'shuffle':<8}{'staged':<8}{'epoch s':>9}{'stall':>7}  bottleneck"
    lines = [head] + [f"{r['nodes']:>6}{r['gpus']:>7}  {r['shuffle']:<8}{'yes' if r['staging'] else 'no':<8}"
                      f"{r['epoch_s']:>9.1f}{100 * float(r['stall']):>6.0f}%  {r['bottleneck']}" for r in rows]
    return rows, "\n".join(lines)
