"""``ddpipe index`` for HDF5 files that other tools wrote (LMDB environments: ``adopt_lmdb``): a
manifest beside them (or in a directory the user names, when the data is read-only), never a copy of
the data.

Adoption reads every file once: it hashes it (the manifest's checksum, which staging and ``ddpipe
verify`` check), records each sample's digest (which every read by the Loader is checked against:
an adopted file is one shard, which many ranks may each read a part of), counts the samples and
finds the labels. When a layout is ambiguous it lists what it found and asks for a name rather than
guessing.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import numpy as np

from ..checksum import pack_digests, sample_digest
from ..directory_kind import HDF5_SUFFIXES
from ..errors import DdpipeError
from ..manifest import Manifest, ShardInfo, label_runs
from .adopt import given_or_recorded, refuse_read_only, write_adopted
from .classes import class_order, named_classes, refuse_negative

# rows read to tell labels stored as floats or one-hot rows from other numbers when listing candidates
LABEL_SNIFF_ROWS = 256
# files kept elsewhere: their names, and a context in which the file at a path is there
Fetch = tuple[Sequence[str], Callable[[Path], AbstractContextManager[object]]]


def hdf5_candidates(path: Path) -> tuple[list[tuple[str, str, int]], list[tuple[str, int]], list[tuple[str, int]]]:
    """What one HDF5 file holds that could be images (name, kind, rows), label datasets (name, rows:
    class numbers, or names as strings) and label array attributes (name, length). Fixed-length
    strings are images only if the first is one (else names)."""
    import h5py

    from ..formats.foreign_hdf5 import image_kind
    from ..formats.lmdb_values import sniff_image_field

    images, labels, attrs = [], [], []
    try:
        opened = h5py.File(path, "r")
    except OSError as e:  # h5py's errors name no file; the system's, a whole line of HDF5's own terms
        why = os.strerror(e.errno) if e.errno else str(e).split("(")[-1].rstrip(")")
        raise DdpipeError(f"not a readable HDF5 file: {why}", path=path) from None
    with opened as f:
        found: list[tuple[str, Any]] = []
        f.visititems(lambda name, obj: found.append((name, obj)) if isinstance(obj, h5py.Dataset) else None)
        for name, ds in found:
            kind = image_kind(ds)
            if kind == "fixed" and ds.dtype.kind == "S" and not (ds.shape[0] and sniff_image_field(bytes(ds[0]))):
                kind = None  # strings that are no images (class names, say), or none to tell by
            if kind is not None:
                images.append((name, kind, int(ds.shape[0])))
                attrs += _label_arrays(ds.attrs)
            elif _looks_like_labels(ds):
                labels.append((name, int(ds.shape[0])))
        attrs += _label_arrays(f.attrs)
    return images, labels, attrs


def _looks_like_labels(dataset: Any) -> bool:
    """Class numbers or names (1-D; floats only where the first are whole numbers, not weights or
    times), or a 2-D dataset of numbers whose first rows are one-hot (a table of boxes or features is
    not): only those rows are read, so that a large file is not read whole to list its candidates."""
    import h5py

    from ..formats.foreign_hdf5 import one_hot_classes, one_hot_rows, whole_classes

    if dataset.ndim == 1 and dataset.dtype.kind != "f":
        return dataset.dtype.kind in "iuSU" or h5py.check_string_dtype(dataset.dtype) is not None
    if dataset.ndim == 1:
        check = whole_classes
    elif one_hot_rows(dataset):
        check = one_hot_classes
    else:
        return False
    if not dataset.shape[0]:
        return False
    try:
        check(np.asarray(dataset[:LABEL_SNIFF_ROWS]))
    except ValueError:
        return False
    return True


def _label_arrays(attrs: Any) -> list[tuple[str, int]]:
    """The attributes that could hold labels (1-D arrays of class numbers or names), with their lengths."""
    from ..formats.foreign_hdf5 import label_texts

    arrays = {name: np.asarray(value) for name, value in attrs.items()}
    return [(name, len(a)) for name, a in arrays.items()
            if a.ndim == 1 and (label_texts(a) is not None or _looks_like_labels(a))]


def _label_names(files: list[Path], layout: dict[str, Any], fetch: Callable[[Path], AbstractContextManager[object]]
                 ) -> set[str]:
    """The class names the files' labels hold, where they are names (none where they are numbers, or
    strings of digits)."""
    import h5py

    from ..formats.foreign_hdf5 import label_texts, label_values

    names: set[str] = set()
    for path in files:
        try:
            with fetch(path), h5py.File(path, "r") as f:
                values = label_values(f, f[layout["images"]], layout)
        except (OSError, KeyError) as e:
            raise DdpipeError(f"unreadable HDF5 file or not the layout of the first: {e}", path=path) from None
        texts = label_texts(values) if values is not None else None
        if texts is None:
            return set()
        names.update(texts)
    return set() if all(name.isdecimal() for name in names) else names


def _refuse_other_pixels(path: Path, images: str | None) -> None:
    """Where no images were found (or none of the name given), refuse an array of pixels whose numbers
    are not uint8 by its name, rather than only saying no images were found."""
    import h5py

    from ..formats.foreign_hdf5 import pixels_not_uint8

    found: list[tuple[str, str]] = []

    def note(name: str, obj: Any) -> None:
        what = pixels_not_uint8(obj) if isinstance(obj, h5py.Dataset) else None
        if what is not None and (images is None or name == images.strip("/")):
            found.append((name, what))

    with h5py.File(path, "r") as f:
        f.visititems(note)
    if found:
        name, what = found[0]
        raise DdpipeError(f"{name!r} holds {what}: only uint8 pixels (0-255) are read as images, and these have "
                          "no one right scale to them; store them as uint8 (values of 0-1 times 255, rounded)",
                          path=path)


def _one(what: str, flag: str, options: list[str], path: Path) -> str:
    if len(options) == 1:
        return options[0]
    if not options:
        raise DdpipeError(f"no {what} found", path=path)
    raise DdpipeError(f"several {what} found: {', '.join(options)}; name one with {flag}", path=path)


def index_hdf5(data: Path, *, out: Path | None = None, images: str | None = None, labels: str | None = None,
               label_attr: str | None = None, classes: list[str] | None = None,
               fetched: Fetch | None = None) -> Manifest:
    """Adopt the HDF5 files in ``data`` (each a shard) in place. Labels that are class names become
    the classes, in the order ``classes`` gives them if it names them all, else sorted. ``fetched``:
    where the files are elsewhere (a bucket), their names and a context in which one is in ``data``;
    each file is asked for once (the first up to three times, and each twice where the labels are
    class names: the classes come from every file before any file's samples are numbered)."""

    from ..formats.foreign_hdf5 import ForeignHDF5Format, ForeignHDF5Reader

    refuse_read_only(data, out)
    given = classes
    classes = given_or_recorded(classes, data, out)
    names_here, fetch = fetched or ([p.name for p in data.iterdir()], lambda path: contextlib.nullcontext())
    files = [data / n for n in hdf5_names(names_here)]
    if not files:
        raise DdpipeError("no HDF5 files (.h5, .hdf5) found", path=data)
    with fetch(files[0]):
        layout, columns = _hdf5_layout(files[0], images, labels, label_attr)
    names = _label_names(files, layout, fetch)
    if names:
        layout["label_names"] = classes = class_order(names, classes, given, data)
    shards, max_label = [], columns - 1
    fmt = ForeignHDF5Format(layout)
    for path in files:
        with fetch(path), ForeignHDF5Reader(path, layout) as reader:
            found: list[int] = [] if reader.labels is None else reader.labels.tolist()
            if found:
                refuse_negative(found, path)
                max_label = max(max_label, max(found))
            checksum = fmt.checksum(reader)  # through the mapping the scan then reads
            digests = pack_digests(sample_digest(sample) for sample in reader.scan())
            shards.append(ShardInfo(path.name, len(reader), path.stat().st_size, checksum, label_runs(found),
                                    digests))
    fields = tuple(sorted({layout["field"]} | ({"cls"} if "labels" in layout or "label_attr" in layout else set())))
    named = named_classes(max_label, sum(s.samples for s in shards), classes, data)
    manifest = Manifest(format="hdf5-foreign", fields=fields, classes=named, shards=tuple(shards), layout=layout)
    return write_adopted(data, out, manifest)


def hdf5_names(names: Iterable[str]) -> list[str]:
    """The HDF5 files among a directory's (or a prefix's) entries, in the manifest's order: those at its
    top, not hidden."""
    return sorted(n for n in names if n.lower().endswith(HDF5_SUFFIXES) and "/" not in n and not n.startswith("."))


def _hdf5_layout(first: Path, images: str | None, labels: str | None,
                 label_attr: str | None) -> tuple[dict[str, Any], int]:
    """The layout the first file shows (its images, its labels, the field its images go by), and how
    many columns its labels have where they are one-hot rows (else 0)."""
    import h5py

    from ..formats.foreign_hdf5 import PIXEL_KINDS, one_hot_rows
    from ..formats.lmdb_values import sniff_image_field
    from ..formats.pixels import PNM_FIELD

    found_images, found_labels, found_attrs = hdf5_candidates(first)
    rows = {n: r for n, _, r in found_images}
    kinds = {n: k for n, k, _ in found_images}
    if not found_images or (images is not None and images not in rows):
        _refuse_other_pixels(first, images)
    if images is None:
        images = _one("datasets of images (encoded, as variable-length uint8 or fixed-length bytes, or uint8 "
                      "pixels; one per row)",
                      "--images", [n for n, _, _ in found_images], first)
    if images not in rows:
        listed = ", ".join(f"{n} ({k}, {r} rows)" for n, k, r in found_images) or "none"
        raise DdpipeError(f"no dataset {images!r} of images; found: {listed}", path=first)
    if labels is None and label_attr is None:
        fits = [n for n, r in found_labels if r == rows[images]]
        fit_attrs = [n for n, r in found_attrs if r == rows[images]]
        if len(fits) + len(fit_attrs) > 1:
            raise DdpipeError(f"several label candidates of {rows[images]} integers: datasets "
                              f"{', '.join(fits) or '-'}, attributes {', '.join(fit_attrs) or '-'}; "
                              "name one with --labels or --label-attr", path=first)
        labels = fits[0] if fits else None
        label_attr = fit_attrs[0] if fit_attrs else None
    with h5py.File(first, "r") as f:
        # a name given that the file lacks, said with what it has (it was h5py's "object doesn't exist")
        if labels is not None and not isinstance(f.get(labels), h5py.Dataset):
            listed = ", ".join(f"{n} ({r} rows)" for n, r in found_labels) or "none"
            raise DdpipeError(f"no dataset {labels!r} of labels; found: {listed}", path=first)
        if label_attr is not None and label_attr not in f[images].attrs and label_attr not in f.attrs:
            listed = ", ".join(f"{n} ({r} values)" for n, r in found_attrs) or "none"
            raise DdpipeError(f"no attribute {label_attr!r} of labels on {images!r} or the file; found: {listed}",
                              path=first)
        if kinds[images] in PIXEL_KINDS:  # read as PNM images
            field = PNM_FIELD
        else:
            image = f[images][0]
            field = sniff_image_field(image.tobytes() if hasattr(image, "tobytes") else bytes(image)) or "jpg"
        # one-hot labels have a column per class, whether or not the files hold an image of each
        columns = int(f[labels].shape[1]) if labels and labels in f and one_hot_rows(f[labels]) else 0
    layout: dict[str, Any] = {"images": images, "field": field}
    if labels:
        layout["labels"] = labels
    if label_attr:
        layout["label_attr"] = label_attr
    return layout, columns


