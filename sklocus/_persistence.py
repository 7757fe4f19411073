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
import math
import os
import tempfile
import warnings
from pathlib import Path, PurePath

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file
from skorch import NeuralNet
from skorch.history import History

from sklocus._embedder import LocusEmbedder, locus_network, release_training_state
from sklocus._router import LocusRouter
from sklocus._selection import (
    CoverageGreedySelector,
    KCenterSelector,
    KMedoidsSelector,
)
from sklocus._versioning import __version__, warn_if_other_version
from sklocus.encoders import PrecomputedEncoder, SentenceEncoder

__all__ = ["ModelFileError", "load", "save"]

_FORMAT = "sklocus-estimator"
# Bump when a file written now could not be read by an older sklocus.
_FORMAT_VERSION = 1
_METADATA_KEY = "sklocus"
_NONE = type(None)

_SELECTED = {
    "selected_indices_": np.ndarray,
    "cluster_centers_": np.ndarray,
    "labels_": np.ndarray,
    "n_features_in_": int,
}
# Each class load rebuilds, with the type of each of its fitted attributes. A file
# naming any other class, or holding another type, is refused.
_FITTED = {
    LocusEmbedder: {
        "query_encoder_": (SentenceEncoder, PrecomputedEncoder),
        "query_dim_": int,
        "device_": str,
        "query_centroids_": np.ndarray,
        "query_radius_": float,
        "net_": NeuralNet,
    },
    LocusRouter: {
        "embedder_": LocusEmbedder,
        "embeddings_": np.ndarray,
        "classes_": np.ndarray,
        "cost_": (np.ndarray, _NONE),
    },
    KCenterSelector: {**_SELECTED, "radius_": float},
    KMedoidsSelector: {**_SELECTED, "inertia_": float, "n_iter_": int},
    CoverageGreedySelector: {**_SELECTED, "coverage_": float, "total_cost_": float},
    SentenceEncoder: {},
    PrecomputedEncoder: {},
}
# Fitted attributes that only some fits set (scikit-learn's, from a DataFrame).
_OPTIONAL = {"feature_names_in_": np.ndarray}
_CLASSES = {cls.__name__: cls for cls in _FITTED}


class ModelFileError(ValueError):
    """A file that :func:`sklocus.load` refuses.

    It is not a sklocus model file, it was damaged or modified after it was saved,
    or it holds something other than the sklocus estimators and data it may hold.
    """


def save(estimator, path):
    """Save an estimator to a file that :func:`load` reads without running code.

    Parameters
    ----------
    estimator : LocusEmbedder, LocusRouter or selector, fitted or not
        Also :class:`~sklocus.encoders.SentenceEncoder` and
        :class:`~sklocus.encoders.PrecomputedEncoder`. A ``SentenceEncoder`` is
        stored by its settings: loading needs the same sentence-transformers model
        on that machine.
    path : str or path-like
        File to write (replaced if it exists). ``.sklocus`` is a good suffix; the
        file is a valid safetensors file.

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
    writer = _Writer()
    description = writer.estimator(estimator, type(estimator).__name__)
    header = {
        "format": _FORMAT,
        "format_version": _FORMAT_VERSION,
        "sklocus_version": __version__,
        "sha256": _checksum(description, writer.arrays),
        "estimator": description,
    }
    metadata = {_METADATA_KEY: json.dumps(header, allow_nan=False)}
    path = Path(path)
    # Written beside the target and renamed: a failure never leaves half a file.
    handle, temporary = tempfile.mkstemp(dir=path.parent, suffix=".partial")
    os.close(handle)
    try:
        save_file(writer.arrays, temporary, metadata=metadata)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def load(path):
    """Load an estimator saved by :func:`save`, running nothing from the file.

    Parameters
    ----------
    path : str or path-like
        File written by :func:`save`.

    Returns
    -------
    estimator
        Fitted as it was when saved; embeddings, probabilities and routes are
        bit-identical to the saved estimator's on the same machine.

    Raises
    ------
    ModelFileError
        When the file is not a sklocus model file, was damaged or modified, was
        written in a newer format than this sklocus reads, or holds anything but
        the expected classes and types.

    Warns
    -----
    SklocusVersionWarning
        When the file was written by another version of sklocus.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no model file at {path}")
    try:
        with safe_open(path, framework="np") as file:
            metadata = file.metadata() or {}
            arrays = {key: file.get_tensor(key) for key in file.keys()}
    except (SafetensorError, OSError, ValueError) as error:
        raise ModelFileError(
            f"{path} is not a sklocus model file (it is not a readable safetensors "
            f"file: {error})"
        ) from None
    header = _read_header(path, metadata)
    if header["sha256"] != _checksum(header["estimator"], arrays):
        raise ModelFileError(
            f"{path} does not match the checksum recorded when it was saved: it was "
            "damaged or modified since"
        )
    warn_if_other_version(header["sklocus_version"], f"The model file {path}")
    reader = _Reader(path, arrays)
    described = header["estimator"]
    name = described.get("class") if isinstance(described, dict) else None
    estimator = reader.estimator(described, name if name in _CLASSES else "the file")
    unused = set(arrays) - reader.used
    if unused:
        raise ModelFileError(
            f"{path} holds arrays its description does not use "
            f"({', '.join(sorted(unused)[:3])}): it was modified since it was saved"
        )
    return estimator


def _read_header(path, metadata):
    """Return the checked JSON header of a model file."""
    text = metadata.get(_METADATA_KEY)
    if text is None:
        raise ModelFileError(
            f"{path} is a safetensors file but not a sklocus model file (its header "
            "has no sklocus description); sklocus.load reads files from sklocus.save"
        )
    try:
        header = json.loads(text)
        fmt, version = header["format"], header["format_version"]
        header["sklocus_version"], header["sha256"], header["estimator"]
    except (ValueError, TypeError, KeyError) as error:
        raise ModelFileError(
            f"{path} has a damaged sklocus description ({error!r})"
        ) from None
    if fmt != _FORMAT or not isinstance(version, int) or version < 1:
        raise ModelFileError(
            f"{path} describes format {fmt!r} version {version!r}; expected "
            f"{_FORMAT!r} version 1 to {_FORMAT_VERSION}"
        )
    if version > _FORMAT_VERSION:
        raise ModelFileError(
            f"{path} was written by sklocus {header['sklocus_version']} in model file "
            f"format {version}; sklocus {__version__} reads formats up to "
            f"{_FORMAT_VERSION}. Load it with a newer sklocus."
        )
    return header


def _checksum(description, arrays):
    """SHA-256 of the description and every array (name, dtype, shape, bytes).

    It detects damage and edits made without sklocus; it is not a signature. Safety
    against a deliberate forger comes from loading data only.
    """
    digest = hashlib.sha256(json.dumps(description, sort_keys=True).encode())
    for key in sorted(arrays):
        array = np.require(arrays[key], requirements="C")
        digest.update(f"{key}|{array.dtype.str}|{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


# -- writing ------------------------------------------------------------------------


class _Writer:
    """Turn an estimator into a JSON description plus named arrays."""

    def __init__(self):
        self.arrays = {}
        self.keys = {}
        self.kept = []

    def estimator(self, estimator, where):
        cls = type(estimator)
        if _CLASSES.get(cls.__name__) is not cls:
            raise TypeError(
                f"{where} is a {cls.__name__}; a sklocus model file holds only "
                f"{_known_classes()}. Use joblib for other objects, and load such "
                "files only from sources you trust."
            )
        if getattr(estimator, "callbacks", None):
            raise TypeError(
                f"{where}.callbacks holds skorch callbacks, which are code and not "
                "data, so a model file cannot store them. They act only during fit: "
                "set_params(callbacks=None) before saving, or use joblib for files "
                "you trust."
            )
        params = estimator.get_params(deep=False)
        fitted = {
            name: value
            for name, value in vars(estimator).items()
            if name.endswith("_") and not name.startswith("_") and name not in params
        }
        allowed = _FITTED[cls].keys() | _OPTIONAL.keys()
        for name in fitted:
            if name not in allowed:
                raise TypeError(
                    f"{where}.{name} is not a fitted attribute a {cls.__name__} model "
                    "file stores"
                )
        return {
            "class": cls.__name__,
            "params": {
                name: self.value(value, f"{where}.{name}")
                for name, value in params.items()
            },
            "fitted": {
                name: self.value(value, f"{where}.{name}")
                for name, value in fitted.items()
            },
        }

    def value(self, value, where):
        if value is None or isinstance(value, bool | str):
            return value
        if type(value) is int:
            return value
        if type(value) is float:
            return value if math.isfinite(value) else {"float": repr(value)}
        if isinstance(value, np.generic):
            return {"scalar": self.array(np.asarray(value), where)}
        if isinstance(value, np.ndarray):
            return self.ndarray(value, where)
        if type(value) is tuple:
            return {
                "tuple": [self.value(v, f"{where}[{i}]") for i, v in enumerate(value)]
            }
        if type(value) is list:
            return [self.value(v, f"{where}[{i}]") for i, v in enumerate(value)]
        if isinstance(value, History):
            return {
                "history": [
                    self.value(row, f"{where}[{i}]") for i, row in enumerate(value)
                ]
            }
        if type(value) is dict:
            return {
                "dict": [
                    [self.value(k, f"{where} key"), self.value(v, f"{where}[{k!r}]")]
                    for k, v in value.items()
                ]
            }
        if isinstance(value, PurePath):
            return {"path": str(value)}
        if isinstance(value, torch.device):
            return {"device": str(value)}
        if isinstance(value, NeuralNet):
            return self.network(value, where)
        if hasattr(value, "get_params"):
            return {"estimator": self.estimator(value, where)}
        raise TypeError(
            f"{where} is a {type(value).__name__}, which a sklocus model file cannot "
            "store (it holds numbers, strings, lists, tuples, dicts, arrays, paths "
            "and sklocus estimators). Use joblib for other objects, and load such "
            "files only from sources you trust."
        )

    def ndarray(self, array, where):
        if array.dtype.kind in "biuf":
            return {"array": self.array(array, where)}
        if array.dtype.kind in "UO" and array.ndim == 1:
            return {
                "labels": [
                    self.value(v.item() if isinstance(v, np.generic) else v, where)
                    for v in array
                ],
                "dtype": array.dtype.str,
            }
        raise TypeError(
            f"{where} is an array of dtype {array.dtype} and shape {array.shape}; a "
            "model file stores numeric arrays and 1-D arrays of labels"
        )

    def array(self, array, where):
        # An array reached twice (the query encoder is both a parameter and a
        # fitted attribute) is stored once.
        known = self.keys.get(id(array))
        if known is not None:
            return known
        self.keys[id(array)] = where
        self.kept.append(array)  # keeps ids unique while saving
        self.arrays[where] = np.require(array, requirements="C")
        return where

    def network(self, net, where):
        module_params = {
            name.removeprefix("module__"): value
            for name, value in net.get_params().items()
            if name.startswith("module__")
        }
        weights = {
            name: self.array(tensor.detach().cpu().numpy(), f"{where}.{name}")
            for name, tensor in net.module_.state_dict().items()
        }
        return {
            "network": {
                "module_params": self.value(module_params, f"{where}.module_params"),
                "weights": weights,
                "device": str(net.device),
                "history": self.value(_plain(net.history), f"{where}.history"),
            }
        }


def _plain(value):
    """``value`` with numpy scalars turned into Python ones (training history)."""
    if isinstance(value, History):
        return History(_plain(list(value)))
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value.item() if isinstance(value, np.generic) else value


def _known_classes():
    return ", ".join(sorted(_CLASSES))


# -- reading ------------------------------------------------------------------------


class _Reader:
    """Rebuild an estimator from a description, accepting data only."""

    def __init__(self, path, arrays):
        self.path = path
        self.arrays = arrays
        self.used = set()

    def refuse(self, message):
        return ModelFileError(f"{self.path}: {message}")

    def estimator(self, node, where):
        if (
            not isinstance(node, dict)
            or not {"class", "params", "fitted"} <= node.keys()
        ):
            raise self.refuse(f"{where} is not an estimator description")
        cls = _CLASSES.get(node["class"])
        if cls is None:
            raise self.refuse(
                f"{where} names class {node['class']!r}; a sklocus model file holds "
                f"only {_known_classes()}"
            )
        params, fitted = node["params"], node["fitted"]
        if not isinstance(params, dict) or not isinstance(fitted, dict):
            raise self.refuse(f"{where} ({cls.__name__}) is not a valid description")
        unknown = set(params) - set(cls._get_param_names())
        if unknown:
            raise self.refuse(
                f"{where} gives {cls.__name__} unknown parameters {sorted(unknown)}"
            )
        estimator = cls(
            **{name: self.value(v, f"{where}.{name}") for name, v in params.items()}
        )
        try:
            if hasattr(cls, "_parameter_constraints"):
                estimator._validate_params()
            if isinstance(estimator, PrecomputedEncoder):
                estimator.fit()
        except (ValueError, TypeError) as error:
            raise self.refuse(f"{where} has invalid parameters: {error}") from None
        if fitted:
            self.set_fitted(estimator, fitted, where)
        return estimator

    def set_fitted(self, estimator, fitted, where):
        cls = type(estimator)
        expected = _FITTED[cls]
        missing = expected.keys() - fitted.keys()
        if missing:
            raise self.refuse(
                f"{where} ({cls.__name__}) lacks fitted attributes {sorted(missing)}"
            )
        for name, node in fitted.items():
            kind = expected.get(name, _OPTIONAL.get(name))
            if kind is None:
                raise self.refuse(
                    f"{where} sets {name!r}, which is not a {cls.__name__} attribute"
                )
            value = self.value(node, f"{where}.{name}")
            if isinstance(value, np.generic):
                value = value.item()
            if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
                raise self.refuse(
                    f"{where}.{name} is a {type(value).__name__}; expected "
                    f"{_kind_name(kind)}"
                )
            vars(estimator)[name] = value
        if isinstance(estimator, LocusEmbedder):
            # Inference runs where the network is (the CPU when saved on a GPU
            # and loaded where none is).
            estimator.device_ = str(estimator.net_.device)

    def value(self, node, where):
        if node is None or isinstance(node, bool | int | float | str):
            return node
        if isinstance(node, list):
            return [self.value(v, f"{where}[{i}]") for i, v in enumerate(node)]
        if not isinstance(node, dict) or len(node) not in (1, 2):
            raise self.refuse(f"{where} is not a value a model file may hold")
        tag = next(iter(node))
        content = node[tag]
        if tag == "float" and content in ("nan", "inf", "-inf"):
            return float(content)
        if tag == "scalar":
            array = self.array(content, where)
            if array.ndim:
                raise self.refuse(f"{where} should be a scalar")
            return array[()]
        if tag == "array":
            return self.array(content, where)
        if tag == "labels" and isinstance(content, list):
            return self.labels(content, node.get("dtype"), where)
        if tag == "tuple" and isinstance(content, list):
            return tuple(self.value(content, where))
        if tag == "history" and isinstance(content, list):
            return History(self.value(content, where))
        if tag == "dict" and isinstance(content, list):
            return self.mapping(content, where)
        if tag == "path" and isinstance(content, str):
            return Path(content)
        if tag == "device" and isinstance(content, str):
            return torch.device(content)
        if tag == "estimator":
            return self.estimator(content, where)
        if tag == "network" and isinstance(content, dict):
            return self.network(content, where)
        raise self.refuse(f"{where} holds {tag!r}, which a model file may not hold")

    def array(self, key, where):
        if not isinstance(key, str) or key not in self.arrays:
            raise self.refuse(f"{where} refers to an array the file does not hold")
        self.used.add(key)
        return self.arrays[key]

    def labels(self, items, dtype, where):
        if dtype not in ("|O", "O") and not (
            isinstance(dtype, str) and dtype.lstrip("<>|=").startswith("U")
        ):
            raise self.refuse(f"{where} has labels of dtype {dtype!r}")
        values = self.value(items, where)
        array = np.empty(len(values), dtype=object)
        array[:] = values
        return array.astype(np.dtype(dtype)) if dtype not in ("|O", "O") else array

    def mapping(self, pairs, where):
        out = {}
        for pair in pairs:
            if not (isinstance(pair, list) and len(pair) == 2):
                raise self.refuse(f"{where} is not a valid mapping")
            key = self.value(pair[0], f"{where} key")
            try:
                out[key] = self.value(pair[1], f"{where}[{key!r}]")
            except TypeError:
                raise self.refuse(f"{where} has an unhashable key") from None
        return out

    def network(self, node, where):
        try:
            module_params = self.value(node["module_params"], where)
            weights = node["weights"]
            device = node["device"]
            history = self.value(node["history"], where)
        except KeyError as error:
            raise self.refuse(f"{where} lacks {error}") from None
        if not (
            isinstance(module_params, dict)
            and isinstance(weights, dict)
            and isinstance(device, str)
            and isinstance(history, History)
        ):
            raise self.refuse(f"{where} is not a valid network description")
        if device.startswith("cuda") and not torch.cuda.is_available():
            warnings.warn(
                f"{self.path} was saved with its network on {device}, and no CUDA "
                "device is available here: it loads on the CPU",
                stacklevel=4,
            )
            device = "cpu"
        state = {
            name: torch.from_numpy(self.array(key, f"{where}.{name}").copy())
            for name, key in weights.items()
        }
        try:
            net = locus_network(module_params, device)
            # Initialising draws random weights, all replaced below: keep the
            # caller's random stream as it was.
            with torch.random.fork_rng(devices=[]):
                net.initialize()
            net.module_.load_state_dict(state, strict=True)
        except (TypeError, ValueError, RuntimeError) as error:
            raise self.refuse(
                f"{where} does not describe a LOCUS network: {error}"
            ) from None
        net.history = history
        release_training_state(net)
        net.module_.eval()
        return net


def _kind_name(kind):
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join("None" if k is _NONE else k.__name__ for k in kinds)
