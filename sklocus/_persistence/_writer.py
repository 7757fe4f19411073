"""Turn an estimator into a JSON description plus named arrays."""

from __future__ import annotations

import math
from pathlib import PurePath

import numpy as np
import pandas as pd
import torch
from skorch import NeuralNet
from skorch.history import History

from sklocus._persistence._schema import CLASSES, FITTED, LATER, OPTIONAL
from sklocus._router import LocusRouter
from sklocus._router._stages import STAGES

# Array dtypes a safetensors file stores exactly.
_STORABLE = {"b": (1,), "i": (1, 2, 4, 8), "u": (1, 2, 4, 8), "f": (2, 4, 8)}
# A 1-D array of texts longer than this in all is stored as UTF-8 bytes in a
# tensor, not in the header: a router's evaluated queries can run to megabytes.
_TEXTS_IN_HEADER = 1 << 16
_ONLY_DATA = (
    "Use joblib for other objects, and load such files only from sources you trust."
)


def known_classes():
    return ", ".join(sorted(CLASSES))


class Writer:
    """Collects the arrays while it describes an estimator."""

    def __init__(self):
        self.arrays = {}
        self.names = {}  # id of an array already stored: its name
        self.kept = []  # the arrays named in self.names, alive so ids stay unique
        # id of an estimator already described: where. A router holding its
        # embedder frozen reaches the same one as a parameter and fitted.
        self.described = {}

    def estimator(self, estimator, where):
        cls = type(estimator)
        if CLASSES.get(cls.__name__) is not cls:
            raise TypeError(
                f"{where} is a {cls.__name__}; a sklocus model file holds only "
                f"{known_classes()}. {_ONLY_DATA}"
            )
        if getattr(estimator, "callbacks", None):
            raise TypeError(
                f"{where}.callbacks holds skorch callbacks, which are code and not "
                "data, so a model file cannot store them. They act only during fit: "
                "set_params(callbacks=None) before saving, or use joblib for files "
                "you trust."
            )
        for name in ("module", "criterion"):
            if getattr(estimator, name, None) is not None:
                raise TypeError(
                    f"{where}.{name} is {getattr(estimator, name)!r}, a custom class, "
                    "which is code and not data, so a model file cannot store it. "
                    "Use joblib for files you trust."
                )
        params = estimator.get_params(deep=False)
        # A router's fitted attributes are read from its stages.
        state = getattr(estimator, "_fitted_state", lambda: vars(estimator))()
        fitted = {
            name: value
            for name, value in state.items()
            if name.endswith("_") and not name.startswith("_") and name not in params
        }
        for name in fitted:
            if (
                name
                not in FITTED[cls].keys() | LATER.get(cls, {}).keys() | OPTIONAL.keys()
            ):
                raise TypeError(
                    f"{where}.{name} is not a fitted attribute a {cls.__name__} model "
                    "file stores"
                )
        node = {
            "class": cls.__name__,
            "params": {
                name: self.attribute(value, f"{where}.{name}")
                for name, value in params.items()
            },
            "fitted": {
                name: self.attribute(value, f"{where}.{name}")
                for name, value in fitted.items()
            },
        }
        if cls is LocusRouter and fitted:
            node["stages"] = _stage_nodes(node["fitted"])
        return node

    def attribute(self, value, where):
        """Describe a parameter or fitted attribute: a value, an estimator or a net."""
        if isinstance(value, NeuralNet):
            return self.network(value, where)
        if hasattr(value, "get_params"):
            if id(value) in self.described:
                return {"same_as": self.described[id(value)]}
            self.described[id(value)] = where
            self.kept.append(value)
            return {"estimator": self.estimator(value, where)}
        return self.value(value, where)

    def value(self, value, where):
        if value is None or isinstance(value, bool | str):
            return str(value) if isinstance(value, np.str_) else value
        if type(value) is int:
            return value
        if type(value) is float:
            return value if math.isfinite(value) else {"float": repr(value)}
        if isinstance(value, np.generic):
            return {"scalar": self.array(np.asarray(value), where)}
        if isinstance(value, np.ndarray):
            return self.ndarray(value, where)
        if type(value) is tuple:
            return {"tuple": self.items(value, where)}
        if type(value) is list:
            return self.items(value, where)
        if isinstance(value, History):
            return {"history": self.items(value, where)}
        if type(value) is dict:
            return {
                "dict": [
                    [
                        self.value(key, f"{where}.keys[{i}]"),
                        self.value(item, f"{where}[{key!r}]"),
                    ]
                    for i, (key, item) in enumerate(value.items())
                ]
            }
        if isinstance(value, PurePath):
            return {"path": str(value)}
        if isinstance(value, torch.device):
            return {"device": str(value)}
        hint = ""
        if isinstance(value, pd.Index | pd.Series):
            hint = " Pass list(...) of it to the estimator before saving."
        raise TypeError(
            f"{where} is a {type(value).__name__}, which a sklocus model file cannot "
            "store (it holds numbers, strings, lists, tuples, dicts, arrays, paths "
            f"and sklocus estimators).{hint} {_ONLY_DATA}"
        )

    def items(self, values, where):
        return [self.value(v, f"{where}[{i}]") for i, v in enumerate(values)]

    def ndarray(self, array, where):
        if isinstance(array, np.ma.MaskedArray) or type(array) is not np.ndarray:
            raise TypeError(
                f"{where} is a {type(array).__name__}; a model file stores plain "
                "numpy arrays"
            )
        if (
            array.dtype == object
            and array.ndim == 1
            and all(isinstance(v, str) for v in array)
            and sum(map(len, array)) > _TEXTS_IN_HEADER
        ):
            encoded = [str(text).encode() for text in array]
            ends = np.cumsum([len(b) for b in encoded], dtype=np.int64)
            utf8 = np.frombuffer(b"".join(encoded), dtype=np.uint8)
            return {
                "texts": [
                    self.array(utf8, f"{where}.utf8"),
                    self.array(ends, f"{where}.ends"),
                ]
            }
        if array.dtype.kind in "UO" and array.ndim == 1:
            return {
                "labels": [
                    self.value(
                        v.item() if isinstance(v, np.generic) else v, f"{where}[{i}]"
                    )
                    for i, v in enumerate(array)
                ],
                "dtype": array.dtype.str,
            }
        return {"array": self.array(array, where)}

    def array(self, array, where):
        if array.dtype.itemsize not in _STORABLE.get(array.dtype.kind, ()):
            raise TypeError(
                f"{where} is an array of dtype {array.dtype} and shape {array.shape}; "
                "a model file stores arrays of booleans, integers and floats (up to "
                "64 bits) and 1-D arrays of labels"
            )
        # An array reached twice (the query encoder is both a parameter and a
        # fitted attribute) is stored once.
        if id(array) in self.names:
            return self.names[id(array)]
        if where in self.arrays:  # names are paths, unique by construction
            raise RuntimeError(f"two arrays would be stored as {where!r}")
        self.names[id(array)] = where
        self.kept.append(array)
        native = array.dtype.newbyteorder("=")
        self.arrays[where] = np.require(
            array.astype(native, copy=False), requirements="C"
        )
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


def _stage_nodes(fitted):
    """Move a router's stages' attributes out of ``fitted``: one node per stage.

    A stage the router has not fitted (its attributes all None) is null.
    """
    stages = {}
    for name, stage in STAGES.items():
        held = {public: fitted.pop(public) for public in stage.ATTRIBUTES}
        stages[name] = None if all(v is None for v in held.values()) else held
    return stages
