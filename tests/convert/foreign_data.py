"""Datasets as other tools write them, made here with plain h5py, lmdb, msgpack, pickle and a
hand-encoded Caffe ``Datum``: sample i is a solid image whose colour encodes its label (i % 5)."""

from __future__ import annotations

import pickle
from pathlib import Path

import h5py
import lmdb
import msgpack
import numpy as np

from ..decode.images import solid_jpeg

CLASSES = 5


def colour(label: int) -> tuple[int, int, int]:
    return (40 * label + 20, 200 - 30 * label, 90)


def jpeg(i: int) -> bytes:
    return solid_jpeg(colour(i % CLASSES), (24 + i % 7, 20))


def h5_vlen(root: Path, files: int = 2, per_file: int = 15) -> Path:
    """Variable-length uint8 images and an integer labels dataset; several files."""
    root.mkdir(parents=True)
    i = 0
    for f in range(files):
        with h5py.File(root / f"part{f}.h5", "w") as h:
            ds = h.create_dataset("images", (per_file,), dtype=h5py.vlen_dtype(np.uint8))
            labels = []
            for j in range(per_file):
                ds[j] = np.frombuffer(jpeg(i), dtype=np.uint8)
                labels.append(i % CLASSES)
                i += 1
            h.create_dataset("labels", data=np.array(labels, dtype=np.int64))
    return root


def h5_pixels(root: Path, layout: str = "hwc", files: int = 2, per_file: int = 15) -> Path:
    """Decoded images as one uint8 array per file, 20 x 24 pixels each: ``hwc`` (rows x columns x RGB,
    as numpy and PIL lay them out), ``chw`` (RGB x rows x columns, as torchvision does), ``grey``
    (rows x columns, as MNIST is stored; the grey level tells the label) or ``grey-chw`` (1 x rows x
    columns)."""
    root.mkdir(parents=True)
    i = 0
    for f in range(files):
        labels = np.arange(i, i + per_file) % CLASSES
        if layout in ("grey", "grey-chw"):
            pixels = np.broadcast_to((40 * labels + 20).astype(np.uint8)[:, None, None], (per_file, 20, 24))
            if layout == "grey-chw":
                pixels = pixels[:, None]
        else:
            rgb = np.array([colour(int(c)) for c in labels], dtype=np.uint8)
            pixels = np.broadcast_to(rgb[:, None, None, :], (per_file, 20, 24, 3))
            if layout == "chw":
                pixels = pixels.transpose(0, 3, 1, 2)
        with h5py.File(root / f"part{f}.h5", "w") as h:
            h["x"] = np.ascontiguousarray(pixels)
            h["y"] = labels
        i += per_file
    return root


def h5_one_hot(root: Path, dtype: str = "float32", columns: int = CLASSES) -> Path:
    """As :func:`h5_vlen`, the labels stored one-hot (Keras' ``to_categorical``): a row per image,
    a column per class, ``columns`` of them (more than the classes the images have, if asked)."""
    h5_vlen(root)
    for part in sorted(root.glob("*.h5")):
        with h5py.File(part, "a") as h:
            classes = h["labels"][()]
            del h["labels"]
            h["labels"] = np.eye(columns, dtype=dtype)[classes]
    return root


def h5_float_labels(root: Path, attribute: bool = False) -> Path:
    """As :func:`h5_vlen`, the class numbers stored as float64 (as MATLAB writes them), in a dataset
    or an attribute of the images."""
    h5_vlen(root)
    for part in sorted(root.glob("*.h5")):
        with h5py.File(part, "a") as h:
            classes = h["labels"][()].astype(np.float64)
            del h["labels"]
            if attribute:
                h["images"].attrs["classes"] = classes
            else:
                h["labels"] = classes
    return root


def h5_class_names(root: Path, names: list[str], stored: str = "fixed", n: int = 20) -> Path:
    """Variable-length uint8 images labelled by class name: image ``i`` is class ``i % CLASSES``,
    named ``names[i % CLASSES]``, as fixed-length strings (``S``), variable-length UTF-8 strings, or
    an attribute of the images dataset."""
    root.mkdir(parents=True)
    labels = [names[i % CLASSES] for i in range(n)]
    with h5py.File(root / "train.h5", "w") as h:
        ds = h.create_dataset("images", (n,), dtype=h5py.vlen_dtype(np.uint8))
        for i in range(n):
            ds[i] = np.frombuffer(jpeg(i), dtype=np.uint8)
        if stored == "fixed":
            h.create_dataset("labels", data=np.array([t.encode() for t in labels], dtype="S16"))
        elif stored == "vlen":
            h.create_dataset("labels", data=labels, dtype=h5py.string_dtype())
        else:
            ds.attrs["classes"] = np.array(labels, dtype=h5py.string_dtype())
    return root


def h5_fixed(root: Path, n: int = 20) -> Path:
    """Fixed-length byte strings (numpy ``S``), labels as an attribute of the images dataset."""
    root.mkdir(parents=True)
    data = [jpeg(i) for i in range(n)]
    with h5py.File(root / "train.hdf5", "w") as h:
        ds = h.create_dataset("data/jpegs", data=np.array(data, dtype=f"S{max(map(len, data))}"))
        ds.attrs["targets"] = np.array([i % CLASSES for i in range(n)], dtype=np.int32)
    return root


def _lmdb(root: Path, records: list[tuple[bytes, bytes]]) -> Path:
    root.mkdir(parents=True)
    env = lmdb.open(str(root), map_size=1 << 26)
    with env.begin(write=True) as txn:
        for k, v in records:
            txn.put(k, v)
    env.close()
    return root


def lmdb_images_label_in_key(root: Path, n: int = 25) -> Path:
    return _lmdb(root, [(b"img%05d_%d" % (i, i % CLASSES), jpeg(i)) for i in range(n)])


def lmdb_images_labels_file(root: Path, n: int = 25) -> Path:
    made = _lmdb(root, [(b"photo-%05d.JPEG" % i, jpeg(i)) for i in range(n)])
    (root / "labels.txt").write_text("".join(f"photo-{i:05d}.JPEG {i % CLASSES}\n" for i in range(n)))
    return made


def lmdb_msgpack(root: Path, n: int = 25) -> Path:
    return _lmdb(root, [(b"%08d" % i, msgpack.packb({"image": jpeg(i), "label": i % CLASSES})) for i in range(n)])


def lmdb_msgpack_named(root: Path, names: list[str], pairs: bool = False, n: int = 25) -> Path:
    """msgpack records labelled by class name: maps with a file name beside (a string that is no
    label), or ``[image, name]`` pairs."""
    def record(i: int) -> bytes:
        name = names[i % CLASSES]
        packed: bytes = msgpack.packb([jpeg(i), name] if pairs else {"image": jpeg(i), "file": f"img{i}.jpg",
                                                                      "label": name})
        return packed
    return _lmdb(root, [(b"%08d" % i, record(i)) for i in range(n)])


def lmdb_pickle(root: Path, n: int = 25) -> Path:
    """As PyTorch ImageNet-LMDB scripts (folder2lmdb.py) write it: pickled (bytes, label), plus meta keys."""
    records = [(b"%d" % i, pickle.dumps((jpeg(i), i % CLASSES), protocol=4)) for i in range(n)]
    records += [(b"__len__", pickle.dumps(n)), (b"__keys__", pickle.dumps([b"%d" % i for i in range(n)]))]
    return _lmdb(root, records)


def _varint(v: int) -> bytes:
    v &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def datum(data: bytes, label: int, *, encoded: bool, shape: tuple[int, int, int] = (0, 0, 0)) -> bytes:
    """A Caffe ``Datum`` as protobuf encodes it (fields 1-3 shape, 4 data, 5 label, 7 encoded)."""
    c, h, w = shape
    msg = b"".join(_varint(tag << 3) + _varint(v) for tag, v in ((1, c), (2, h), (3, w)) if v)
    msg += _varint(4 << 3 | 2) + _varint(len(data)) + data + _varint(5 << 3) + _varint(label)
    return msg + (_varint(7 << 3) + _varint(1) if encoded else b"")


def lmdb_caffe(root: Path, n: int = 25, *, encoded: bool = True) -> Path:
    """As Caffe's convert_imageset writes it: keys '%08d_<path>', a Datum per value."""
    records = []
    for i in range(n):
        if encoded:
            value = datum(jpeg(i), i % CLASSES, encoded=True)
        else:
            r, g, b = colour(i % CLASSES)
            h, w = 12, 10
            bgr = np.stack([np.full((h, w), b), np.full((h, w), g), np.full((h, w), r)]).astype(np.uint8)  # CHW BGR
            value = datum(bgr.tobytes(), i % CLASSES, encoded=False, shape=(3, h, w))
        records.append((b"%08d_n0000/img%d.JPEG" % (i, i), value))
    return _lmdb(root, records)
