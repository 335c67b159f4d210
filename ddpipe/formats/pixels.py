"""Raw pixels as images: datasets that store decoded pixels (HDF5 arrays, Caffe's raw datums) are
read as binary PNM images, a format every decoder (PIL, DALI) reads, with a header of a few bytes."""

from __future__ import annotations

import numpy as np

PNM_FIELD = "ppm"  # the sample field such images are found under, grey (P5) or colour (P6)


def pnm(pixels: np.ndarray) -> bytes:
    """An image's ``uint8`` pixels, height x width with 1 or 3 channels (RGB) or none, as a binary
    PNM image: ``P5`` grey, ``P6`` colour."""
    height, width = pixels.shape[:2]
    grey = pixels.ndim == 2 or pixels.shape[2] == 1
    return b"P%d\n%d %d\n255\n" % (5 if grey else 6, width, height) + np.ascontiguousarray(pixels).tobytes()
