"""Rebuild an estimator from a model file's description, accepting data only."""

from __future__ import annotations

import inspect
import re
import warnings
from pathlib import Path

import numpy as np
import torch
from skorch.history import History

from sklocus._embedder import LocusEmbedder
from sklocus._persistence._schema import (
    CLASSES,
    FITTED,
    LATER,
    NESTED,
    OPTIONAL,
    accepts,
    describe,
    inconsistency,
)
from sklocus._persistence._writer import known_classes
from sklocus._router import LocusRouter
from sklocus._router._fitting import gather_stages, merge_calibration_settings
from sklocus._router._stages import STAGES
from sklocus.encoders import PrecomputedEncoder
from sklocus.nn.assembly import locus_network, release_training_state
from sklocus.nn.network import SIZE_LIMITS, LocusNetwork

_DEVICE = re.compile(r"(cpu|cuda)(:\d+)?")
_LABEL_WIDTH = re.compile(r"<U(\d+)")
_NETWORK_PARAMS = set(inspect.signature(LocusNetwork).parameters)
# Tags of a value, with the other keys each may have.
_TAGS = {
    "float": set(),
    "scalar": set(),
    "array": set(),
    "labels": {"dtype"},
    "texts": set(),
    "tuple": set(),
    "history": set(),
    "dict": set(),
    "path": set(),
    "device": set(),
}


class ModelFileError(ValueError):
    """A file that :func:`sklocus.load` refuses.

    It is not a sklocus model file, it was damaged or modified after it was saved,
    or it holds something other than the sklocus estimators and data it may hold.
    """


class Reader:
    """Rebuilds estimators from a description and the file's arrays."""

    def __init__(self, path, arrays, format_version=None):
        self.path = path
        self.arrays = arrays
        self.format_version = format_version
        self.used = set()
        self.built = {}  # where an estimator was described: the estimator

    def refuse(self, message):
        return ModelFileError(f"{self.path}: {message}")

    # -- estimators -------------------------------------------------------------

    def estimator(self, node, where):
        keys = {"class", "params", "fitted"}
        if not isinstance(node, dict) or not keys <= node.keys() <= {*keys, "stages"}:
            raise self.refuse(f"{where} is not an estimator description")
        name = node["class"]
        cls = CLASSES.get(name) if isinstance(name, str) else None
        if cls is None:
            raise self.refuse(
                f"{where} names class {name!r}; a sklocus model file holds only "
                f"{known_classes()}"
            )
        params, fitted = node["params"], node["fitted"]
        if not isinstance(params, dict) or not isinstance(fitted, dict):
            raise self.refuse(f"{where} ({name}) is not a valid description")
        if "stages" in node:
            fitted = self.with_stages(cls, fitted, node["stages"], where)
        if cls is LocusRouter and (self.format_version or 0) < 7:
            params = self.merged_calibration(params, where)
        if cls is LocusRouter and (self.format_version or 0) < 8:
            # Format 7's routers never clustered queries.
            params = {**params, "query_clusters": None}
        unknown = set(params) - set(cls._get_param_names())
        if unknown:
            raise self.refuse(
                f"{where} gives {name} unknown parameters {sorted(unknown)}"
            )
        # save writes every parameter: a file without one would load with today's
        # default, which need not be what it was fitted with.
        missing = set(cls._get_param_names()) - set(params)
        if missing:
            raise self.refuse(f"{where} ({name}) lacks parameters {sorted(missing)}")
        estimator = cls(
            **{
                key: self.attribute(v, key, f"{where}.{key}")
                for key, v in params.items()
            }
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

    def with_stages(self, cls, fitted, stages, where):
        """Return a router's fitted attributes with those of its stages (format 9).

        A stage null is one the router has not fitted: its attributes None.
        """
        if cls is not LocusRouter or (self.format_version or 0) < 9:
            raise self.refuse(
                f"{where} ({cls.__name__}) has stages, which only a LocusRouter "
                "of model file format 9 or later has"
            )
        if not isinstance(stages, dict) or stages.keys() != STAGES.keys():
            raise self.refuse(
                f"{where}.stages must map each of the stages {sorted(STAGES)} to "
                "its attributes, or null"
            )
        flat = dict(fitted)
        for name, stage in STAGES.items():
            held = stages[name]
            held = dict.fromkeys(stage.ATTRIBUTES) if held is None else held
            if not isinstance(held, dict):
                raise self.refuse(f"{where}.stages.{name} is not a mapping or null")
            for attribute in held:
                if attribute not in stage.ATTRIBUTES:
                    raise self.refuse(
                        f"{where}.stages.{name} sets {attribute!r}, which is not "
                        f"an attribute of the router's {name} stage"
                    )
                if attribute in fitted:
                    raise self.refuse(
                        f"{where} sets {attribute!r} twice: in fitted and in "
                        f"stages.{name}"
                    )
            flat.update(held)
        return flat

    def merged_calibration(self, params, where):
        """Read a format-6 router's calibrate and calibration_method as calibration."""
        old = ("calibrate", "calibration_method")
        if "calibration" in params or not set(old) <= params.keys():
            return params
        values = {
            key: self.attribute(params[key], key, f"{where}.{key}") for key in old
        }
        merged = merge_calibration_settings({**params, **values})
        if "calibration" not in merged:
            raise self.refuse(
                f"{where} has calibrate={values['calibrate']!r} and "
                f"calibration_method={values['calibration_method']!r}, which model "
                "file format 6 never held (a bool, and 'isotonic', 'sigmoid' or "
                "None): they cannot be read as one calibration"
            )
        return merged

    def attribute(self, node, name, where):
        """Read a parameter or fitted attribute: a value, or an estimator."""
        if isinstance(node, dict) and node.keys() in ({"estimator"}, {"same_as"}):
            return self.nested(node, name, where)
        if isinstance(node, dict) and node.keys() == {"network"}:
            if name != "net_":
                raise self.refuse(f"{where} holds a network, which it may not")
            return self.network(node["network"], where)
        return self.value(node, where)

    def nested(self, node, name, where):
        """Read an estimator held by a parameter or attribute, or one read before."""
        if name not in NESTED:
            raise self.refuse(f"{where} holds an estimator, which it may not")
        if "estimator" in node:
            estimator = self.built[where] = self.estimator(node["estimator"], where)
        else:
            # Stored once where first reached (a router's frozen embedder is both
            # its parameter and its fitted embedder_).
            reference = node["same_as"]
            estimator = (
                self.built.get(reference) if isinstance(reference, str) else None
            )
            if estimator is None:
                raise self.refuse(f"{where} refers to no estimator read before it")
        if not isinstance(estimator, NESTED[name]):
            raise self.refuse(
                f"{where} is a {type(estimator).__name__}; expected "
                f"{describe(NESTED[name])}"
            )
        return estimator

    def set_fitted(self, estimator, fitted, where):
        cls = type(estimator)
        expected = FITTED[cls]
        missing = expected.keys() - fitted.keys()
        if missing:
            raise self.refuse(
                f"{where} ({cls.__name__}) lacks fitted attributes {sorted(missing)}"
            )
        values = {}
        for name, node in fitted.items():
            kind = expected.get(name, LATER.get(cls, {}).get(name, OPTIONAL.get(name)))
            if kind is None:
                raise self.refuse(
                    f"{where} sets {name!r}, which is not a {cls.__name__} attribute"
                )
            value = self.attribute(node, name, f"{where}.{name}")
            if isinstance(value, np.generic):
                value = value.item()
            if not accepts(kind, value):
                raise self.refuse(
                    f"{where}.{name} is a {_shown_type(value)}; expected "
                    f"{describe(kind)}"
                )
            values[name] = value
        if isinstance(estimator, LocusRouter):
            # Those of format 7 lack some, read as None.
            gather_stages(values, estimator.random_state)
        vars(estimator).update(values)
        if isinstance(estimator, LocusEmbedder):
            # Inference runs where the network is (the CPU when saved on a GPU
            # and loaded where none is).
            estimator.device_ = str(estimator.net_.device)
        problem = inconsistency(estimator)
        if problem:
            raise self.refuse(f"{where} does not fit together: {problem}")

    # -- values -----------------------------------------------------------------

    def value(self, node, where):
        if node is None or isinstance(node, bool | int | float | str):
            return node
        if isinstance(node, list):
            return [self.value(v, f"{where}[{i}]") for i, v in enumerate(node)]
        if not isinstance(node, dict) or not node:
            raise self.refuse(f"{where} is not a value a model file may hold")
        tag = next(iter(node))
        if tag not in _TAGS or node.keys() - {tag} != _TAGS[tag]:
            raise self.refuse(f"{where} holds {tag!r}, which a model file may not hold")
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
            return self.labels(content, node["dtype"], where)
        if tag == "texts" and isinstance(content, list) and len(content) == 2:
            return self.texts(*content, where)
        if tag in ("tuple", "history", "dict") and isinstance(content, list):
            items = self.value(content, where)
            if tag == "tuple":
                return tuple(items)
            if tag == "dict":
                return self.mapping(items, where)
            if all(isinstance(row, dict) for row in items):
                return History(items)
        if tag == "path" and isinstance(content, str):
            return Path(content)
        if tag == "device" and isinstance(content, str) and _DEVICE.fullmatch(content):
            return torch.device(content)
        raise self.refuse(f"{where} holds a damaged {tag!r} value")

    def array(self, key, where):
        if not isinstance(key, str) or key not in self.arrays:
            raise self.refuse(f"{where} refers to an array the file does not hold")
        self.used.add(key)
        array = self.arrays[key]
        # No fit stores a NaN or an infinity in an array; one would make every
        # probability NaN and every route the first model's.
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            raise self.refuse(f"{where} holds NaN or infinite values")
        return array

    def labels(self, items, dtype, where):
        values = self.value(items, where)
        if not all(_is_label(v) for v in values):
            raise self.refuse(f"{where} holds labels that are not texts or numbers")
        if dtype == "|O":
            array = np.empty(len(values), dtype=object)
            array[:] = values
            return array
        width = _LABEL_WIDTH.fullmatch(dtype) if isinstance(dtype, str) else None
        longest = max((len(v) for v in values if isinstance(v, str)), default=0)
        if (
            width is None
            or not all(isinstance(v, str) for v in values)
            # As wide as its longest label (none is cut), and no wider than need be.
            or not longest <= int(width[1]) <= longest + 1024
        ):
            raise self.refuse(f"{where} has labels of dtype {dtype!r}")
        return np.array(values, dtype=dtype)

    def texts(self, utf8, ends, where):
        """Read texts stored as UTF-8 bytes and where each ends."""
        utf8, ends = self.array(utf8, where), self.array(ends, where)
        if (
            utf8.dtype != np.uint8
            or utf8.ndim != 1
            or ends.dtype.kind not in "iu"
            or ends.ndim != 1
            or (ends[-1] if len(ends) else 0) != len(utf8)
            or (len(ends) and ends[0] < 0)
            or (np.diff(ends) < 0).any()
        ):
            raise self.refuse(f"{where} holds damaged texts")
        data = utf8.tobytes()
        starts = [0, *ends[:-1].tolist()]
        try:
            texts = [data[a:b].decode() for a, b in zip(starts, ends.tolist())]
        except UnicodeDecodeError:
            raise self.refuse(f"{where} holds texts that are not UTF-8") from None
        array = np.empty(len(texts), dtype=object)
        array[:] = texts
        return array

    def mapping(self, pairs, where):
        out = {}
        for pair in pairs:
            if not (isinstance(pair, list) and len(pair) == 2):
                raise self.refuse(f"{where} is not a valid mapping")
            key, item = pair
            try:
                out[key] = item
            except TypeError:
                raise self.refuse(f"{where} has an unhashable key") from None
        return out

    # -- the network ------------------------------------------------------------

    def network(self, node, where):
        if not isinstance(node, dict) or node.keys() != {
            "module_params",
            "weights",
            "device",
            "history",
        }:
            raise self.refuse(f"{where} is not a valid network description")
        module_params = self.value(node["module_params"], where)
        weights, device = node["weights"], node["device"]
        history = self.value(node["history"], where)
        if not (
            isinstance(module_params, dict)
            and module_params.keys() <= _NETWORK_PARAMS
            and all(_is_number(v) for v in module_params.values())
            and isinstance(weights, dict)
            and isinstance(device, str)
            and _DEVICE.fullmatch(device)
            and isinstance(history, History)
        ):
            raise self.refuse(f"{where} is not a valid network description")
        problem = architecture_problem(module_params)
        if problem:
            raise self.refuse(f"{where} describes no LOCUS network: {problem}")
        state = {
            name: self.array(key, f"{where}.{name}") for name, key in weights.items()
        }
        self.check_weights(module_params, state, where)
        net = locus_network(module_params, self.available(device))
        # Initialising draws random weights, all replaced below: keep the caller's
        # random stream as it was.
        with torch.random.fork_rng(devices=[]):
            net.initialize()
        # On the CPU the module takes the file's arrays as its weights (assign)
        # rather than copies of them: loading holds each weight once.
        net.module_.load_state_dict(
            {name: torch.from_numpy(array) for name, array in state.items()},
            assign=torch.device(net.device).type == "cpu",
        )
        net.history = history
        release_training_state(net)
        net.module_.eval()
        return net

    def check_weights(self, module_params, state, where):
        """Refuse weights that are not what the described network has.

        The network is first built on torch's meta device, which allocates
        nothing, so a file cannot make loading build a huge network.
        """
        try:
            with torch.device("meta"):
                expected = LocusNetwork(**module_params).state_dict()
        except (TypeError, ValueError, RuntimeError, AssertionError) as error:
            raise self.refuse(f"{where} describes no LOCUS network: {error}") from None
        if state.keys() != expected.keys():
            raise self.refuse(f"{where} does not hold the weights its network has")
        for name, tensor in expected.items():
            array = state[name]
            if array.dtype != np.float32 or array.shape != tuple(tensor.shape):
                raise self.refuse(
                    f"{where}.{name} is {array.dtype} of shape {array.shape}; its "
                    f"network has float32 of shape {tuple(tensor.shape)}"
                )

    def available(self, device):
        """``device``, or the nearest this machine has (with a warning)."""
        if not device.startswith("cuda"):
            return device
        index = int(device.partition(":")[2] or 0)
        if not torch.cuda.is_available():
            fallback, reason = "cpu", "no CUDA device is available here"
        elif index >= torch.cuda.device_count():
            fallback, reason = "cuda", f"this machine has no {device}"
        else:
            return device
        warnings.warn(
            f"{self.path} was saved with its network on {device}, and {reason}: it "
            f"loads on {fallback}",
            stacklevel=5,
        )
        return fallback


def architecture_problem(module_params):
    """Say what in a network's sizes no fit can give (or None).

    Checked before anything is built: a description of a few bytes could
    otherwise declare millions of layers.
    """
    if "query_dim" not in module_params:
        return "it gives no query_dim"
    for name, value in module_params.items():
        if name == "dropout":
            if not 0 <= value < 1:
                return f"dropout is {value!r}; expected a number in [0, 1)"
        elif type(value) is not int or not 0 <= value <= SIZE_LIMITS[name]:
            limit = SIZE_LIMITS[name]
            return f"{name} is {value!r}; expected an integer from 0 to {limit}"
    return None


def _is_number(value):
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_label(value):
    if isinstance(value, tuple):
        return all(_is_label(v) for v in value)
    return value is None or isinstance(value, bool | int | float | str)


def _shown_type(value):
    if isinstance(value, np.ndarray):
        return f"{value.ndim}-D array of dtype {value.dtype}"
    return type(value).__name__
