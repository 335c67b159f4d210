"""A JPEG's size from its frame header, read without letting go of the interpreter lock.

The GPU path's feed reads every sample's size (its crop window depends on it) on a thread that
shares the interpreter with the training loop and the reading thread. simplejpeg reads a header in
~1.5 us, but it lets go of the interpreter lock to do so, and taking it back waits for whichever
thread holds it then: beside a thread running Python, each call took ~600 us here. This walks the
markers up to the start of the scan in Python instead (a few segments: APPn, DQT, SOF, DHT), holding
the lock throughout. Whatever it does not recognise it leaves to simplejpeg (``None``), so an image
it reads gets the size libjpeg-turbo would give, and one that does not read fails as it did.
"""

from __future__ import annotations

import struct

# the frames libjpeg-turbo decodes: baseline, extended sequential, progressive, and their arithmetic-
# coded forms; lossless and hierarchical ones are left to simplejpeg to refuse
_FRAMES = frozenset({0xC0, 0xC1, 0xC2, 0xC9, 0xCA})
_NO_LENGTH = frozenset({0x01, *range(0xD0, 0xD8)})  # TEM and the restart markers stand alone
_START_OF_SCAN, _END_OF_IMAGE = 0xDA, 0xD9
_SEGMENT = struct.Struct(">BBH").unpack_from  # 0xFF, the marker, the segment's length
_FRAME_SIZE = struct.Struct(">HH").unpack_from  # a frame's height and width, after its precision


def jpeg_size(data: bytes | memoryview) -> tuple[int, int] | None:
    """(width, height) from a JPEG's frame header, where every segment up to and including the start
    of the first scan is whole; None otherwise (not a JPEG, cut short, or a frame left to
    simplejpeg)."""
    n = len(data)
    if n < 4 or data[0] != 0xFF or data[1] != 0xD8:
        return None
    size = None
    i = 2
    while i + 4 <= n:
        prefix, marker, length = _SEGMENT(data, i)
        if prefix != 0xFF:
            return None
        if marker == 0xFF:  # a fill byte before the marker
            i += 1
            continue
        if marker in _NO_LENGTH:
            i += 2
            continue
        if marker == _END_OF_IMAGE:
            return None
        end = i + 2 + length
        if end > n or length < 2:
            return None
        if marker == _START_OF_SCAN:
            return size
        if marker in _FRAMES:
            if size is not None or length < 8:  # a second frame, or one too short for its size
                return None
            height, width = _FRAME_SIZE(data, i + 5)
            if not (width and height):  # a height given later (DNL)
                return None
            size = (width, height)
        elif 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            return None  # another kind of frame
        i = end
    return None
