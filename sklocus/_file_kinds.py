"""What a file is, told by its first bytes: the one place sklocus sniffs files.

``sklocus.load`` and the command line use it to say "this is a CSV table" or
"this is a pickle" when given the wrong file, rather than failing on what the
bytes would mean in the format expected. Only the standard library is used, so
that the command line can check its inputs before importing PyTorch.
"""

from __future__ import annotations

import struct
from pathlib import Path

# Read this much of a file to tell its kind (a text's first line is in it).
_SNIFFED_BYTES = 4096

# Compressed streams, by their magic bytes: joblib.dump(..., compress=...)
# writes one of these, and gzip is also a .csv.gz table.
_COMPRESSED = (
    (b"\x1f\x8b", "gzip"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"]\x00\x00", "lzma"),
    (b'\x04"M\x18', "lz4"),
)

DESCRIPTIONS = {
    "empty": "an empty file",
    "safetensors": "a safetensors file",
    "parquet": "a Parquet table",
    "csv": "a CSV table",
    "text": "a text file",
    "pickle": "a pickle (joblib.dump? pickle.dump?)",
    "compressed": "compressed data (joblib.dump with compress? a .gz file?)",
    "zip": "a zip archive (torch.save? numpy.savez?)",
    "numpy": "a NumPy array (numpy.save)",
}
# The kinds a joblib file has: a pickle, compressed or not.
JOBLIB_KINDS = ("pickle", "compressed")


def file_kind(path):
    """Return what the first bytes of the file ``path`` say it is.

    Parameters
    ----------
    path : str or path-like
        An existing file.

    Returns
    -------
    str or None
        A key of :data:`DESCRIPTIONS`: ``"safetensors"`` (a sklocus model file
        is one), ``"parquet"`` (``PAR1``), ``"pickle"`` (protocol 2 or later),
        ``"compressed"`` (gzip, zlib, bz2, xz, lzma or lz4, as a compressed
        joblib file or a ``.csv.gz`` is), ``"zip"``, ``"numpy"``, ``"csv"``
        (text whose first line has a comma, tab or semicolon), ``"text"``,
        ``"empty"``; None for binary data of another kind.
    """
    path = Path(path)
    with open(path, "rb") as file:
        start = file.read(_SNIFFED_BYTES)
    if not start:
        return "empty"
    if start.startswith(b"PAR1"):
        return "parquet"
    if start.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        return "zip"
    if start.startswith(b"\x93NUMPY"):
        return "numpy"
    if len(start) >= 2 and start[0] == 0x80 and 2 <= start[1] <= 5:
        return "pickle"
    if _is_safetensors(start, path.stat().st_size):
        return "safetensors"
    # Before the compressed kinds: a text may start as a zlib stream does ("x^").
    if _is_text(start):
        first_line = start.split(b"\n", 1)[0]
        return "csv" if any(c in first_line for c in b",\t;") else "text"
    if _is_compressed(start):
        return "compressed"
    return None


def describe(kind):
    """Return how a message names a file of ``kind`` (None: unknown binary data)."""
    return DESCRIPTIONS.get(kind, "binary data of an unknown kind")


def _is_safetensors(start, size):
    """Say whether ``start`` is a header length that fits, then a JSON object."""
    if len(start) < 9:
        return False
    (length,) = struct.unpack("<Q", start[:8])
    return 2 <= length <= size - 8 and start[8:9] == b"{"


def _is_compressed(start):
    if start.startswith(tuple(magic for magic, _ in _COMPRESSED)):
        return True
    # bz2: "BZh", the block size, then the block magic (pi's digits).
    if start[:3] == b"BZh" and start[4:10] == b"1AY&SY":
        return True
    # zlib: 0x78, then a flag byte that makes the pair a multiple of 31.
    return len(start) >= 2 and start[0] == 0x78 and (start[0] << 8 | start[1]) % 31 == 0


def _is_text(start):
    """Say whether ``start`` is text: no control character but whitespace."""
    allowed = {9, 10, 11, 12, 13, 27}
    return not any(byte < 32 and byte not in allowed for byte in start)
