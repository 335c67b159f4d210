"""What the values of LMDB environments written by other tools hold, and how to read an image and a
label from each: encoded images, msgpack records, Caffe ``Datum`` protobufs and Python pickles.

``Datum`` is parsed here rather than through Caffe or protobuf (neither is a dependency): it is a
flat message of varints and one byte field, as in caffe.proto::

    message Datum { optional int32 channels = 1; optional int32 height = 2; optional int32 width = 3;
                    optional bytes data = 4; optional int32 label = 5; repeated float float_data = 6;
                    optional bool encoded = 7 [default = false]; }

A raw (not encoded) datum holds C x H x W pixels, BGR for colour, as Caffe's ``convert_imageset``
writes them; it is handed on as a binary PPM/PGM (an image every decoder reads, made without
compressing anything).
"""

from __future__ import annotations

import io
import pickle
import re
from typing import Any

import msgpack
import numpy as np

from .pixels import pnm

VALUE_KINDS = ("image", "msgpack", "caffe", "pickle")
IMAGE_MAGIC = {b"\xff\xd8\xff": "jpg", b"\x89PNG": "png", b"RIFF": "webp", b"GIF8": "gif", b"BM": "bmp",
               b"P6": "ppm", b"P5": "ppm"}
# keys that tools store beside the samples (folder2lmdb.py's __keys__ and __len__, ddpipe's own)
META_KEY = re.compile(rb"^__\w+__$")


class RecordError(ValueError):
    """A value that is not what the layout says (reported naming the key)."""


def sniff_image_field(data: bytes | memoryview) -> str | None:
    """The field name for encoded image bytes, from their magic number; None if not an image."""
    head = bytes(data[:4])
    return next((f for magic, f in IMAGE_MAGIC.items() if head.startswith(magic)), None)


def _varint(buf: memoryview, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(buf):
            raise RecordError("truncated varint")
        b = buf[at]
        at += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, at
        shift += 7
        if shift > 63:
            raise RecordError("varint longer than 10 bytes")


def parse_datum(value: bytes | memoryview) -> tuple[bytes | memoryview, int]:
    """(image bytes, label) of a Caffe ``Datum``: its data if encoded (a view of ``value``), else a
    PPM/PGM of its pixels."""
    buf = memoryview(value)
    fields: dict[int, Any] = {}
    at = 0
    while at < len(buf):
        tag, at = _varint(buf, at)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            fields[number], at = _varint(buf, at)
        elif wire == 2:
            length, at = _varint(buf, at)
            if at + length > len(buf):
                raise RecordError("truncated field")
            fields[number] = buf[at : at + length]
            at += length
        elif wire == 5:
            at += 4
        elif wire == 1:
            at += 8
        else:
            raise RecordError(f"wire type {wire} is not in a Datum")
    if 4 not in fields:
        raise RecordError("a Datum without data (float_data only is not an image)")
    label = int(fields.get(5, 0))
    if label >= 1 << 63:  # int32 fields encode negatives as 10-byte varints
        label -= 1 << 64
    if fields.get(7):
        return fields[4], label
    c, h, w = int(fields.get(1, 0)), int(fields.get(2, 0)), int(fields.get(3, 0))
    pixels = np.frombuffer(fields[4], dtype=np.uint8)
    if c not in (1, 3) or pixels.size != c * h * w:
        raise RecordError(f"a raw Datum of {pixels.size} bytes for {c} x {h} x {w}")
    if c == 1:
        return pnm(pixels.reshape(h, w)), label
    return pnm(pixels.reshape(3, h, w)[::-1].transpose(1, 2, 0)), label  # CHW BGR -> HWC RGB


#: where a record's map keeps its label when the label is a class name (a map's other strings, a file
#: name say, are no label)
NAME_KEYS = frozenset({"label", "class", "cls", "target", "category", "synset"})


def _record(obj: Any) -> tuple[bytes, int | str | None]:
    """(image bytes, label) from a decoded record: a pair, or a map with one bytes value and one int
    (or one class name under a key of :data:`NAME_KEYS`). A label that is a string is a class name."""
    if isinstance(obj, (list, tuple)) and len(obj) >= 2 and isinstance(obj[0], (bytes, bytearray)):
        return bytes(obj[0]), obj[1] if isinstance(obj[1], str) else _class_number(obj[1])
    if isinstance(obj, dict):
        images = [v for v in obj.values() if isinstance(v, (bytes, bytearray))]
        labels = [v for v in obj.values() if isinstance(v, int) and not isinstance(v, bool)]
        names = [v for k, v in obj.items() if isinstance(v, str) and str(k).lower() in NAME_KEYS]
        if len(images) == 1:
            label = labels[0] if len(labels) == 1 else names[0] if not labels and len(names) == 1 else None
            return bytes(images[0]), label
    if isinstance(obj, (bytes, bytearray)):
        return bytes(obj), None
    raise RecordError(f"a record of {type(obj).__name__} is not (image bytes, label)")


def _class_number(label: Any) -> int:
    """A pair's label as a class number: an integer, or a whole number stored as a float (3.0); a soft
    label (0.7), a flag or anything else is refused rather than cut to an integer."""
    if isinstance(label, float) and label.is_integer() and label >= 0:
        return int(label)
    if isinstance(label, bool) or not isinstance(label, int):
        raise RecordError(f"the label {label!r} is not a class number")
    return label


class _PlainUnpickler(pickle.Unpickler):
    """Pickles of plain values only: bytes, numbers, strings, tuples, lists, dicts, sets. A record
    that names any other class or function is refused before anything is built, so that no stored
    pickle runs code: a value changed after ``ddpipe index --allow-pickle`` (whose digest is checked
    only once the sample is read) is an error, never a call (invariant 9)."""

    # what plain values of older protocols name: bytes (protocol 2), and the built-in containers
    PLAIN = frozenset({("_codecs", "encode"), ("builtins", "bytearray"), ("builtins", "set"), ("builtins", "frozenset"),
             ("collections", "OrderedDict"), ("__builtin__", "set"), ("__builtin__", "frozenset")})

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self.PLAIN:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"the record names {module}.{name}: ddpipe unpickles plain values only")


def plain_unpickle(value: bytes | memoryview) -> Any:
    return _PlainUnpickler(io.BytesIO(value)).load()


def read_value(kind: str, value: bytes | memoryview) -> tuple[bytes | memoryview, int | str | None]:
    """(image bytes, label or None) from one value of ``kind`` (one of :data:`VALUE_KINDS`): where
    ``value`` is a view (of a file in memory) and holds the image whole, a view of it; else bytes.
    A label that is a string is a class name (msgpack and pickled records)."""
    try:
        if kind == "image":
            return value, None
        if kind == "caffe":
            data, label = parse_datum(value)
            return (data if isinstance(value, memoryview) else bytes(data)), label
        if kind == "msgpack":
            return _record(msgpack.unpackb(value, raw=False))
        if kind == "pickle":  # allowed only where the manifest records the user's consent (ddpipe index)
            return _record(plain_unpickle(value))
    except RecordError:
        raise
    except Exception as e:  # each decoder has its own errors; all mean "not this kind"
        raise RecordError(f"not a {kind} value: {type(e).__name__}: {e}") from None
    raise RecordError(f"unknown value kind {kind!r}")


def guess_kind(value: bytes) -> str | None:
    """What one value most likely is, from its first bytes and a trial parse."""
    if sniff_image_field(value) is not None:
        return "image"
    if value[:1] == b"\x80" and value[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return "pickle"
    try:
        _record(msgpack.unpackb(value, raw=False))
        return "msgpack"
    except Exception:
        pass
    try:
        parse_datum(value)
        return "caffe"
    except RecordError:
        return None
