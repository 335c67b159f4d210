"""A reading process's samples handed to its parent as places in their shard files, not as bytes.

The reading process (:mod:`ddpipe.read_server`) reads tar and HDF5 shards through mappings of their
files (:class:`~ddpipe.formats.mapped.FileMapping`), and LMDB shards through the mapping LMDB makes
(:class:`~ddpipe.formats.lmdb_env.LMDBMapping`), so each image it reads is already a view of the
page cache. Copying each one into the buffer both processes share cost the reading process more
than anything else it did (two ranks on two cores: 65 us a sample read apart against 51 read by
threads). Instead it sends its parent each shard file once, as an open descriptor over their
socket, and each image as (file, offset); the parent maps the file itself, and DALI reads the image
from the parent's mapping: the same pages, never copied.

A file is sent as the descriptor the reading process opens by its path, after checking that the
path still names the file it mapped (same device and inode): a staged copy evicted, or a store's
scratch file deleted, since the mapping was made, cannot be opened, and its images are copied into
the buffer as before. So are samples that are not views of such a mapping: the copies some adopted
files give (HDF5's fixed-length rows; LMDB records other than images stored whole or in encoded
Caffe datums), and those an exchange brought from other ranks that came through the connection.
The parent's mapping outlives the path: its descriptor holds the file. Each file's number is
forgotten by both once the reading process's mapping is gone (no sample of it left there); the
parent's mapping then goes with the last batch DALI holds that views it.

Samples received from other ranks arrive in a place of their round in memory both processes map
(:mod:`ddpipe.comm.relay`), and are numbered and placed the same way: the round is announced to the
parent, which holds its place for the reading process, before any batch that names it, and
forgotten once no view of it is left there; the place is taken again once the parent's views have
gone too. Both kinds of news travel on the batches' connection, in order with the batches: a place
forgotten on another connection could be taken again before the batch that names it arrived.
"""

from __future__ import annotations

import itertools
import mmap
import os
import weakref
from collections import deque
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle, send_handle
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import DdpipeError
from .formats.lmdb_env import LMDBMapping
from .formats.mapped import FileMapping, address_of

if TYPE_CHECKING:
    from .comm.relay import ReceivedRounds

#: The place of a sample that is not in a file the parent has: its bytes travel in the buffer.
IN_BUFFER = -1


class PlaceFinder:
    """The reading process's side: where each sample it sends lies in a file or a round its parent has."""

    def __init__(self, conn: Connection, parent_pid: int) -> None:
        self.conn = conn
        self.parent_pid = parent_pid
        # id of each mapping or round met -> (its number, where it starts in memory); a number of
        # IN_BUFFER: its file could not be opened as the one mapped. Each entry goes with its mapping
        # or round (weakref.finalize), so an id is never taken for another's
        self._known: dict[int, tuple[int, int]] = {}
        self._numbers = itertools.count()  # files and rounds alike; next() is atomic (rounds come on another thread)
        # ("round", number, start) and ("forget", number) since the last send_news, in order: a deque,
        # appended to from the threads where rounds arrive and where views go
        self._news: deque[tuple[str, int] | tuple[str, int, int]] = deque()

    def place(self, data: Any) -> tuple[int, int]:
        """(number, offset) of ``data`` in a file sent to the parent (a file met for the first time is
        sent now, before the batch that names it) or in a round received (:meth:`received_round`),
        or (:data:`IN_BUFFER`, 0) where ``data`` is no view of either."""
        owner = data.obj if isinstance(data, memoryview) else None
        if owner is None or not len(data):
            return IN_BUFFER, 0
        known = self._known.get(id(owner))
        if known is None:
            if not isinstance(owner, (FileMapping, LMDBMapping)):
                return IN_BUFFER, 0
            known = self._learn(owner)
        number, start = known
        if number == IN_BUFFER:
            return IN_BUFFER, 0
        return number, address_of(data) - start

    def received_round(self, place: np.ndarray, start: int) -> None:
        """A round received at ``start`` of the area both processes map, ``place`` the view of it its
        samples are views of: they are placed in it from now on (any thread)."""
        number = next(self._numbers)
        self._known[id(place)] = (number, address_of(place.data))
        self._news.append(("round", number, start))
        weakref.finalize(place, self._gone, id(place), number)

    def _learn(self, mapping: FileMapping | LMDBMapping) -> tuple[int, int]:
        number, fd = IN_BUFFER, -1
        try:
            fd = os.open(mapping.path, os.O_RDONLY | os.O_CLOEXEC)
            stat = os.fstat(fd)
            if (stat.st_dev, stat.st_ino) == mapping.identity:
                number = next(self._numbers)
                self.conn.send(("file", number))
                send_handle(self.conn, fd, self.parent_pid)
        except FileNotFoundError:
            pass  # gone since it was mapped: its samples travel in the buffer
        finally:
            if fd >= 0:
                os.close(fd)
        known = self._known[id(mapping)] = (number, address_of(mapping))
        weakref.finalize(mapping, self._gone, id(mapping), number)
        return known

    def _gone(self, key: int, number: int) -> None:
        # any thread, as the last view goes: a deque's append and a dict's pop are atomic
        self._known.pop(key, None)
        if number != IN_BUFFER:
            self._news.append(("forget", number))

    def send_news(self, forget: bool = True) -> None:
        """Tell the parent of the rounds received, before any batch that names them, and which files
        and rounds it may forget (no batch to come names them); with ``forget`` False, not yet: its
        mappings are unmapped as it forgets them, which waits for the kernel to tear down each page
        read through them (~20 ms a GB)."""
        forgotten = []
        kept: list[tuple[str, int]] = []
        while self._news:  # a round's forgetting comes after its news: told after it, below
            news = self._news.popleft()
            if news[0] == "round":
                self.conn.send(news)
            elif forget:
                forgotten.append(news[1])
            else:
                kept.append(("forget", news[1]))
        self._news.extendleft(reversed(kept))  # before any news that came meanwhile, in order
        if forgotten:
            self.conn.send(("forget", forgotten))


class PlaceViews:
    """The parent's side: the files the reading process sent, mapped, the rounds it received, in
    ``rounds`` (the relay's received area), and views of the places it names in them."""

    def __init__(self) -> None:
        self._files: dict[int, memoryview] = {}  # files and rounds, by number
        self.rounds: ReceivedRounds | None = None

    def receive(self, message: tuple[Any, ...], conn: Connection) -> bool:
        """Take in ``message`` if it is about files or rounds (and a file's descriptor after it); False
        if not."""
        if message[0] == "file":
            try:
                fd = recv_handle(conn)
            except RuntimeError:  # no descriptor came: the reading process went between the two
                raise EOFError from None
            try:
                self._files[message[1]] = memoryview(mmap.mmap(fd, 0, prot=mmap.PROT_READ))
            finally:
                os.close(fd)
            return True
        if message[0] == "round":
            if self.rounds is None:
                raise DdpipeError("reading process: a round received, but no rounds are relayed")
            self._files[message[1]] = self.rounds.claim(message[2])
            return True
        if message[0] == "forget":
            for number in message[1]:
                self._files.pop(number, None)  # its mapping or place lives on in the views batches hold
            return True
        return False

    def view(self, number: int, offset: int, size: int) -> memoryview:
        return self._files[number][offset : offset + size]

    def clear(self) -> None:
        self._files.clear()
        self.rounds = None

    def __len__(self) -> int:
        return len(self._files)
