"""The decode service's transport: ZeroMQ through pyzmq, the one module that imports it.

Why ZeroMQ: messages of several frames sent from the buffers the caller holds and received as
buffers (no pickling, no copy into a serialisation format), per-connection queues with high-water
marks (bounded memory on both sides), reconnection after a server restarts, and disconnection
events for a server that dies; measured here at 2-3 GB/s of decoded batches over loopback, about
twice gRPC. Another transport (UCX, MPI) would implement :class:`Listener` and :class:`Links`.

Roles: the server binds a ROUTER socket (many trainers, each reply routed back to its sender); a
trainer holds one DEALER socket per server, so that it knows which server each reply and each
disconnection comes from.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import OptionError


def _zmq() -> Any:
    try:
        import zmq
    except ImportError as e:
        raise OptionError("the decode service needs pyzmq: pip install 'ddpipe[service]'") from e
    return zmq


def endpoint(address: str, listening: bool = False) -> str:
    """``HOST:PORT`` or ``tcp://HOST:PORT`` (or ``ipc://PATH``) as a ZeroMQ endpoint; port 0 or ``*``
    (any free one) only to listen on."""
    if address.startswith("ipc://"):
        return address
    where = address.removeprefix("tcp://")
    host, sep, port = where.rpartition(":")
    if "://" in where or not sep or not host or not (port.isdecimal() or port == "*"):
        raise OptionError(f"decode service address {address!r}: use HOST:PORT, tcp://HOST:PORT or ipc://PATH")
    lowest = 0 if listening else 1
    if (port == "*" and not listening) or (port.isdecimal() and not lowest <= int(port) <= 65535):
        # ZeroMQ would take a port past 65535 modulo 65536: another one, silently
        raise OptionError(f"decode service address {address!r}: port {port} is not one to "
                          f"{'listen on' if listening else 'connect to'} ({lowest} to 65535)")
    return f"tcp://{host}:{port}"


def bound_endpoint(last: str) -> str:
    """The endpoint a socket reports it is bound to, as clients are told it: an IPv4 address is reported
    in IPv6's mapped form once IPv6 is on (``tcp://[::ffff:127.0.0.1]:5555``), which is given back as
    the address it was asked for."""
    where = last.removeprefix("tcp://")
    host, _, port = where.rpartition(":")
    if not (last.startswith("tcp://") and host.startswith("[") and host.endswith("]")):
        return last
    try:
        mapped = ipaddress.IPv6Address(host[1:-1]).ipv4_mapped
    except ValueError:
        return last
    return last if mapped is None else f"tcp://{mapped}:{port}"


class Listener(Protocol):
    """The server's end: messages from any client, each with the client's identity."""

    endpoint: str

    def receive(self, timeout: float) -> tuple[bytes, list[memoryview]] | None: ...

    def send(self, peer: bytes, frames: list[Any]) -> None: ...

    def post(self, peer: bytes, frames: list[Any]) -> None: ...

    def close(self) -> None: ...


class ZmqListener:
    def __init__(self, address: str, max_frame_bytes: int, queue_per_client: int) -> None:
        zmq = _zmq()
        self._zmq = zmq
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        # a frame over this size ends its connection in ZeroMQ itself, before it is allocated whole
        self._socket.setsockopt(zmq.MAXMSGSIZE, max_frame_bytes)
        self._socket.setsockopt(zmq.RCVHWM, queue_per_client)  # back-pressure: a client's pipe holds this many
        self._socket.setsockopt(zmq.SNDHWM, queue_per_client)
        self._socket.setsockopt(zmq.IPV6, 1)  # [::1]:PORT too (ZeroMQ takes IPv4 only unless told)
        where = endpoint(address, listening=True)
        if where.startswith("tcp://") and where.endswith(":0"):
            where = where[:-2] + ":*"  # any free port: endpoint says which
        try:
            self._socket.bind(where)
        except zmq.ZMQError as e:
            self._socket.close(linger=0)
            self._context.term()
            # ZeroMQ's word for a host it cannot resolve to one of this machine's interfaces
            why = "no interface of this machine has that name or address" if e.errno == errno.ENODEV else str(e)
            raise OptionError(f"cannot listen on {address}: {why}") from None
        self.endpoint: str = bound_endpoint(self._socket.getsockopt(zmq.LAST_ENDPOINT).decode())
        # replies from the decoding threads come to this thread through an in-process queue: only
        # this thread touches the ROUTER socket
        self._posted = self._context.socket(zmq.PULL)
        self._posted.bind(f"inproc://replies-{id(self)}")
        self._posters: threading.local = threading.local()
        self._poster_sockets: list[Any] = []
        self._lock = threading.Lock()
        self._poller = zmq.Poller()
        self._poller.register(self._socket, zmq.POLLIN)
        self._poller.register(self._posted, zmq.POLLIN)

    def receive(self, timeout: float) -> tuple[bytes, list[memoryview]] | None:
        """The next client message within ``timeout`` seconds; replies posted meanwhile are sent."""
        deadline = time.monotonic() + timeout
        while True:
            ready = dict(self._poller.poll(max(0, int((deadline - time.monotonic()) * 1000))))
            while self._posted in ready and self._posted.poll(0):
                parts = self._posted.recv_multipart(copy=False)
                self.send(bytes(parts[0].bytes), parts[1:])
            if self._socket in ready:
                parts = self._socket.recv_multipart(copy=False)
                return bytes(parts[0].bytes), [p.buffer for p in parts[1:]]
            if time.monotonic() >= deadline:
                return None

    def send(self, peer: bytes, frames: list[Any]) -> None:
        # a client that has gone, or stopped reading, loses its reply, not the server its loop
        with contextlib.suppress(self._zmq.Again):
            self._socket.send_multipart([peer, *frames], copy=False, flags=self._zmq.NOBLOCK)

    def post(self, peer: bytes, frames: list[Any]) -> None:
        """Send from any thread: handed to the listening thread, without a copy."""
        sock = getattr(self._posters, "socket", None)
        if sock is None:
            sock = self._context.socket(self._zmq.PUSH)
            sock.setsockopt(self._zmq.LINGER, 0)
            sock.connect(f"inproc://replies-{id(self)}")
            self._posters.socket = sock
            with self._lock:
                self._poster_sockets.append(sock)
        sock.send_multipart([peer, *frames], copy=False)

    def close(self) -> None:
        with self._lock:
            for sock in self._poster_sockets:
                sock.close(linger=0)
        self._posted.close(linger=0)
        self._socket.close(linger=0)
        self._context.term()


def listen(address: str, max_frame_bytes: int, queue_per_client: int = 8) -> Listener:
    return ZmqListener(address, max_frame_bytes, queue_per_client)


@dataclass
class Link:
    """A trainer's connection to one server."""

    endpoint: str
    socket: Any
    monitor: Any


# what Links.wait reports of a link: a message's frames, or that it (re)connected or disconnected
Event = tuple[Link, str, list[memoryview] | None]


class Links:
    """A trainer's links to its servers, all waited on at once. Used from one thread only (the
    loader's consumer): ZeroMQ sockets are not shared between threads."""

    def __init__(self) -> None:
        zmq = _zmq()
        self._zmq = zmq
        self._context = zmq.Context()
        self._poller = zmq.Poller()
        self._links: list[Link] = []
        self._by_socket: dict[Any, tuple[Link, bool]] = {}
        # a trainer that never closes its loader still exits: the sockets close before the context
        # ends, which would otherwise wait for them for ever at interpreter exit
        self._finalizer = weakref.finalize(self, _close_links, self._links, self._context)

    def open(self, address: str) -> Link:
        zmq = self._zmq
        sock = self._context.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        # messages go only to a completed connection: none wait in a dead server's queue, to arrive
        # at its successor after they were sent elsewhere
        sock.setsockopt(zmq.IMMEDIATE, 1)
        sock.setsockopt(zmq.RECONNECT_IVL, 200)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
        sock.setsockopt(zmq.IPV6, 1)
        monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        sock.connect(endpoint(address))
        link = Link(endpoint(address), sock, monitor)
        self._links.append(link)
        self._poller.register(sock, zmq.POLLIN)
        self._poller.register(monitor, zmq.POLLIN)
        self._by_socket[sock] = (link, False)
        self._by_socket[monitor] = (link, True)
        return link

    def send(self, link: Link, frames: list[Any]) -> bool:
        """Sent, or False where the link has no connection (or its queue is full)."""
        try:
            link.socket.send_multipart(frames, copy=False, flags=self._zmq.NOBLOCK)
            return True
        except self._zmq.Again:
            return False

    def wait(self, timeout: float) -> list[Event]:
        from zmq.utils.monitor import recv_monitor_message

        events: list[Event] = []
        for sock, _ in self._poller.poll(max(0, int(timeout * 1000))):
            link, is_monitor = self._by_socket[sock]
            if is_monitor:
                event = recv_monitor_message(sock)["event"]
                kind = "connected" if event == self._zmq.EVENT_HANDSHAKE_SUCCEEDED else "disconnected"
                events.append((link, kind, None))
            else:
                parts = sock.recv_multipart(copy=False)
                events.append((link, "message", [p.buffer for p in parts]))
        return events

    def close(self) -> None:
        self._finalizer()


def _close_links(links: list[Link], context: Any) -> None:
    for link in links:
        link.socket.disable_monitor()
        link.monitor.close(linger=0)
        link.socket.close(linger=0)
    links.clear()
    context.term()
