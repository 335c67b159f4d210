"""What travels between a trainer and a decode server: messages as lists of frames.

A request is a msgpack header (plain types only: nothing in it is ever turned into code) and one
frame per encoded image, sent as the buffers the loader already holds. A reply is a header and one
frame holding the decoded batch's memory, which the trainer turns into a tensor without a copy.
Every header carries the wire version and the ddpipe version; a server refuses a client of another
ddpipe version with a message naming both.

Messages:
- ``hello`` (client -> server) / ``welcome`` (server -> client, with the server's decoding slots):
  opens a link and checks versions; also the liveness probe while batches are outstanding;
- ``decode`` (client -> server): seed, epoch, decoder, transform, and each sample's index, key,
  label and encoded bytes; the server answers ``decoded`` (the images, and the samples it could
  not decode with the reason), ``busy`` (its queue is full: send it elsewhere or later) or
  ``error`` (a request it refuses, or a failure it names).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np

from ..decode.spec import DecodeOptions
from ..version import __version__

WIRE_VERSION = 1
# the transform's fields that decide a decoded batch's pixels: the rest (device, threads, service) are local
TRANSFORM_FIELDS = ("train", "size", "resize_shorter", "scale", "ratio", "flip", "mean", "std", "dtype",
                    "channels_last", "antialias", "max_pixels")
SERVED_DECODERS = ("dali-cpu", "pil")
MAX_HEADER_BYTES = 16 << 20  # a header with indices, keys and labels of a very large batch fits


class WireError(ValueError):
    """A message that is not a well-formed ddpipe message, or one this side refuses."""


def pack(header: dict[str, Any]) -> bytes:
    packed: bytes = msgpack.packb({"wire": WIRE_VERSION, "ddpipe": __version__, **header})
    return packed


def unpack(frame: bytes | memoryview) -> dict[str, Any]:
    """A header, checked for what every message must hold; WireError otherwise."""
    if len(frame) > MAX_HEADER_BYTES:
        raise WireError(f"a header of {len(frame)} bytes (at most {MAX_HEADER_BYTES})")
    try:
        header = msgpack.unpackb(frame, raw=False, strict_map_key=True)
    except Exception as e:  # msgpack raises several unrelated types for garbage
        raise WireError(f"not a ddpipe message ({type(e).__name__})") from None
    if not isinstance(header, dict) or not isinstance(header.get("type"), str):
        raise WireError("not a ddpipe message (no type)")
    if header.get("ddpipe") != __version__ or header.get("wire") != WIRE_VERSION:
        raise WireError(f"ddpipe {header.get('ddpipe')!r} (wire {header.get('wire')!r}) on the other side, "
                        f"ddpipe {__version__} (wire {WIRE_VERSION}) here: run the same version on both")
    return header


def transform_of(options: DecodeOptions) -> dict[str, Any]:
    return {name: getattr(options, name) for name in TRANSFORM_FIELDS}


def options_from(transform: object, threads: int) -> DecodeOptions:
    """The server's DecodeOptions for a request's transform: checked as any DecodeOptions is."""
    if not isinstance(transform, dict) or set(transform) != set(TRANSFORM_FIELDS):
        raise WireError(f"the transform must give exactly {', '.join(TRANSFORM_FIELDS)}")
    values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in transform.items()}
    try:
        # the decoder is the request's own (DecodeRequest.decoder): this object carries the transform
        return DecodeOptions(decoder="auto", device="cpu", threads=threads, **values)
    except (TypeError, ValueError) as e:
        raise WireError(f"a transform DecodeOptions refuses: {e}") from None


@dataclass
class DecodeRequest:
    """One batch to decode, as the server reads it from a ``decode`` message."""

    id: int
    seed: int
    epoch: int
    decoder: str
    transform: dict[str, Any]
    indices: list[int]
    keys: list[str]
    labels: list[int]
    datas: list[memoryview]


def decode_message(request_id: int, seed: int, epoch: int, decoder: str, options: DecodeOptions,
                   indices: list[int], keys: list[str], labels: list[int],
                   datas: Sequence[bytes | memoryview]) -> list[Any]:
    header = pack({"type": "decode", "id": request_id, "seed": seed, "epoch": epoch, "decoder": decoder,
                   "transform": transform_of(options), "indices": indices, "keys": keys, "labels": labels})
    return [header, *datas]


def read_decode(header: dict[str, Any], frames: list[memoryview], max_samples: int) -> DecodeRequest:
    """A ``decode`` message's request, every field checked for type and agreement before use."""
    fields = {"id": int, "seed": int, "epoch": int, "decoder": str, "transform": dict, "indices": list,
              "keys": list, "labels": list}
    for name, kind in fields.items():
        if not isinstance(header.get(name), kind) or isinstance(header.get(name), bool):
            raise WireError(f"field {name!r} missing or not {kind.__name__}")
    n = len(frames)
    if n > max_samples:
        raise WireError(f"{n} samples in one request (this server takes at most {max_samples})")
    if not (len(header["indices"]) == len(header["keys"]) == len(header["labels"]) == n):
        raise WireError(f"{len(header['indices'])} indices, {len(header['keys'])} keys and "
                        f"{len(header['labels'])} labels for {n} images")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in header["indices"] + header["labels"]):
        raise WireError("indices and labels must be integers")
    if not all(isinstance(k, str) for k in header["keys"]):
        raise WireError("keys must be strings")
    if header["decoder"] not in SERVED_DECODERS:
        raise WireError(f"decoder {header['decoder']!r}: a server decodes with {' or '.join(SERVED_DECODERS)}")
    return DecodeRequest(header["id"], header["seed"], header["epoch"], header["decoder"], header["transform"],
                         header["indices"], header["keys"], header["labels"], frames)


@dataclass
class DecodedBatch:
    """A server's answer: the images' memory (NCHW, or NHWC when ``channels_last``), and the samples
    it could not decode with the reason, as (index, reason)."""

    images: np.ndarray
    bad: list[tuple[int, str]]
    seconds: float  # the server's time decoding it, for the trainer's split of decode and transfer


def decoded_message(request_id: int, batch: DecodedBatch) -> list[Any]:
    header = pack({"type": "decoded", "id": request_id, "dtype": batch.images.dtype.name,
                   "shape": list(batch.images.shape), "bad": [list(b) for b in batch.bad],
                   "seconds": batch.seconds})
    return [header, np.ascontiguousarray(batch.images)]


def read_decoded(header: dict[str, Any], frames: list[memoryview]) -> DecodedBatch:
    try:
        dtype = np.dtype(str(header["dtype"]))
        shape = tuple(int(d) for d in header["shape"])
        bad = [(int(g), str(reason)) for g, reason in header["bad"]]
        seconds = float(header["seconds"])
    except (KeyError, TypeError, ValueError) as e:
        raise WireError(f"a decoded batch's header is malformed ({e})") from None
    if dtype.name not in ("uint8", "float16", "float32") or len(frames) != 1:
        raise WireError("a decoded batch holds one frame of uint8, float16 or float32")
    if int(np.prod(shape)) * dtype.itemsize != len(frames[0]):
        raise WireError(f"a decoded batch of shape {shape} in {len(frames[0])} bytes")
    images = np.frombuffer(frames[0], dtype=dtype).reshape(shape)
    return DecodedBatch(images, bad, seconds)


def hello_message() -> list[Any]:
    return [pack({"type": "hello"})]


def welcome_message(slots: int) -> list[Any]:
    return [pack({"type": "welcome", "slots": slots})]


def busy_message(request_id: int) -> list[Any]:
    return [pack({"type": "busy", "id": request_id})]


def error_message(request_id: int | None, text: str) -> list[Any]:
    return [pack({"type": "error", "id": request_id, "error": text})]
