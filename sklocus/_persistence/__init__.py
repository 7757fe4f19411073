"""Save fitted estimators to files that load without running code from them.

A sklocus model file is one `safetensors <https://huggingface.co/docs/safetensors>`_
file: the arrays (network weights, embeddings, selected indices...) are its tensors,
and a JSON description (class names, parameters, labels, training history, the
sklocus version and a checksum) sits in its header's metadata. Loading reads data
only: classes come from a fixed list of sklocus estimators, values from a fixed set
of data types (numbers, strings, lists, tuples, arrays, paths), and each fitted
attribute is checked against the type it must have. Nothing in the file is ever
imported, called or unpickled.

Why this format rather than skops: skops stores scikit-learn objects safely, but a
skorch network is torch modules, tensors and optimisers that skops can only rebuild
by trusting torch's own reconstruction functions, which puts the security decision
back on the user. sklocus knows exactly what inference needs (the network's
architecture and weights, the query encoder's settings and a few arrays), so an
explicit description is smaller, readable with any safetensors tool, and checkable
field by field; safetensors itself comes with sentence-transformers.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save as safetensors_bytes

from sklocus._file_kinds import JOBLIB_KINDS, describe, file_kind
from sklocus._files import write_atomically
from sklocus._persistence._reader import ModelFileError, Reader
from sklocus._persistence._schema import CLASSES
from sklocus._persistence._writer import Writer
from sklocus._versioning import __version__, warn_if_other_version

__all__ = ["ModelFileError", "load", "save"]

_FORMAT = "sklocus-estimator"
# Bump when a file written now could not be read by an older sklocus. Formats 1
# to 3 were written only by development builds before the first release, and
# are refused (3 lacked the router's query heads and probability calibrator; 4,
# the router's head_blend_ and the embedder's validation_queries_). Format 5
# lacked the evaluations a router keeps to learn from outcomes: its routers are
# refused, and its other estimators read as they are. Format 6's routers had
# the parameters calibrate and calibration_method where format 7's have
# calibration: they are read with that one setting, and nothing else changed.
# Format 7's routers had no query_clusters and no learnt groups: they are read
# with query_clusters=None and those attributes None. Format 8's routers held
# every fitted attribute in one flat "fitted" node; format 9's hold those of
# each stage in a "stages" node (the same names, arrays and checks): read alike.
_FORMAT_VERSION = 9
_OLDEST_FORMAT = {"LocusRouter": 6}
_OLDEST_OTHERWISE = 5
_METADATA_KEY = "sklocus"
# Deeper descriptions are refused before anything recurses into them.
_MAX_DEPTH = 64
# A safetensors header (the description and the arrays' table) larger than this
# is refused before it is parsed, since parsing JSON takes many times its size in
# memory. A router of 100,000 named models, or a table of 200,000 query ids,
# needs a few megabytes.
MAX_HEADER_BYTES = 16 << 20
_HEADER_KEYS = {"format", "format_version", "sklocus_version", "sha256", "estimator"}


def save(estimator, path):
    """Save an estimator to a file that :func:`load` reads without running code.

    Read more in the :ref:`User Guide <persistence>`.

    Parameters
    ----------
    estimator : LocusEmbedder, LocusRouter or selector, fitted or not
        Also :class:`~sklocus.encoders.SentenceEncoder`,
        :class:`~sklocus.encoders.PrecomputedEncoder`, and a router's embedder
        wrapped in :class:`~sklearn.frozen.FrozenEstimator`. A ``SentenceEncoder`` is
        stored by its settings: loading needs the same sentence-transformers model
        on that machine.
    path : str or path-like
        File to write (replaced if it exists, keeping its permissions). ``.sklocus``
        is a good suffix; the file is a valid safetensors file.

    Raises
    ------
    TypeError
        When the estimator holds something a model file cannot store, such as
        skorch callbacks or a custom query encoder; the message names it.

    Examples
    --------
    >>> import numpy as np, sklocus, tempfile, os
    >>> selector = sklocus.KCenterSelector(n_selected=2).fit(np.eye(3))
    >>> path = os.path.join(tempfile.mkdtemp(), "selector.sklocus")
    >>> sklocus.save(selector, path)
    >>> sklocus.load(path).selected_indices_
    array([0, 1])
    """
    path = Path(path)
    if not path.parent.is_dir():
        raise FileNotFoundError(f"cannot save to {path}: no folder {path.parent}")
    content = serialised(estimator)
    write_atomically(path, lambda temporary: temporary.write_bytes(content))


def serialised(estimator):
    """Return the bytes :func:`save` writes for ``estimator``."""
    writer = Writer()
    description = writer.estimator(estimator, type(estimator).__name__)
    header = {
        "format": _FORMAT,
        "format_version": _FORMAT_VERSION,
        "sklocus_version": __version__,
        "sha256": _checksum(description, writer.arrays),
        "estimator": description,
    }
    metadata = {_METADATA_KEY: json.dumps(header, allow_nan=False)}
    # What load would refuse is not written (the arrays' own table takes the rest).
    if len(metadata[_METADATA_KEY].encode()) > MAX_HEADER_BYTES - (1 << 20):
        raise ValueError(
            f"the description of this {type(estimator).__name__} takes "
            f"{len(metadata[_METADATA_KEY]):,} characters; a model file's header "
            f"holds at most {MAX_HEADER_BYTES:,} bytes"
        )
    return safetensors_bytes(writer.arrays, metadata=metadata)


def load(path):
    """Load an estimator saved by :func:`save`, running nothing from the file.

    Only data is read: classes come from sklocus's own estimators, values from
    numbers, strings, lists, arrays and paths, and every fitted attribute is
    checked. A ``SentenceEncoder``'s model name and cache folder are settings
    the file gives: a file from an untrusted source may name another
    sentence-transformers model, which its first ``transform`` loads (and
    downloads, where the hub is reachable; sentence-transformers refuses model
    code unless asked to trust it). Check ``get_params()`` of such a file, or
    ``set_params`` them to yours.

    Read more in the :ref:`User Guide <loading_checks>`.

    Parameters
    ----------
    path : str or path-like
        File written by :func:`save`.

    Returns
    -------
    estimator
        Fitted as it was when saved; embeddings, probabilities and routes of
        the same inputs are bit-identical to the saved estimator's on the same
        machine with the same number of threads.

    Raises
    ------
    ModelFileError
        When the file is not a sklocus model file, was damaged or modified, was
        written in another format than the one this sklocus reads, or holds
        anything but the expected classes and types.

    Warns
    -----
    SklocusVersionWarning
        When the file was written by another version of sklocus.
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a folder, not a model file")
    if not path.is_file():
        raise FileNotFoundError(f"no model file at {path}")
    _check_kind(path)
    _check_header_size(path)
    try:
        with safe_open(path, framework="np") as file:
            header = _read_header(path, file.metadata() or {})
            arrays = {key: file.get_tensor(key) for key in file.keys()}
    except (SafetensorError, OSError, TypeError, ValueError, AttributeError) as error:
        if isinstance(error, ModelFileError):
            raise
        raise ModelFileError(
            f"{path} is not a sklocus model file (it is not a safetensors file "
            f"sklocus can read: {error})"
        ) from None
    if header["sha256"] != _checksum(header["estimator"], arrays):
        raise ModelFileError(
            f"{path} does not match the checksum recorded when it was saved: it was "
            "damaged or modified since"
        )
    reader = Reader(path, arrays, header["format_version"])
    described = header["estimator"]
    name = described.get("class") if isinstance(described, dict) else None
    root = name if isinstance(name, str) and name in CLASSES else "the file"
    try:
        estimator = reader.estimator(described, root)
    except ModelFileError:
        raise
    except Exception as error:  # anything the checks above did not foresee
        raise ModelFileError(
            f"{path} describes an estimator that cannot be rebuilt: {error!r}"
        ) from None
    unused = set(arrays) - reader.used
    if unused:
        raise ModelFileError(
            f"{path} holds arrays its description does not use "
            f"({', '.join(sorted(unused)[:3])}): it was modified since it was saved"
        )
    warn_if_other_version(header["sklocus_version"], f"The model file {path}")
    return estimator


def _check_kind(path):
    """Refuse, saying what it looks like, a file that is not a safetensors file.

    Read before the header's size, which means nothing in another format (the
    first bytes of a CSV file read as a size of exabytes).
    """
    kind = file_kind(path)
    if kind == "safetensors":
        return
    message = (
        f"{path} is not a sklocus model file: it looks like {describe(kind)}; "
        "sklocus.load reads files written by sklocus.save"
    )
    if kind in JOBLIB_KINDS:
        message += "; load joblib files only from sources you trust, with joblib.load"
    raise ModelFileError(message)


def _check_header_size(path):
    """Refuse a file whose safetensors header is too large to parse safely."""
    with open(path, "rb") as file:
        start = file.read(8)
    size = int.from_bytes(start, "little") if len(start) == 8 else None
    if size is not None and size > MAX_HEADER_BYTES:
        raise ModelFileError(
            f"{path} is not a sklocus model file (it declares a header of "
            f"{size:,} bytes; a model file's header holds at most "
            f"{MAX_HEADER_BYTES:,})"
        )


def _read_header(path, metadata):
    """Return the checked JSON header of a model file."""
    text = metadata.get(_METADATA_KEY)
    if text is None:
        raise ModelFileError(
            f"{path} is a safetensors file but not a sklocus model file (its header "
            "has no sklocus description); sklocus.load reads files from sklocus.save"
        )
    extra = sorted(set(metadata) - {_METADATA_KEY})
    if extra:
        raise ModelFileError(
            f"{path} has metadata {extra[0]!r} beside its sklocus description; "
            "sklocus.save writes none"
        )
    try:
        header = json.loads(
            text, parse_constant=_refuse_constant, object_pairs_hook=_unique_keys
        )
        _check_depth(header)
        if not isinstance(header, dict) or header.keys() != _HEADER_KEYS:
            shown = sorted(header) if isinstance(header, dict) else type(header)
            raise ValueError(f"it holds {shown}; expected {sorted(_HEADER_KEYS)}")
        fmt, version = header["format"], header["format_version"]
        written = header["sklocus_version"]
        header["sha256"], header["estimator"]
    except (ValueError, TypeError, KeyError, RecursionError) as error:
        raise ModelFileError(
            f"{path} has a damaged sklocus description ({error!r})"
        ) from None
    if (
        fmt != _FORMAT
        or type(version) is not int
        or version < 1
        or not isinstance(written, str)
    ):
        raise ModelFileError(
            f"{path} describes format {fmt!r} version {version!r}; expected "
            f"{_FORMAT!r} version {_FORMAT_VERSION}"
        )
    if version > _FORMAT_VERSION:
        raise ModelFileError(
            f"{path} was written by sklocus {written} in model file format "
            f"{version}; sklocus {__version__} reads formats up to "
            f"{_FORMAT_VERSION}. Load it with a newer sklocus."
        )
    described = header["estimator"]
    name = described.get("class") if isinstance(described, dict) else None
    name = name if isinstance(name, str) else None  # the reader names the fault
    oldest = _OLDEST_FORMAT.get(name, _OLDEST_OTHERWISE)
    if version < oldest:
        what = f" for a {name}" if name in _OLDEST_FORMAT else ""
        raise ModelFileError(
            f"{path} was written by sklocus {written} in model file format "
            f"{version}, which sklocus {__version__} does not read{what} (it "
            f"reads formats {oldest} to {_FORMAT_VERSION}). Refit the estimator "
            "and save it again."
        )
    return header


def _refuse_constant(name):
    raise ValueError(f"{name} is not valid JSON; save writes none")


def _unique_keys(pairs):
    mapping = dict(pairs)
    if len(mapping) != len(pairs):
        raise ValueError("a key is given twice; save writes each once")
    return mapping


def _check_depth(node):
    """Refuse a description nested deeper than any sklocus writes."""
    stack = [(node, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > _MAX_DEPTH:
            raise ValueError(f"nested deeper than {_MAX_DEPTH} levels")
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)


def _checksum(description, arrays):
    """SHA-256 of the description and every array (name, dtype, shape, bytes).

    It detects damage and edits made without sklocus; it is not a signature (the
    version stamp beside it is not covered). Safety against a deliberate forger
    comes from loading data only.
    """
    digest = hashlib.sha256(json.dumps(description, sort_keys=True).encode())
    for key in sorted(arrays):
        array = np.require(arrays[key], requirements="C")
        digest.update(f"{key}|{array.dtype.str}|{array.shape}".encode())
        if array.size:  # the bytes, read in place rather than copied
            digest.update(memoryview(array.reshape(-1)).cast("B"))
    return digest.hexdigest()
