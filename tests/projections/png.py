"""A small PNG reader for tests: the pixels of an 8-bit RGB or RGBA PNG, with the standard library only.

    width, height, pixels = read_png(path)      # pixels: a list of rows of (r, g, b[, a]) tuples

Enough to ask of a browser's screenshot whether anything was drawn (how many colours it holds), with
no image library among the dependencies.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

SIGNATURE = b"\x89PNG\r\n\x1a\n"
CHANNELS = {2: 3, 6: 4}  # colour type: RGB, RGBA


def read_png(path: Path) -> tuple[int, int, list[list[tuple[int, ...]]]]:
    """Width, height and rows of pixel tuples of a non-interlaced 8-bit RGB(A) PNG; ValueError otherwise."""
    data = path.read_bytes()
    if not data.startswith(SIGNATURE):
        raise ValueError(f"{path} is not a PNG")
    offset, idat, header = len(SIGNATURE), [], None
    while offset < len(data):
        (length,), kind = struct.unpack(">I", data[offset:offset + 4]), data[offset + 4:offset + 8]
        chunk = data[offset + 8:offset + 8 + length]
        offset += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat.append(chunk)
        elif kind == b"IEND":
            break
    if header is None:
        raise ValueError(f"{path} has no IHDR chunk")
    width, height, depth, colour, _, _, interlace = header
    if depth != 8 or colour not in CHANNELS or interlace:
        raise ValueError(f"{path}: only 8-bit, non-interlaced RGB or RGBA is read here (depth {depth}, type {colour})")
    channels = CHANNELS[colour]
    raw = zlib.decompress(b"".join(idat))
    stride = width * channels
    rows: list[list[tuple[int, ...]]] = []
    previous = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        _unfilter(kind, line, previous, channels)
        rows.append([tuple(line[x:x + channels]) for x in range(0, stride, channels)])
        previous = line
    return width, height, rows


def _unfilter(kind: int, line: bytearray, previous: bytearray, bpp: int) -> None:
    """Undo one scanline's filter in place (PNG spec, section 9)."""
    for i in range(len(line)):
        left = line[i - bpp] if i >= bpp else 0
        up = previous[i]
        if kind == 1:
            line[i] = (line[i] + left) & 0xFF
        elif kind == 2:
            line[i] = (line[i] + up) & 0xFF
        elif kind == 3:
            line[i] = (line[i] + (left + up) // 2) & 0xFF
        elif kind == 4:
            corner = previous[i - bpp] if i >= bpp else 0
            estimate = left + up - corner
            pa, pb, pc = abs(estimate - left), abs(estimate - up), abs(estimate - corner)
            line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 0xFF
        elif kind != 0:
            raise ValueError(f"unknown PNG filter type {kind}")


def colours(path: Path) -> dict[tuple[int, ...], int]:
    """How many pixels of each colour the PNG holds (alpha dropped)."""
    _, _, rows = read_png(path)
    counts: dict[tuple[int, ...], int] = {}
    for row in rows:
        for pixel in row:
            rgb = pixel[:3]
            counts[rgb] = counts.get(rgb, 0) + 1
    return counts
