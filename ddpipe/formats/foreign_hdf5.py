"""HDF5 files written by other tools, read in place (``ddpipe index`` adopts them).

The layout most scripts write with plain h5py: one dataset of encoded images, one sample per row,
as variable-length ``uint8`` (``h5py.vlen_dtype(np.uint8)``) or fixed-length byte strings (``S`` or
opaque ``V``), and the labels as a dataset of the same length or as an array attribute (of the
images dataset, or of the file): class numbers (integers, or whole numbers stored as floats),
class names as strings (fixed or variable length), which the layout then lists in class order
(``"label_names"``), or one-hot rows (a 2-D dataset, a column per class). Each file is one shard.
The manifest's ``layout`` names them: ``{"images": "images", "labels": "labels"}`` or
``{"images": ..., "label_attr": ...}``, and ``"field"``: what the images are (``jpg``, ``png``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import h5py
import numpy as np

from ..errors import CorruptShardError
from ..fields import checked
from ..sample import KEY, Sample, sanitize_key
from .base import AdoptedFormat, ShardReader
from .hdf5_heap import HeapFormatError, HeapPlaces, VlenHeap, vlen_table
from .learnt import FileVersion, Learnt, LearntOfFile
from .mapped import MappedFile
from .pixels import pnm
from .random_reads import RandomReads

# rows read at once in a scan: one HDF5 call per block, not per sample
_BLOCK_ROWS = 256
# the smallest side of a pixel array taken for images (MNIST's is 28): a smaller uint8 table is something else
_MIN_SIDE = 8
PIXEL_KINDS = ("hwc", "chw")  # the image kinds that are pixels, not encoded images


def image_kind(dataset: Any) -> str | None:
    """How a dataset holds images, one per row: encoded, ``vlen`` or ``fixed``; or as ``uint8`` pixels,
    ``hwc`` (rows of height x width x 1 or 3 channels, or height x width: grey) or ``chw`` (1 or 3
    channels x height x width, as torchvision lays them out); None if it holds none."""
    if dataset.dtype == np.uint8 and dataset.ndim in (3, 4):
        return pixel_layout(dataset.shape)
    if dataset.ndim != 1:
        return None
    vlen = h5py.check_vlen_dtype(dataset.dtype)
    if vlen is not None and np.dtype(vlen) == np.uint8:
        return "vlen"
    if dataset.dtype.kind in ("S", "V"):
        return "fixed"
    return None


def pixel_layout(shape: tuple[int, ...]) -> str | None:
    """``hwc`` or ``chw`` where an array of this shape holds one image of pixels a row (see
    :func:`image_kind`), else None."""
    if len(shape) == 4 and shape[1] in (1, 3) and shape[3] not in (1, 3) and min(shape[2:]) >= _MIN_SIDE:
        return "chw"
    if (len(shape) == 3 or (len(shape) == 4 and shape[3] in (1, 3))) and min(shape[1:3]) >= _MIN_SIDE:
        return "hwc"
    return None


def pixels_not_uint8(dataset: Any) -> str | None:
    """What a dataset laid out as pixels holds where its numbers are not ``uint8`` (normalised floats,
    16-bit), which have no one right scale to 8 bits: ``"float32 pixels (6 x 20 x 24 x 3)"``; else None."""
    if dataset.dtype == np.uint8 or dataset.dtype.kind not in "iuf" or dataset.ndim not in (3, 4):
        return None
    if pixel_layout(dataset.shape) is None:
        return None
    return f"{dataset.dtype} pixels ({' x '.join(map(str, dataset.shape))})"


def label_values(file: Any, images: Any, layout: dict[str, Any]) -> np.ndarray | None:
    """The labels the layout names, as stored (numbers or names), or None when it names none."""
    if layout.get("labels"):
        return np.asarray(file[layout["labels"]][()])
    if layout.get("label_attr"):
        attr = layout["label_attr"]
        owner = images if attr in images.attrs else file
        return np.asarray(owner.attrs[attr])
    return None


def label_texts(values: np.ndarray) -> list[str] | None:
    """Labels stored as strings (fixed-length ``S``, ``U``, or h5py's variable-length strings), as
    text; None for any other kind."""
    if values.ndim != 1 or values.dtype.kind not in "SUO":
        return None
    texts = values.tolist()
    if not all(isinstance(t, (bytes, str)) for t in texts):
        return None
    return [t.decode("utf-8", errors="replace") if isinstance(t, bytes) else t for t in texts]


def one_hot_rows(values: Any) -> bool:
    """Whether ``values`` (an array, or an HDF5 dataset unread) could be one-hot labels: 2-D, of
    numbers (or booleans), a column per class (two at least), one row per image."""
    return values.ndim == 2 and values.shape[1] >= 2 and values.dtype.kind in "biuf"


def one_hot_classes(values: np.ndarray) -> np.ndarray:
    """The class of each one-hot row (a single 1, the rest 0), refused naming the first row that is not
    one: a soft label (label smoothing, mixup) or several classes, where ddpipe's samples carry one."""
    ones, zeros = values == 1, values == 0
    good = (ones.sum(axis=1) == 1) & ((ones | zeros).all(axis=1))
    if not good.all():
        row = int(np.argmin(good))
        raise ValueError(f"labels of shape {values.shape} are not one-hot: row {row} is "
                         f"{np.array2string(values[row], threshold=8)} (each sample takes one class: a single 1, "
                         "the rest 0)")
    return np.asarray(np.argmax(ones, axis=1), dtype=np.int64)


def whole_classes(values: np.ndarray) -> np.ndarray:
    """Class numbers stored as floats (as MATLAB and some scripts write them), refused naming the
    first that is not a whole number, 0 or more."""
    good = np.isfinite(values) & (values >= 0) & (values == np.floor(values))
    if not good.all():
        row = int(np.argmin(good))
        raise ValueError(f"not class numbers: label {row} is {values[row]} (stored as {values.dtype}, a class "
                         "number must be a whole number, 0 or more)")
    return values.astype(np.int64)


def labels_of(file: Any, images: Any, layout: dict[str, Any]) -> np.ndarray | None:
    """The labels the layout names as class numbers, one per image, or None when it names none.
    Class names map to their place in the layout's ``label_names``; strings of digits are numbers,
    as are whole numbers stored as floats; one-hot rows are the class of their 1."""
    values = label_values(file, images, layout)
    if values is None:
        return None
    if values.ndim == 1 and values.dtype.kind in "iu":
        return values.astype(np.int64)
    if values.ndim == 1 and values.dtype.kind == "f":
        return whole_classes(values)
    if one_hot_rows(values):
        return one_hot_classes(values)
    texts = label_texts(values)
    if texts is None:
        raise ValueError(f"labels must be class numbers or names (1-D) or one-hot rows (2-D), found "
                         f"{values.dtype} of shape {values.shape}")
    names = {str(name): i for i, name in enumerate(layout.get("label_names", ()))}
    if not names and all(t.isdecimal() for t in texts):
        return np.array([int(t) for t in texts], dtype=np.int64)
    unknown = sorted(set(texts) - names.keys())
    if unknown:
        raise ValueError(f"label {unknown[0]!r} is not among the class names index.json lists: index the "
                         "files again (`ddpipe index`)")
    return np.array([names[t] for t in texts], dtype=np.int64)


@dataclass(frozen=True)
class PlacedImages:
    """What an open through h5py learnt of an adopted HDF5 file whose images are read straight from
    it (hdf5_heap.py): where its table of elements lies, how many there are, and their labels; and
    where each image read since lies in the file (``at``, -1 for one not read yet, and ``size``),
    filled in by every reader of this version of the file. Kept by the file's version (learnt.py), so
    that a rank's share of a global shuffle, which opens every file each epoch for a few images,
    opens none through h5py again and reads each image it read before with one ``pread``: an open
    through h5py took longer than a few images' reads (docs/benchmarks.md, random_access)."""

    table: int
    count: int
    labels: np.ndarray | None  # int64, one a sample
    at: np.ndarray  # int64: an image's size is written before its place, so a place read is whole
    size: np.ndarray

    @classmethod
    def of(cls, table: int, count: int, labels: np.ndarray | None) -> PlacedImages:
        return cls(table, count, labels, np.full(count, -1, dtype=np.int64), np.zeros(count, dtype=np.int64))

    def place(self, i: int, at: int, size: int) -> None:
        self.size[i] = size
        self.at[i] = at


class ForeignHDF5Reader(ShardReader):
    def __init__(self, path: str | os.PathLike[str], layout: dict[str, Any],
                 learnt: LearntOfFile[PlacedImages] | None = None) -> None:
        """``learnt``: what opens of this version of the file learnt (:class:`PlacedImages`), taken
        where known, else learnt by this one."""
        super().__init__(path)
        self._field = str(layout.get("field", "jpg"))
        self._prefix = sanitize_key(self.path.stem)
        self._file: Any = None  # h5py's, unless its images are placed
        self._reads = RandomReads(self.path)  # images read at random, with pread
        self.labels: np.ndarray | None = None  # int64, one a sample, where the layout names labels
        self._placed = learnt.known if learnt is not None else None
        if self._placed is not None:
            self._kind, self._n, self.labels = "vlen", self._placed.count, self._placed.labels
            self._mapped = MappedFile(self.path)
            self._heap: VlenHeap | None = VlenHeap(self._mapped, self._placed.table, self._n)
            self._places: HeapPlaces | None = HeapPlaces(self._reads, self._placed.table, self._n)
            return
        try:
            self._file = h5py.File(self.path, "r")
            self._images = self._file[layout["images"]]
            kind = image_kind(self._images)
            if kind is None:
                raise self._corrupt(f"dataset {layout['images']!r} does not hold one image per row")
            self._kind = kind
            self._n = int(self._images.shape[0])
            try:
                self.labels = labels_of(self._file, self._images, layout)
            except ValueError as e:  # labels of a kind no sample can carry: say so, not "unreadable"
                raise self._corrupt(f"the labels {layout.get('labels') or layout.get('label_attr')!r}: {e}") from None
            if self.labels is not None and len(self.labels) != self._n:
                raise self._corrupt(f"{len(self.labels)} labels for {self._n} images")
            # vlen images straight from the file where their layout allows (hdf5_heap.py: why)
            self._mapped = MappedFile(self.path)
            table = vlen_table(self._file, self._images) if self._kind == "vlen" else None
            self._heap = None if table is None else VlenHeap(self._mapped, table, self._n)
            self._places = None if table is None else HeapPlaces(self._reads, table, self._n)
        except CorruptShardError:
            self.close()
            raise
        except (OSError, KeyError, ValueError, RuntimeError, TypeError) as e:  # h5py: RuntimeError for some damage
            self.close()
            raise self._corrupt(f"unreadable HDF5 file or not the recorded layout: {e}") from None
        if table is not None and learnt is not None:
            self._placed = PlacedImages.of(table, self._n, self.labels)
            learnt.learn(self._placed, self._n)

    def __len__(self) -> int:
        return self._n

    def _sample(self, i: int, data: Any, views: bool = False) -> Sample:
        # the heap's view (kept as one with ``views``: DALI reads it in the file's mapping), or an S string
        # (bytes, its padding dropped), or a vlen array or opaque V value, or pixels (a PNM image)
        if self._kind in PIXEL_KINDS:
            value: bytes | memoryview = pnm(data if self._kind == "hwc" else data.transpose(1, 2, 0))
        elif isinstance(data, memoryview):
            value = data if views else bytes(data)
        else:
            value = data if isinstance(data, bytes) else data.tobytes()
        sample: Sample = {KEY: f"{self._prefix}/{i:08d}", self._field: value}
        if self.labels is not None:
            sample["cls"] = b"%d" % self.labels[i]
        return sample

    def __getitem__(self, index: int) -> Sample:
        i = self._check_index(index)
        try:
            return self._sample(i, self._image(i) if self._places is not None else self._images[i])
        except (OSError, RuntimeError, HeapFormatError) as e:
            raise self._corrupt(f"cannot read image {i}: {e}") from None

    def _image(self, i: int) -> bytes:
        """Image ``i`` read straight from the file with ``pread`` (random_reads.py: why): where a reader
        of this version of the file found it before, else found (hdf5_heap.HeapPlaces), and its place
        kept where this reader learns the file's places."""
        placed = self._placed
        if placed is not None and placed.at[i] >= 0:
            return self._reads.read(int(placed.at[i]), int(placed.size[i]), f"image {i}")
        assert self._places is not None
        at, image = self._places.element(i)
        if placed is not None:
            placed.place(i, at, len(image))
        return image

    def scan(self, start: int = 0) -> Iterator[Sample]:
        return self._scan(start, views=False)

    def scan_views(self, start: int = 0) -> Iterator[Sample]:
        """:meth:`scan`, each image read straight from the file (variable-length images whose layout
        allows it: hdf5_heap.py) a view of the file's mapping rather than a copy."""
        return self._scan(start, views=True)

    def _scan(self, start: int, views: bool) -> Iterator[Sample]:
        heap = self._heap
        for lo in range(start, self._n, _BLOCK_ROWS):
            hi = min(lo + _BLOCK_ROWS, self._n)
            try:
                block = heap.read(lo, hi, from_start=start == 0) if heap is not None else self._images[lo:hi]
            except (OSError, RuntimeError, HeapFormatError) as e:
                raise self._corrupt(f"cannot read images {lo}-{hi - 1}: {e}") from None
            for i, data in enumerate(block, start=lo):
                yield self._sample(i, data, views)

    def mapped_file(self) -> MappedFile:
        return self._mapped

    def close(self) -> None:
        if hasattr(self, "_mapped"):
            self._mapped.close()
        if self._file is not None:
            self._file.close()
        self._reads.close()


class ForeignHDF5Format(AdoptedFormat):
    name = "hdf5-foreign"
    suffix = ".h5"

    # what opens of files read sample by sample or unchecked learnt, by version (PlacedImages): up to
    # a few adopted ImageNets' worth (24 bytes an image), which a reader holds anyway while it reads
    PLACED_IMAGES = 1 << 23

    def __init__(self, layout: dict[str, Any] | None = None) -> None:
        super().__init__(layout)
        self.placements = Learnt[FileVersion, PlacedImages](self.PLACED_IMAGES)

    def reader(self, path: str | os.PathLike[str]) -> ShardReader:
        return ForeignHDF5Reader(path, self.layout)

    def reader_of(self, path: str | os.PathLike[str], checksum: str | None, *, vouched: bool = False,
                  by_sample: bool = False) -> ShardReader:
        """Read sample by sample (or unchecked), opened from what an open of this version of the file
        learnt before (:class:`PlacedImages`), without h5py."""
        return ForeignHDF5Reader(path, self.layout, LearntOfFile.of(self.placements, path) if by_sample else None)

    @staticmethod
    def check_layout(layout: dict[str, Any]) -> None:
        checked(layout, "images", str, "the name of an HDF5 dataset")
        for key in ("labels", "label_attr", "field"):
            checked(layout, key, str, "a name", default=None)
        ForeignHDF5Format.check_label_names(layout)
