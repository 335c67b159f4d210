"""``ddpipe serve``: a stateless decode server for any number of trainers.

A request is a batch of encoded samples with everything that decides its pixels (seed, epoch, each
sample's global index, the transform, the decoder): crops and flips are functions of those alone
(decode/augment.py), so the server decodes exactly what the trainer would have, and keeps nothing
between requests but its decoders' buffers.

One thread listens and answers at once (welcomes, refusals, ``busy`` when its queue is full);
``workers`` decoding slots each take one batch at a time from a bounded queue, with decoders of
their own. Memory is bounded: ZeroMQ holds at most ``queue_per_client`` messages per connection,
the queue at most ``queue`` requests, each request at most ``max_request_bytes``.
"""

from __future__ import annotations

import contextlib
import math
import queue
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import DdpipeError, OptionError
from ..fields import number_option, whole_option
from . import wire
from .transport import Listener, listen

if TYPE_CHECKING:
    from ..decode.output import Decoder


@dataclass(frozen=True)
class ServeOptions:
    listen: str = "127.0.0.1:5555"  # HOST:PORT (port 0: any free one), or tcp://..., ipc://...
    workers: int = 1  # decoding slots: batches decoded at once, one thread each
    queue: int = 0  # requests waiting for a slot (0: two per slot); past it, clients are told "busy"
    max_request_bytes: int = 512 << 20
    max_samples: int = 8192  # per request
    log_every: float = 60.0  # seconds between log lines

    def __post_init__(self) -> None:
        if not isinstance(self.listen, str):  # a port alone, say: refused by zmq's bind, as a TypeError
            raise OptionError(f"listen must be an address, HOST:PORT, tcp://... or ipc://..., not "
                              f"{type(self.listen).__name__} {self.listen!r}")
        for name, least in (("workers", 1), ("queue", 0), ("max_request_bytes", 1), ("max_samples", 1)):
            whole_option(getattr(self, name), name, least)
        if not 0 < number_option(self.log_every, "log_every") < math.inf:
            raise OptionError(f"log_every must be a finite number of seconds more than 0, not {self.log_every}")

    @property
    def queue_size(self) -> int:
        return self.queue or 2 * self.workers


@dataclass
class ServerCounters:
    """What the server did since its last log line (and in all)."""

    images: int = 0
    batches: int = 0
    refused: int = 0
    busy: int = 0
    clients: set[bytes] = field(default_factory=set)
    total_images: int = 0


class _Slot:
    """One decoding slot: a thread and its decoders, one per (decoder, transform, batch size)."""

    KEEP = 4  # decoders kept per slot: a server serves few distinct transforms at once

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.decoders: OrderedDict[tuple[Any, ...], tuple[Decoder, int]] = OrderedDict()

    def decoder(self, request: wire.DecodeRequest) -> Decoder:
        import torch

        from ..decode.output import make_decoder

        options = wire.options_from(request.transform, self.threads)
        key = (request.decoder, *(repr(v) for v in request.transform.values()))
        size = max(1, len(request.indices))
        held = self.decoders.pop(key, None)
        if held is not None and held[1] < size:  # a larger batch than its pipeline was built for
            held[0].close()
            held = None
        if held is None:
            held = (make_decoder(request.decoder, options, max(size, 64), torch.device("cpu")), max(size, 64))
        self.decoders[key] = held
        while len(self.decoders) > self.KEEP:
            self.decoders.popitem(last=False)[1][0].close()
        return held[0]

    def decode(self, request: wire.DecodeRequest) -> wire.DecodedBatch:
        from ..decode.batches import EncodedBatch

        t0 = time.perf_counter()
        decoder = self.decoder(request)
        # PIL's workers take their bytes pickled; DALI reads the received frames in place
        datas: list[Any] = [bytes(d) for d in request.datas] if request.decoder == "pil" else list(request.datas)
        batch = EncodedBatch(list(request.indices), [{"__key__": k} for k in request.keys], datas,
                             list(request.labels))
        bad: list[tuple[int, str]] = []
        outputs = list(decoder.decode(iter([batch]), request.seed, request.epoch,
                                      lambda g, sample, reason: bad.append((g, reason))))
        if len(outputs) != 1:
            raise DdpipeError(f"the decoder gave {len(outputs)} batches for one")
        images = outputs[0][0]
        if images.dim() == 4 and not images.is_contiguous():  # channels_last: NCHW shape over NHWC memory
            images = images.permute(0, 2, 3, 1)
        return wire.DecodedBatch(images.contiguous().numpy(), bad, time.perf_counter() - t0)

    def close(self) -> None:
        for decoder, _ in self.decoders.values():
            decoder.close()
        self.decoders.clear()


def _load_decoders() -> None:
    """Import what every decoder needs (torch, the decoders, DALI where installed): a server's first
    request paid for it, 1.4-2.2 s on 2 cores against 0.1 s with them loaded, and a trainer waiting
    on it longer than its service timeout decodes itself instead."""
    import torch  # noqa: F401

    from ..decode import output  # noqa: F401

    with contextlib.suppress(ImportError):  # decode="pil" is served without it
        import nvidia.dali  # noqa: F401


class DecodeServer:
    """Listens on ``options.listen`` (``endpoint`` says where, with the port chosen) and decodes
    until :meth:`serve`'s ``stop`` is set."""

    def __init__(self, options: ServeOptions, log: Callable[[str], None] | None = None) -> None:
        self.options = options
        self.log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self._listener: Listener = listen(options.listen, options.max_request_bytes)  # a bad address: said at once
        self.endpoint = self._listener.endpoint
        _load_decoders()  # before it says it listens: a trainer's first request waits for a decoder's build alone
        self._work: queue.Queue[tuple[bytes, wire.DecodeRequest] | None] = queue.Queue(options.queue_size)
        self.counters = ServerCounters()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._decode_loop, name=f"ddpipe-serve-{i}", daemon=True)
                         for i in range(options.workers)]

    def serve(self, stop: threading.Event) -> None:
        for t in self._threads:
            t.start()
        last_log = time.monotonic()
        try:
            while not stop.is_set():
                got = self._listener.receive(0.2)
                if got is not None:
                    self._handle(*got)
                if time.monotonic() - last_log >= self.options.log_every:
                    self._log_line(time.monotonic() - last_log)
                    last_log = time.monotonic()
        finally:
            for _ in self._threads:
                self._work.put(None)
            for t in self._threads:
                t.join()
            self._listener.close()

    def _handle(self, peer: bytes, frames: list[memoryview]) -> None:
        request_id = None
        try:
            if not frames:
                raise wire.WireError("an empty message")
            header = wire.unpack(frames[0])
            request_id = header.get("id") if isinstance(header.get("id"), int) else None
            if header["type"] == "hello":
                self._listener.send(peer, wire.welcome_message(self.options.workers))
                return
            if header["type"] != "decode":
                raise wire.WireError(f"a message of type {header['type']!r}")
            total = sum(len(f) for f in frames)
            if total > self.options.max_request_bytes:
                raise wire.WireError(f"a request of {total} bytes (this server takes at most "
                                     f"{self.options.max_request_bytes})")
            request = wire.read_decode(header, frames[1:], self.options.max_samples)
        except wire.WireError as e:
            with self._lock:
                self.counters.refused += 1
            self._listener.send(peer, wire.error_message(request_id, f"refused: {e}"))
            return
        try:
            self._work.put_nowait((peer, request))
        except queue.Full:  # back-pressure: the client sends it elsewhere, or later
            with self._lock:
                self.counters.busy += 1
            self._listener.send(peer, wire.busy_message(request.id))

    def _decode_loop(self) -> None:
        slot = _Slot(threads=1)
        try:
            while (item := self._work.get()) is not None:
                peer, request = item
                try:
                    reply = wire.decoded_message(request.id, slot.decode(request))
                except Exception as e:  # the request fails, not the server
                    reply = wire.error_message(request.id, f"{type(e).__name__}: {e}")
                self._listener.post(peer, reply)
                with self._lock:
                    c = self.counters
                    c.images += len(request.indices)
                    c.total_images += len(request.indices)
                    c.batches += 1
                    c.clients.add(peer)
        finally:
            slot.close()

    def _log_line(self, seconds: float) -> None:
        with self._lock:
            c = self.counters
            line = (f"ddpipe serve {self.endpoint}: {c.images / seconds:.0f} images/s, {c.batches} batches from "
                    f"{len(c.clients)} client(s), queue {self._work.qsize()}/{self.options.queue_size}, "
                    f"{c.busy} busy, {c.refused} refused; {c.total_images} images in all")
            self.counters = ServerCounters(total_images=c.total_images)
        self.log(line)
