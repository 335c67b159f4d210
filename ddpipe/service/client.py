"""The trainer's side of the decode service: a :class:`~ddpipe.decode.output.Decoder` that sends
each encoded batch to a decode server and yields the decoded batches in the stream's order.

Batches go to the live server with the most room (each takes as many at once as it has decoding
slots, plus one queued), so a trainer keeps every server busy and holds a bounded number of
batches: in flight, and decoded but waiting for an earlier one. A server that disconnects, or
stays silent past ``service_timeout`` with batches outstanding, is dropped and its batches sent to
another, or decoded here when no server is left (a warning, once); a server that comes back is
greeted and used again. Whatever decodes a batch, it is the same batch: decoding is a function of
(bytes, seed, epoch, index, transform), and here falls back on the decoder the servers use.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
import time
import warnings
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from ..decode.ring import BatchRing
from ..errors import DdpipeError
from . import wire
from .transport import Link, Links

if TYPE_CHECKING:
    from ..decode.batches import EncodedBatch, OnBad
    from ..decode.output import Batch, Decoder
    from ..decode.spec import DecodeOptions


@dataclass
class ServiceStats:
    """What the servers and this process decoded, and where the time went (summed over batches)."""

    remote_batches: int = 0
    local_batches: int = 0
    by_server: dict[str, int] = field(default_factory=dict)
    server_seconds: float = 0.0  # decoding, as the servers timed it
    round_trip_seconds: float = 0.0  # sent to received: decoding, queueing and transfer
    bytes_received: int = 0
    servers_lost: int = 0

    @property
    def transfer_seconds(self) -> float:
        """Round trips less the servers' decoding: the wire, and waiting in the servers' queues."""
        return max(0.0, self.round_trip_seconds - self.server_seconds)


@dataclass
class _Server:
    link: Link
    state: str = "down"  # down (no connection) -> greeting (hello sent) -> live; silent: stopped answering
    slots: int = 0
    capped: int | None = None  # after a "busy": no more in flight than this until a batch returns
    inflight: set[int] = field(default_factory=set)  # request ids
    last_heard: float = 0.0
    hello_at: float = 0.0

    @property
    def depth(self) -> int:
        """Batches kept at a server: one per slot being decoded, and one queued to start at once
        (benchmarks/decode_service.py's trainer ran as fast with one more per slot)."""
        return self.slots + 1

    @property
    def room(self) -> int:
        cap = self.depth if self.capped is None else self.capped
        return cap - len(self.inflight) if self.state == "live" else 0


@dataclass
class _Sent:
    seq: int
    batch: EncodedBatch
    server: _Server
    at: float


class ServiceDecoder:
    """Decodes on the servers of ``options.service`` with ``kind`` (``"dali-cpu"`` or ``"pil"``);
    decodes here with the same decoder where none answers."""

    def __init__(self, options: DecodeOptions, batch_size: int, device: torch.device, kind: str) -> None:
        if kind not in wire.SERVED_DECODERS:
            raise DdpipeError(f"a decode service decodes with {' or '.join(wire.SERVED_DECODERS)}, not {kind}")
        self.options, self.batch_size, self.device, self.kind = options, batch_size, device, kind
        self.stats = ServiceStats()
        # batches bound for a CUDA device land in pinned memory first, and go on without waiting
        self.ring = BatchRing(options, device) if device.type == "cuda" else None
        self._links: Links | None = None  # made in the thread that decodes (ZeroMQ sockets stay in one)
        self._servers: list[_Server] = []
        self._local: Decoder | None = None
        self._warned = False
        self._ids = itertools.count()
        self.connected_at = 0.0

    def close(self) -> None:
        if self._links is not None:
            self._links.close()
            self._links = None
            self._servers = []
        if self._local is not None:
            self._local.close()
            self._local = None

    def _connect(self) -> None:
        if self._links is None:
            self._links = Links()
            self._servers = [_Server(self._links.open(address)) for address in self.options.service]
            self.connected_at = time.monotonic()

    def decode(self, batches: Iterator[EncodedBatch], seed: int, epoch: int, on_bad: OnBad) -> Iterator[Batch]:
        self._connect()
        run = _Run(self, batches, seed, epoch, on_bad)
        yield from run

    # what a run needs of the decoder
    @property
    def timeout(self) -> float:
        return self.options.service_timeout

    def local_decode(self, batch: EncodedBatch, seed: int, epoch: int, on_bad: OnBad) -> Batch:
        if self._local is None:
            from ..decode.output import make_decoder

            here = dataclasses.replace(self.options, service=())
            self._local = make_decoder(self.kind, here, self.batch_size, self.device)
        if not self._warned:
            self._warned = True
            names = ", ".join(s.link.endpoint for s in self._servers)
            print(f"ddpipe: warning: no decode server answers ({names}): decoding here until one does",
                  file=sys.stderr, flush=True)
        self.stats.local_batches += 1
        out = list(self._local.decode(iter([batch]), seed, epoch, on_bad))
        return out[0]


class _Run:
    """One epoch's batches through the servers: the sending, the waiting, and the order."""

    def __init__(self, decoder: ServiceDecoder, batches: Iterator[EncodedBatch], seed: int, epoch: int,
                 on_bad: OnBad) -> None:
        assert decoder._links is not None
        self.d, self.links, self.servers = decoder, decoder._links, decoder._servers
        self.batches, self.seed, self.epoch, self.on_bad = batches, seed, epoch, on_bad
        self.pending: deque[tuple[int, EncodedBatch]] = deque()  # to send, in stream order
        self.sent: dict[int, _Sent] = {}  # by request id
        self.done: dict[int, tuple[EncodedBatch, wire.DecodedBatch | Batch]] = {}  # by seq, waiting their turn
        self.seq = 0
        self.next_out = 0
        self.input_error: BaseException | None = None
        self.exhausted = False

    def __iter__(self) -> Iterator[Batch]:
        while True:
            self._fill()
            self._dispatch()
            while self.next_out in self.done:
                batch, result = self.done.pop(self.next_out)
                self.next_out += 1
                yield self._finish(batch, result)
            if self.exhausted and not self.pending and not self.sent and not self.done:
                if self.input_error is not None:
                    raise self.input_error
                return
            if self.pending and self._local_now():
                seq, batch = self.pending.popleft()
                self.done[seq] = (batch, self.d.local_decode(batch, self.seed, self.epoch, self.on_bad))
                self._events(0)
                continue
            self._events(self._wait_for())
            self._check_silence()

    def _window(self) -> int:
        live = sum(s.depth for s in self.servers if s.state == "live")
        return max(live, 1) + 2

    def _fill(self) -> None:
        while not self.exhausted and len(self.pending) + len(self.sent) + len(self.done) < self._window():
            try:
                batch = next(self.batches)
            except StopIteration:
                self.exhausted = True
                break
            except Exception as e:  # raised after the batches before it, as a local decoder does
                self.input_error, self.exhausted = e, True
                break
            self.pending.append((self.seq, batch))
            self.seq += 1

    def _dispatch(self) -> None:
        while self.pending:
            server = max(self.servers, key=lambda s: s.room, default=None)
            if server is None or server.room <= 0:
                return
            seq, batch = self.pending[0]
            request_id = next(self.d._ids)
            message = wire.decode_message(request_id, self.seed, self.epoch, self.d.kind, self.d.options,
                                          batch.indices, [str(s.get("__key__")) for s in batch.samples],
                                          batch.labels, batch.datas)
            if not self.links.send(server.link, message):  # no connection: it went
                self._lost(server, "down")
                continue
            self.pending.popleft()
            server.inflight.add(request_id)
            if len(server.inflight) == 1:
                server.last_heard = time.monotonic()  # silence counts from the first batch outstanding
            self.sent[request_id] = _Sent(seq, batch, server, time.monotonic())

    def _local_now(self) -> bool:
        """Decode here: no server is live, none greeted in the last moments, and the servers had the
        decoder's first moments to connect."""
        now, grace = time.monotonic(), min(self.d.timeout, 2.0)
        if any(s.state == "live" for s in self.servers):
            return False
        if any(s.state == "greeting" and now - s.hello_at < grace for s in self.servers):
            return False
        return now - self.d.connected_at >= grace

    def _wait_for(self) -> float:
        return 0.0 if self.next_out in self.done else min(0.1, self.d.timeout / 4)

    def _greet(self, server: _Server, probe: bool = False) -> None:
        """Say hello: to a new connection (``greeting`` until welcomed), or to a silent server
        (``probe``: it stays silent, and unused, until it answers)."""
        if self.links.send(server.link, wire.hello_message()):
            server.hello_at = time.monotonic()
            if not probe:
                server.state, server.last_heard = "greeting", server.hello_at

    def _lost(self, server: _Server, state: str) -> None:
        """The server is ``state`` (silent: frozen; down: disconnected); its batches go back to the
        queue, in stream order."""
        if server.state == "live":
            self.d.stats.servers_lost += 1
        server.state = state
        self._requeue([self.sent.pop(i) for i in sorted(server.inflight) if i in self.sent])
        server.inflight.clear()
        server.capped = None

    def _requeue(self, back: list[_Sent]) -> None:
        self.pending.extend((s.seq, s.batch) for s in back)
        self.pending = deque(sorted(self.pending, key=lambda p: p[0]))

    def _events(self, timeout: float) -> None:
        for link, kind, frames in self.links.wait(timeout):
            server = next(s for s in self.servers if s.link is link)
            if kind == "connected":
                self._greet(server)
            elif kind == "disconnected":
                self._lost(server, "down")
            elif frames is not None:
                self._message(server, frames)

    def _message(self, server: _Server, frames: list[memoryview]) -> None:
        try:
            header = wire.unpack(frames[0])
        except wire.WireError as e:
            raise DdpipeError(f"decode server {server.link.endpoint}: {e}") from None
        server.last_heard = time.monotonic()
        kind, request_id = header["type"], header.get("id")
        if kind == "welcome":
            server.slots = max(1, int(header.get("slots", 1)))
            server.state = "live"
            return
        sent = self.sent.get(request_id) if isinstance(request_id, int) else None
        if kind == "error" and (sent is not None or request_id is None):
            raise DdpipeError(f"decode server {server.link.endpoint}: {header.get('error')}")
        if sent is None or sent.server is not server or not isinstance(request_id, int):
            return  # a late answer to a batch already sent elsewhere
        del self.sent[request_id]
        server.inflight.discard(request_id)
        if kind == "busy":
            server.capped = max(1, len(server.inflight))
            self._requeue([sent])
            return
        server.capped = None
        try:
            decoded = wire.read_decoded(header, frames[1:])
        except wire.WireError as e:
            raise DdpipeError(f"decode server {server.link.endpoint}: {e}") from None
        stats = self.d.stats
        stats.remote_batches += 1
        stats.by_server[server.link.endpoint] = stats.by_server.get(server.link.endpoint, 0) + 1
        stats.server_seconds += decoded.seconds
        stats.round_trip_seconds += time.monotonic() - sent.at
        stats.bytes_received += decoded.images.nbytes
        self.done[sent.seq] = (sent.batch, decoded)

    def _check_silence(self) -> None:
        now = time.monotonic()
        for server in self.servers:
            quiet = now - server.last_heard
            if server.state == "greeting" and now - server.hello_at > self.d.timeout:
                server.state = "silent"
            elif server.state == "live" and server.inflight:
                if quiet > self.d.timeout:
                    self._lost(server, "silent")
                elif quiet > self.d.timeout / 3 and now - server.hello_at > self.d.timeout / 3:
                    self._greet(server, probe=True)  # are you there?
            elif server.state == "silent" and now - server.hello_at > self.d.timeout:
                self._greet(server, probe=True)  # frozen, or answering again: used once it answers

    def _finish(self, batch: EncodedBatch, result: wire.DecodedBatch | Batch) -> Batch:
        if not isinstance(result, wire.DecodedBatch):
            return result  # decoded here, on_bad already told
        bad = dict(result.bad)
        for g, sample in zip(batch.indices, batch.samples, strict=True):
            if g in bad:
                self.on_bad(g, sample, bad[g])
        labels = [label for g, label in zip(batch.indices, batch.labels, strict=True) if g not in bad]
        with warnings.catch_warnings():  # the received frame is read-only to numpy; torch only warns
            warnings.simplefilter("ignore", UserWarning)
            images = torch.from_numpy(result.images)
        if self.d.options.channels_last:  # NHWC memory, NCHW shape: torch's channels_last
            images = images.permute(0, 3, 1, 2)
        if len(labels) != images.shape[0]:
            raise DdpipeError(f"a decode server returned {images.shape[0]} images for {len(labels)} samples")
        targets = torch.tensor(labels, dtype=torch.int64)
        if self.d.ring is None:
            return images, targets
        pinned = self.d.ring.take(len(labels))
        pinned.copy_(images)
        return self.d.ring.handed_out(pinned), self.d.ring.labels_out(targets)
