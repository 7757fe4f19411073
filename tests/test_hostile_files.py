"""Model files written by an attacker: refused before anything is built, or safe.

An attacker can recompute a file's checksum, so every check here is of what the
file says, never of whether it was changed.
"""

import json
import os
import re
import struct

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from model_file_edits import holder, rewrite, set_module_param
from safetensors import safe_open
from safetensors.numpy import save_file
from sklearn.frozen import FrozenEstimator
from tiny import TINY_NETWORK, TINY_POOL

import sklocus
import sklocus._persistence
from sklocus import LocusEmbedder, LocusRouter, ModelFileError
from sklocus.datasets import make_evaluations
from sklocus.evaluations import to_matrix


@pytest.fixture(scope="module")
def data():
    return make_evaluations(**TINY_POOL)


@pytest.fixture(scope="module")
def router(data):
    scores, queries = to_matrix(data.evaluation_sets)
    Y = pd.DataFrame(scores, columns=data.model_names)
    embedder = LocusEmbedder(query_encoder=data.encoder, **TINY_NETWORK)
    cost = np.arange(1.0, len(data.model_names) + 1)
    return LocusRouter(embedder, refine_steps=2).fit(queries, Y, cost=cost)


@pytest.fixture
def saved(router, tmp_path):
    path = tmp_path / "router.sklocus"
    sklocus.save(router, path)
    return path


def _fitted(header):
    return header["estimator"]["fitted"]


def _embedder(header):
    return holder(header, "embedder_")["embedder_"]["estimator"]


def _scalar_edit(path, attribute, value):
    """Set an embedder's float attribute, however it was stored."""

    def edit(header):
        _embedder(header)["fitted"][attribute] = (
            value if np.isfinite(value) else {"float": repr(value)}
        )

    rewrite(path, edit)


# -- finding 1: a huge network declared in a few bytes ----------------------------


@pytest.mark.parametrize(
    "name, value", [("n_layers", 10_000), ("embedding_dim", 4_000_000)]
)
def test_a_huge_declared_network_is_refused_before_anything_is_built(
    saved, monkeypatch, name, value
):
    built = []
    original = sklocus._persistence._reader.LocusNetwork
    monkeypatch.setattr(
        sklocus._persistence._reader,
        "LocusNetwork",
        lambda **kwargs: built.append(kwargs) or original(**kwargs),
    )
    rewrite(saved, lambda header: set_module_param(header, name, value))
    with pytest.raises(
        ModelFileError, match=rf"{name} is {value}; expected an integer"
    ):
        sklocus.load(saved)
    assert not built


def test_a_declared_size_the_tensors_do_not_have_is_refused(saved):
    rewrite(saved, lambda header: set_module_param(header, "predictor_hidden", 9))
    with pytest.raises(ModelFileError, match=r"predictor.*of shape .*its network has"):
        sklocus.load(saved)


# -- finding 2: the header -------------------------------------------------------


def test_an_oversized_header_is_refused_without_parsing_it(tmp_path):
    path = tmp_path / "big.sklocus"
    limit = sklocus._persistence.MAX_HEADER_BYTES
    # A valid safetensors file whose header is just over the limit.
    save_file(
        {"x": np.zeros(1, np.float32)},
        path,
        metadata={"sklocus": "{}", "padding": " " * limit},
    )
    with pytest.raises(ModelFileError, match=r"declares a header of [\d,]+ bytes"):
        sklocus.load(path)


def test_a_file_declaring_an_enormous_header_is_refused(tmp_path):
    path = tmp_path / "liar.sklocus"
    path.write_bytes(struct.pack("<Q", 2**62) + b"{}")
    with pytest.raises(ModelFileError, match="is not a sklocus model file"):
        sklocus.load(path)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda h: h.update({"comment": "x"}), r"holds \['comment', 'estimator'"),
        (lambda h: h.pop("format"), r"expected \['estimator', 'format'"),
    ],
)
def test_unknown_or_missing_header_keys_are_refused(saved, edit, message):
    rewrite(saved, edit)
    with pytest.raises(ModelFileError, match=message):
        sklocus.load(saved)


def test_metadata_beside_the_description_is_refused(saved):
    with safe_open(saved, "np") as file:
        arrays = {key: file.get_tensor(key) for key in file.keys()}
        metadata = file.metadata()
    save_file(arrays, saved, metadata={**metadata, "extra": "1"})
    with pytest.raises(ModelFileError, match=r"has metadata 'extra' beside"):
        sklocus.load(saved)


def test_a_key_given_twice_is_refused(saved):
    with safe_open(saved, "np") as file:
        arrays = {key: file.get_tensor(key) for key in file.keys()}
        text = file.metadata()["sklocus"]
    # JSON parsers keep the last of two keys; the file must not mean two things.
    doubled = text.replace('{"format": ', '{"format": "other", "format": ', 1)
    save_file(arrays, saved, metadata={"sklocus": doubled})
    with pytest.raises(ModelFileError, match="a key is given twice"):
        sklocus.load(saved)


# -- finding 3: values no fit can produce ------------------------------------------


def _first_weight(arrays):
    return next(key for key in sorted(arrays) if ".net_." in key)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite_weights_are_refused_naming_them(saved, bad):
    def poison(arrays):
        key = _first_weight(arrays)
        arrays[key] = arrays[key].copy()
        arrays[key].flat[0] = bad

    rewrite(saved, lambda header: None, poison)
    with pytest.raises(ModelFileError, match=r"net_\.\S+ holds NaN or infinite values"):
        sklocus.load(saved)


def test_non_finite_embeddings_are_refused(saved):
    def poison(arrays):
        arrays["LocusRouter.embeddings_"] = arrays["LocusRouter.embeddings_"].copy()
        arrays["LocusRouter.embeddings_"][3, 0] = np.nan

    rewrite(saved, lambda header: None, poison)
    with pytest.raises(ModelFileError, match=r"embeddings_ holds NaN or infinite"):
        sklocus.load(saved)


@pytest.mark.parametrize(
    ("array", "value", "largest"),
    [("embeddings_", 1e30, "10000"), ("head_biases_", 3e4, "100")],
)
def test_absurd_finite_values_are_refused_naming_the_array(
    saved, array, value, largest
):
    """Issue 70, F19: a file with embeddings of 1e30 or offsets of 3e4 loaded
    and routed every query to one model."""
    key = f"LocusRouter.{array}"

    def poison(arrays):
        arrays[key] = arrays[key].copy()
        arrays[key].flat[1] = value

    rewrite(saved, lambda header: None, poison)
    message = f"{array} hold a value of magnitude {value:.3g}; a fit gives at most"
    with pytest.raises(ModelFileError, match=re.escape(f"{message} {largest}")):
        sklocus.load(saved)


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), float("inf")])
def test_an_impossible_embedding_scale_is_refused(saved, scale):
    _scalar_edit(saved, "embedding_scale_", scale)
    with pytest.raises(
        ModelFileError, match=r"embedding_scale_ is .*; a fit gives > 0"
    ):
        sklocus.load(saved)


@pytest.mark.parametrize("cost", [np.nan, -1.0])
def test_an_impossible_cost_is_refused_naming_the_model(saved, router, cost):
    def poison(arrays):
        arrays["LocusRouter.cost_"] = arrays["LocusRouter.cost_"].copy()
        arrays["LocusRouter.cost_"][2] = cost

    rewrite(saved, lambda header: None, poison)
    name = router.classes_[2]
    message = rf"model '{name}' has cost|cost_ holds NaN"
    with pytest.raises(ModelFileError, match=message):
        sklocus.load(saved)


def test_duplicate_model_names_are_refused(saved, router):
    def duplicate(header):
        labels = _fitted(header)["classes_"]["labels"]
        labels[1] = labels[0]

    rewrite(saved, duplicate)
    with pytest.raises(ModelFileError, match=rf"hold '{router.classes_[0]}' twice"):
        sklocus.load(saved)


def test_a_model_name_with_a_control_character_is_refused(saved):
    rewrite(saved, lambda h: _fitted(h)["classes_"]["labels"].__setitem__(0, "a\nb"))
    with pytest.raises(ModelFileError, match="holds a control character"):
        sklocus.load(saved)


def test_a_router_of_no_models_is_refused(saved):
    def no_rows(arrays):
        for name in ("embeddings_", "cost_"):
            arrays[f"LocusRouter.{name}"] = arrays[f"LocusRouter.{name}"][:0]

    rewrite(saved, lambda h: _fitted(h)["classes_"].update(labels=[]), no_rows)
    with pytest.raises(ModelFileError, match=r"routes to no model"):
        sklocus.load(saved)


def test_settings_that_contradict_the_tensors_are_refused(saved):
    rewrite(saved, lambda header: set_module_param(header, "embedding_dim", 16))
    with pytest.raises(ModelFileError, match="its network has float32 of shape"):
        sklocus.load(saved)


# -- smaller findings -----------------------------------------------------------------


@pytest.mark.slow
def test_a_frozen_embedder_is_stored_once(data, router, tmp_path):
    frozen = LocusRouter(FrozenEstimator(router.embedder_)).fit(
        *_table(data), cost=router.cost_
    )
    path = tmp_path / "frozen.sklocus"
    sklocus.save(frozen, path)
    with safe_open(path, "np") as file:
        weights = [key for key in file.keys() if ".net_." in key]
    assert len(weights) == len(router.embedder_.net_.module_.state_dict())
    loaded = sklocus.load(path)
    assert loaded.embedder_ is loaded.embedder
    queries = _table(data)[0][:10]
    np.testing.assert_array_equal(
        loaded.predict_proba(queries), frozen.predict_proba(queries)
    )


def test_a_reference_to_no_estimator_is_refused(data, router, tmp_path):
    path = tmp_path / "frozen.sklocus"
    sklocus.save(LocusRouter(FrozenEstimator(router.embedder_)), path)
    rewrite(
        path, lambda h: h["estimator"]["params"].update({"embedder": {"same_as": "x"}})
    )
    with pytest.raises(ModelFileError, match="refers to no estimator read before it"):
        sklocus.load(path)


def test_save_writes_through_a_symbolic_link(router, tmp_path):
    target = tmp_path / "models" / "router.sklocus"
    target.parent.mkdir()
    target.write_bytes(b"old")
    link = tmp_path / "current.sklocus"
    link.symlink_to(target)
    sklocus.save(router, link)
    assert link.is_symlink()
    assert isinstance(sklocus.load(target), LocusRouter)


def _table(data):
    scores, queries = to_matrix(data.evaluation_sets)
    return queries, pd.DataFrame(scores, columns=data.model_names)


# -- fuzzing ---------------------------------------------------------------------------

_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63),
    st.floats(),
    st.text(max_size=8),
    st.lists(st.integers(-3, 10**6), max_size=3),
    st.dictionaries(
        st.sampled_from(["array", "float", "estimator", "same_as"]),
        st.text(max_size=30),
        max_size=1,
    ),
)


def _paths(node, prefix=()):
    """Every (path, value) of a JSON document."""
    yield prefix, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _paths(value, (*prefix, i))


def _set(node, path, value):
    for step in path[:-1]:
        node = node[step]
    if value is _DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value


_DELETE = object()


@pytest.fixture(scope="module")
def original(router, tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "router.sklocus"
    sklocus.save(router, path)
    with safe_open(path, "np") as file:
        arrays = {key: file.get_tensor(key) for key in file.keys()}
        header = json.loads(file.metadata()["sklocus"])
    return header, arrays


@pytest.mark.slow
@settings(
    max_examples=80,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(draw=st.data())
def test_mutated_files_are_refused_or_route_finitely(original, data, tmp_path, draw):
    header, arrays = json.loads(json.dumps(original[0])), dict(original[1])
    paths = [p for p, _ in _paths(header) if p]
    for _ in range(draw.draw(st.integers(1, 3), label="edits")):
        path = draw.draw(st.sampled_from(paths), label="path")
        value = draw.draw(st.one_of(_LEAVES, st.just(_DELETE)), label="value")
        try:
            _set(header, path, value)
        except (KeyError, IndexError, TypeError):
            pass  # an earlier edit removed or replaced the place
        paths = [p for p, _ in _paths(header) if p]
    if draw.draw(st.booleans(), label="edit an array"):
        key = draw.draw(st.sampled_from(sorted(arrays)), label="array")
        kind = draw.draw(st.sampled_from(["value", "shape", "dtype", "drop"]))
        array = arrays[key]
        if kind == "value" and array.size and array.dtype.kind == "f":
            array = array.copy()
            array.flat[0] = draw.draw(st.floats(width=32), label="float")
            arrays[key] = array
        elif kind == "shape":
            arrays[key] = np.concatenate([array.ravel(), array.ravel()[:1]])
        elif kind == "dtype":
            arrays[key] = array.astype(
                np.float64 if array.dtype != np.float64 else np.int8
            )
        elif kind == "drop":
            arrays.pop(key)
    try:
        header["sha256"] = sklocus._persistence._checksum(
            header.get("estimator"), arrays
        )
    except (TypeError, ValueError, AttributeError):
        pass
    path = tmp_path / f"fuzzed-{os.getpid()}.sklocus"
    save_file(arrays, path, metadata={"sklocus": json.dumps(header)})
    try:
        loaded = sklocus.load(path)
    except ValueError as error:  # ModelFileError among them
        assert str(path) in str(error) or "model file" in str(error)
        return
    if isinstance(loaded, LocusRouter):
        queries = _table(data)[0][:8]
        try:
            proba = loaded.predict_proba(queries)
        except ValueError as error:  # an edited query table: it names the query
            assert "query" in str(error)
            return
        assert np.isfinite(proba).all()
        assert set(loaded.predict(queries)) <= set(loaded.classes_)
