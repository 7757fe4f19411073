"""sklocus.save / sklocus.load, and the version stamp of joblib pickles."""

import json
import pickle
import subprocess
import sys
import textwrap
import warnings

import joblib
import numpy as np
import pandas as pd
import pytest
import torch
from model_file_edits import as_format_8, holder, network, rewrite, set_module_param
from safetensors import safe_open
from safetensors import torch as safetensors_torch
from safetensors.numpy import save_file
from sklearn.base import clone
from sklearn.frozen import FrozenEstimator
from skorch.callbacks import EpochTimer
from tiny import TINY_NETWORK, TINY_POOL

import sklocus
import sklocus._persistence
import sklocus._versioning
from sklocus import (
    CoverageGreedySelector,
    KCenterSelector,
    KMedoidsSelector,
    LocusEmbedder,
    LocusRouter,
    ModelFileError,
    SklocusVersionWarning,
)
from sklocus._router._stages import STAGES
from sklocus.datasets import make_evaluations
from sklocus.encoders import PrecomputedEncoder, SentenceEncoder
from sklocus.evaluations import to_matrix
from sklocus.nn import LocusNetwork

# The newest model file format this sklocus writes and reads.
NEWEST = sklocus._persistence._FORMAT_VERSION

TINY = {**TINY_NETWORK, "max_epochs": 2}
# Rebuilt identically in the fresh processes below.
DATA_ARGS = TINY_POOL


@pytest.fixture(scope="module")
def data():
    return make_evaluations(**DATA_ARGS)


@pytest.fixture(scope="module")
def fitted(data):
    """The five estimators, fitted, and what each must reproduce after loading."""
    sets = data.evaluation_sets
    embedder = LocusEmbedder(query_encoder=data.encoder, **TINY).fit(sets)
    scores, queries = to_matrix(sets)
    Y = pd.DataFrame(scores, columns=data.model_names)
    cost = np.arange(1.0, len(data.model_names) + 1)
    router = LocusRouter(LocusEmbedder(query_encoder=data.encoder, **TINY)).fit(
        queries, Y, cost=cost
    )
    Z = embedder.transform(sets)
    return {
        "embedder": embedder,
        "router": router,
        "kcenter": KCenterSelector(n_selected=3).fit(Z),
        "kmedoids": KMedoidsSelector(n_selected=3, random_state=0).fit(Z),
        "coverage": CoverageGreedySelector(max_total_cost=4.0).fit(
            Z, cost=cost[: len(Z)]
        ),
    }


# What each estimator computes; the fresh processes run the same code.
OUTPUTS = textwrap.dedent(
    """
    import numpy as np
    from sklocus.datasets import make_evaluations
    from sklocus.evaluations import to_matrix

    def outputs(name, estimator, data):
        sets = data.evaluation_sets
        queries = to_matrix(sets)[1]
        if name == "embedder":
            Z = estimator.transform(sets)
            return {"Z": Z, "p": estimator.predict_correctness(Z, queries[:20])}
        if name == "router":
            return {
                "proba": estimator.predict_proba(queries[:20]),
                "routes": estimator.predict(queries[:20]).astype(str),
                "embeddings": estimator.embeddings_,
            }
        Z = np.random.default_rng(0).normal(size=(9, 8))
        return {
            "selected": estimator.selected_indices_,
            "distances": estimator.transform(Z),
            "labels": estimator.predict(Z),
        }
    """
)
exec(OUTPUTS)  # defines outputs()


def _expected(fitted, data):
    return {name: outputs(name, est, data) for name, est in fitted.items()}  # noqa: F821


def _check_in_fresh_process(paths, expected, reader, tmp_path):
    for name, arrays in expected.items():
        np.savez(tmp_path / f"{name}.expected.npz", **arrays)
    script = OUTPUTS + textwrap.dedent(
        f"""
        import joblib, sklocus, warnings
        warnings.simplefilter("error")  # same version: no warning at all
        data = make_evaluations(**{DATA_ARGS!r})
        for name, path in { ({k: str(v) for k, v in paths.items()})!r}.items():
            estimator = {reader}(path)
            got = outputs(name, estimator, data)
            expected = np.load({str(tmp_path)!r} + f"/{{name}}.expected.npz")
            for key, value in got.items():
                assert value.dtype == expected[key].dtype, (name, key)
                np.testing.assert_array_equal(value, expected[key], err_msg=name + key)
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True)


@pytest.mark.slow
def test_every_estimator_round_trips_bit_identically_in_a_fresh_process(
    fitted, data, tmp_path
):
    paths = {name: tmp_path / f"{name}.sklocus" for name in fitted}
    for name, estimator in fitted.items():
        sklocus.save(estimator, paths[name])
    _check_in_fresh_process(paths, _expected(fitted, data), "sklocus.load", tmp_path)


@pytest.mark.slow
def test_every_estimator_round_trips_through_joblib_in_a_fresh_process(
    fitted, data, tmp_path
):
    paths = {name: tmp_path / f"{name}.joblib" for name in fitted}
    for name, estimator in fitted.items():
        joblib.dump(estimator, paths[name])
    _check_in_fresh_process(paths, _expected(fitted, data), "joblib.load", tmp_path)


def test_loaded_estimators_keep_their_parameters_and_attributes(fitted, tmp_path):
    for name, estimator in fitted.items():
        sklocus.save(estimator, tmp_path / name)
        loaded = sklocus.load(tmp_path / name)
        assert type(loaded) is type(estimator)
        assert joblib.hash(loaded.get_params()) == joblib.hash(estimator.get_params())
    router = sklocus.load(tmp_path / "router")
    assert list(router.classes_) == list(fitted["router"].classes_)
    np.testing.assert_array_equal(router.cost_, fitted["router"].cost_)
    assert (
        router.embedder_.history_[-1]["train_loss"]
        == (fitted["router"].embedder_.history_[-1]["train_loss"])
    )


def test_how_training_went_is_kept_and_optional_in_older_files(fitted, tmp_path):
    embedder = fitted["embedder"]
    path = tmp_path / "embedder.sklocus"
    sklocus.save(embedder, path)
    loaded = sklocus.load(path)
    assert loaded.stop_reason_ == embedder.stop_reason_
    assert loaded.encoding_time_ == embedder.encoding_time_
    # A file written before sklocus recorded them still loads, without them.
    rewrite(
        path,
        lambda h: [
            h["estimator"]["fitted"].pop(name)
            for name in ("stop_reason_", "encoding_time_")
        ],
    )
    older = sklocus.load(path)
    assert not hasattr(older, "stop_reason_") and not hasattr(older, "encoding_time_")
    rewrite(path, lambda h: h["estimator"]["fitted"].update(stop_reason_="bored"))
    with pytest.raises(ModelFileError, match="stop_reason_ is 'bored', not one of"):
        sklocus.load(path)


@pytest.mark.slow
def test_a_router_over_a_frozen_embedder_round_trips(fitted, data, tmp_path):
    scores, queries = to_matrix(data.evaluation_sets)
    Y = pd.DataFrame(scores, columns=data.model_names)
    router = LocusRouter(FrozenEstimator(fitted["embedder"])).fit(queries, Y)
    sklocus.save(router, tmp_path / "router")
    loaded = sklocus.load(tmp_path / "router")
    assert isinstance(loaded.embedder_, FrozenEstimator)
    assert isinstance(loaded.embedder_.estimator, LocusEmbedder)
    np.testing.assert_array_equal(loaded.embeddings_, router.embeddings_)
    np.testing.assert_array_equal(
        loaded.predict_correctness(queries[:20]),
        router.predict_correctness(queries[:20]),
    )
    # Only an embedder may be frozen inside a model file.
    sklocus.save(FrozenEstimator(KCenterSelector()), tmp_path / "other")
    with pytest.raises(ModelFileError, match=r"estimator is a KCenterSelector"):
        sklocus.load(tmp_path / "other")


def test_an_unfitted_estimator_round_trips(tmp_path):
    embedder = LocusEmbedder(
        SentenceEncoder(texts={"q1": "What is 2 + 2?", 3: "x"}, cache_dir=tmp_path),
        encoder_sizes=(4, 16),
        random_state=np.int64(3),
    )
    sklocus.save(LocusRouter(embedder, cost_weight=0.5), tmp_path / "router")
    loaded = sklocus.load(tmp_path / "router")
    assert not hasattr(loaded, "embedder_")
    params = loaded.embedder.get_params()
    assert params["encoder_sizes"] == (4, 16)
    assert params["random_state"] == 3 and isinstance(params["random_state"], np.int64)
    assert params["query_encoder__texts"] == {"q1": "What is 2 + 2?", 3: "x"}
    assert params["query_encoder__cache_dir"] == tmp_path
    assert loaded.cost_weight == 0.5


def test_a_saved_embedder_holds_only_what_inference_needs(fitted, tmp_path):
    embedder = fitted["embedder"]
    sklocus.save(embedder, tmp_path / "embedder")
    with safe_open(tmp_path / "embedder", "np") as file:
        names = set(file.keys())
        description = file.metadata()["sklocus"]
    weights = {f"LocusEmbedder.net_.{k}" for k in embedder.net_.module_.state_dict()}
    # The query encoder is a parameter and the fitted encoder: its table is
    # stored once.
    others = {"LocusEmbedder.query_encoder.vectors", "LocusEmbedder.query_centroids_"}
    assert names == weights | others
    # No training score is in the description either: the only numbers are
    # parameters, the history and query ids.
    assert "scores" not in description


# -- files that are refused -----------------------------------------------------------


def _nested(depth):
    node = 0
    for _ in range(depth):
        node = [node]
    return node


class _RunsCode:
    """Unpickling this creates a marker file: proof that code ran."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_pickle_is_refused_without_running_it(tmp_path):
    marker = tmp_path / "code-ran"
    path = tmp_path / "model.sklocus"
    path.write_bytes(pickle.dumps(_RunsCode(str(marker))))
    with pytest.raises(ModelFileError, match=r"model.sklocus is not a sklocus model"):
        sklocus.load(path)
    assert not marker.exists()
    # A joblib pickle saved under the right name is refused the same way.
    joblib.dump(_RunsCode(str(marker)), path)
    with pytest.raises(ModelFileError, match="not a sklocus model file"):
        sklocus.load(path)
    assert not marker.exists()


def _write_npz(path):
    with open(path, "wb") as file:  # given a name, numpy.savez adds .npz to it
        np.savez(file, x=np.eye(2))


def _write_table(path, suffix):
    frame = pd.DataFrame({"model": ["a"], "query": ["q1"], "score": [1.0]})
    if suffix == ".csv":
        frame.to_csv(path, index=False)
    else:
        frame.to_parquet(path)


@pytest.mark.parametrize(
    "write, looks_like, trust",
    [
        (lambda p: p.write_bytes(pickle.dumps({"x": 1})), "a pickle", True),
        (lambda p: joblib.dump({"x": 1}, p), "a pickle (joblib.dump?", True),
        (lambda p: joblib.dump({"x": 1}, p, compress=3), "compressed data", True),
        (lambda p: joblib.dump({"x": 1}, p, compress="gzip"), "compressed", True),
        (lambda p: _write_table(p, ".csv"), "a CSV table", False),
        (lambda p: _write_table(p, ".parquet"), "a Parquet table", False),
        (_write_npz, "a zip archive", False),
    ],
)
def test_a_file_of_another_kind_is_named_for_what_it_looks_like(
    tmp_path, write, looks_like, trust
):
    # Read as a safetensors file, its first 8 bytes were a header size of
    # exabytes: the message said so, not what the file is.
    path = tmp_path / "model.sklocus"
    write(path)
    with pytest.raises(ModelFileError) as raised:
        sklocus.load(path)
    message = str(raised.value)
    assert f"model.sklocus is not a sklocus model file: it looks like {looks_like}" in (
        message
    )
    assert "sklocus.load reads files written by sklocus.save" in message
    assert "declares a header" not in message
    assert ("load joblib files only from sources you trust" in message) == trust


def test_a_pickle_smuggled_into_a_model_file_is_refused(fitted, tmp_path):
    marker = tmp_path / "code-ran"
    path = tmp_path / "router.sklocus"
    sklocus.save(fitted["router"], path)
    payload = pickle.dumps(_RunsCode(str(marker))).hex()

    def smuggle(header):
        holder(header, "cost_")["cost_"] = {"pickle": payload}

    rewrite(path, smuggle)
    with pytest.raises(ModelFileError, match=r"cost_ holds 'pickle'"):
        sklocus.load(path)
    assert not marker.exists()


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda h: h["estimator"].update({"class": "subprocess.Popen"}),
            r"names class 'subprocess.Popen'; a sklocus model file holds only",
        ),
        (
            lambda h: holder(h, "embedder_")["embedder_"]["estimator"].update(
                {"class": "Pipeline"}
            ),
            r"LocusRouter.embedder_ names class 'Pipeline'",
        ),
        (
            lambda h: holder(h, "embeddings_").update({"embeddings_": "not an array"}),
            r"embeddings_ is a str; expected a 2-D array of dtype kind f",
        ),
        (
            lambda h: h["estimator"]["fitted"].update({"predict": 1}),
            r"sets 'predict', which is not a LocusRouter attribute",
        ),
        (
            lambda h: h["estimator"]["params"].update({"__class__": "x"}),
            r"unknown parameters \['__class__'\]",
        ),
        (
            lambda h: h["estimator"]["params"].pop("calibration"),
            r"LocusRouter\) lacks parameters \['calibration'\]",
        ),
        (
            lambda h: h["estimator"]["params"].update({"cost_weight": -1.0}),
            r"invalid parameters: .*cost_weight",
        ),
        (
            lambda h: h["estimator"]["fitted"].pop("classes_"),
            r"lacks fitted attributes \['classes_'\]",
        ),
        (
            lambda h: h.update({"format_version": 99, "sklocus_version": "9.0"}),
            r"written by sklocus 9.0 in model file format 99; sklocus .* reads "
            rf"formats up to {NEWEST}\. Load it with a newer sklocus",
        ),
        (
            lambda h: h["estimator"].update({"class": ["x"]}),
            r"names class \['x'\]",
        ),
        (
            lambda h: network(h).update({"device": "meta"}),
            r"net_ is not a valid network description",
        ),
        (
            lambda h: h["estimator"]["params"].update({"cost_weight": {"device": "x"}}),
            r"cost_weight holds a damaged 'device' value",
        ),
        (
            lambda h: set_module_param(h, "embedding_dim", 8000),
            r"net_.* of shape .*; its network has float32 of shape",
        ),
        (
            lambda h: h["estimator"]["fitted"]["classes_"].update({"dtype": "<U1"}),
            r"classes_ has labels of dtype '<U1'",
        ),
        (
            lambda h: h["estimator"]["fitted"]["classes_"].update({"dtype": "U3,O"}),
            r"classes_ has labels of dtype 'U3,O'",
        ),
        (
            lambda h: holder(h, "embeddings_")["embeddings_"].update({"evil": 1}),
            r"embeddings_ holds 'array', which a model file may not hold",
        ),
        (
            lambda h: h["estimator"]["params"].update({"cost_weight": float("nan")}),
            r"damaged sklocus description .*NaN is not valid JSON",
        ),
        (
            lambda h: h.update({"format_version": True}),
            r"describes format 'sklocus-estimator' version True",
        ),
        (
            lambda h: h["estimator"]["params"].update({"cost_weight": _nested(100)}),
            r"damaged sklocus description .*nested deeper than 64",
        ),
        (
            lambda h: holder(h, "embedder_")["embedder_"]["estimator"].update(
                {"fitted": {}}
            ),
            r"does not fit together: its embedder_ is not fitted",
        ),
        (
            lambda h: h["estimator"]["params"].update(
                {"cost_weight": holder(h, "embedder_")["embedder_"]}
            ),
            r"cost_weight holds an estimator, which it may not",
        ),
        (
            lambda h: holder(h, "head_blend_").update({"head_blend_": 1.5}),
            r"does not fit together: head_blend_ is 1.5, not in \[0, 1\]",
        ),
    ],
    ids=[
        "foreign-class",
        "foreign-nested-class",
        "wrong-type",
        "method-name",
        "unknown-parameter",
        "missing-parameter",
        "invalid-parameter",
        "missing-attribute",
        "newer-format",
        "class-not-a-name",
        "meta-device",
        "bad-device-value",
        "huge-network",
        "labels-cut-short",
        "labels-structured",
        "extra-tag-key",
        "nan-token",
        "boolean-format-version",
        "too-deep",
        "unfitted-embedder",
        "estimator-in-a-value",
        "head-blend-out-of-range",
    ],
)
def test_a_tampered_description_is_refused(fitted, tmp_path, edit, message):
    path = tmp_path / "router.sklocus"
    sklocus.save(fitted["router"], path)
    rewrite(path, edit)
    with pytest.raises(ModelFileError, match=message):
        sklocus.load(path)


@pytest.mark.parametrize(
    "name, key, change, message",
    [
        (
            "kcenter",
            "KCenterSelector.selected_indices_",
            lambda a: a.astype(np.float64),
            r"selected_indices_ is a 1-D array of dtype float64; expected a 1-D "
            r"array of dtype kind i or u",
        ),
        (
            "kcenter",
            "KCenterSelector.selected_indices_",
            lambda a: a + 100,
            r"does not fit together: selected_indices_ point outside the models",
        ),
        (
            "embedder",
            "LocusEmbedder.net_.encoder.layers.0.latents",
            lambda a: a.astype(np.int8),
            r"is int8 of shape .*; its network has float32",
        ),
    ],
    ids=["float-indices", "indices-out-of-range", "integer-weights"],
)
def test_tampered_arrays_are_refused(fitted, tmp_path, name, key, change, message):
    path = tmp_path / "model.sklocus"
    sklocus.save(fitted[name], path)

    def edit_arrays(arrays):
        assert key in arrays, sorted(arrays)
        arrays[key] = change(arrays[key])

    rewrite(path, lambda h: None, edit_arrays)
    with pytest.raises(ModelFileError, match=message):
        sklocus.load(path)


def test_modified_weights_fail_the_checksum(fitted, tmp_path):
    path = tmp_path / "embedder.sklocus"
    sklocus.save(fitted["embedder"], path)
    with safe_open(path, "np") as file:
        arrays = {key: file.get_tensor(key) for key in file.keys()}
        metadata = file.metadata()
    arrays["LocusEmbedder.query_centroids_"] = (
        arrays["LocusEmbedder.query_centroids_"] + 1
    )
    save_file(arrays, path, metadata=metadata)
    with pytest.raises(ModelFileError, match="damaged or modified"):
        sklocus.load(path)


def test_an_extra_array_is_refused(fitted, tmp_path):
    path = tmp_path / "selector.sklocus"
    sklocus.save(fitted["kcenter"], path)
    rewrite(path, lambda h: None, lambda arrays: arrays.update(hidden=np.zeros(3)))
    with pytest.raises(
        ModelFileError, match=r"arrays its description does not use \(hidden\)"
    ):
        sklocus.load(path)


def test_damaged_and_foreign_files_are_refused_naming_the_file(fitted, tmp_path):
    path = tmp_path / "model.sklocus"
    sklocus.save(fitted["kmedoids"], path)
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(ModelFileError, match=r"model.sklocus is not a sklocus model"):
        sklocus.load(path)
    save_file({"w": np.zeros(2)}, path, metadata={"note": "someone else's"})
    with pytest.raises(ModelFileError, match="safetensors file but not a sklocus"):
        sklocus.load(path)
    save_file({"w": np.zeros(2)}, path, metadata={"sklocus": "{not json"})
    with pytest.raises(ModelFileError, match="damaged sklocus description"):
        sklocus.load(path)
    with pytest.raises(FileNotFoundError, match="no model file at"):
        sklocus.load(tmp_path / "missing.sklocus")
    with pytest.raises(IsADirectoryError, match="is a folder, not a model file"):
        sklocus.load(tmp_path)
    # An ordinary bfloat16 checkpoint, which numpy cannot read.
    safetensors_torch.save_file({"w": torch.zeros(2, dtype=torch.bfloat16)}, path)
    with pytest.raises(ModelFileError, match="not a sklocus model file"):
        sklocus.load(path)


# -- what save refuses --------------------------------------------------------------


def test_save_refuses_what_a_model_file_cannot_hold(data, tmp_path):
    with pytest.raises(TypeError, match=r"LocusEmbedder.callbacks holds skorch"):
        sklocus.save(LocusEmbedder(callbacks=[EpochTimer()]), tmp_path / "x")
    with pytest.raises(TypeError, match=r"LocusRouter.embedder.callbacks holds"):
        sklocus.save(
            LocusRouter(LocusEmbedder(callbacks=[EpochTimer()])), tmp_path / "x"
        )

    with pytest.raises(TypeError, match=r"LocusEmbedder.module is .*LocusNetwork"):
        sklocus.save(LocusEmbedder(module=LocusNetwork), tmp_path / "x")
    with pytest.raises(TypeError, match=r"LocusEmbedder.criterion is .*BCELoss"):
        sklocus.save(LocusEmbedder(criterion=torch.nn.BCELoss), tmp_path / "x")

    class MyEncoder:
        def get_params(self, deep=True):
            return {}

        def transform(self, queries):
            return np.zeros((len(queries), 2))

    with pytest.raises(TypeError, match=r"query_encoder is a MyEncoder; a sklocus"):
        sklocus.save(LocusEmbedder(MyEncoder()), tmp_path / "x")
    with pytest.raises(TypeError, match=r"random_state is a RandomState"):
        sklocus.save(
            KMedoidsSelector(random_state=np.random.RandomState(0)), tmp_path / "x"
        )
    with pytest.raises(TypeError, match=r"queries is a Index.*Pass list\(\.\.\.\)"):
        sklocus.save(
            PrecomputedEncoder(pd.Index(["a"]), np.ones((1, 2))), tmp_path / "x"
        )
    with pytest.raises(TypeError, match=r"vectors is an array of dtype datetime64"):
        dates = np.array([["2026-01-01"]], dtype="datetime64[D]")
        sklocus.save(PrecomputedEncoder(["a"], dates), tmp_path / "x")
    with pytest.raises(FileNotFoundError, match=r"no folder .*missing"):
        sklocus.save(KCenterSelector(), tmp_path / "missing" / "x")
    assert not (tmp_path / "x").exists()
    assert list(tmp_path.iterdir()) == []  # no partial file left behind


def test_values_round_trip_with_their_types(tmp_path):
    texts = {np.int64(1): "one", np.int64(2): "two", ("a", 3): "pair"}
    vectors = np.arange(4.0).reshape(2, 2).astype(">f8")  # big-endian
    encoder = PrecomputedEncoder(["a", "b"], vectors)
    sklocus.save(SentenceEncoder(texts=texts), tmp_path / "sentence")
    sklocus.save(encoder, tmp_path / "precomputed")
    loaded = sklocus.load(tmp_path / "sentence").texts
    assert loaded == texts
    assert [type(k) for k in loaded] == [np.int64, np.int64, tuple]
    np.testing.assert_array_equal(
        sklocus.load(tmp_path / "precomputed").vectors, vectors
    )


def test_a_saved_file_has_the_usual_permissions(fitted, tmp_path):
    import os
    import stat

    path = tmp_path / "selector.sklocus"
    previous = os.umask(0o022)
    try:
        sklocus.save(fitted["kcenter"], path)
    finally:
        os.umask(previous)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    path.chmod(0o640)
    sklocus.save(fitted["kcenter"], path)  # replacing keeps the file's permissions
    assert stat.S_IMODE(path.stat().st_mode) == 0o640


# -- versions -------------------------------------------------------------------------


def test_a_file_from_another_version_loads_with_a_warning(
    fitted, tmp_path, monkeypatch
):
    path = tmp_path / "kcenter.sklocus"
    monkeypatch.setattr(sklocus._persistence, "__version__", "0.0.9")
    sklocus.save(fitted["kcenter"], path)
    monkeypatch.undo()
    with pytest.warns(
        SklocusVersionWarning,
        match=rf"saved by sklocus 0\.0\.9 and is loaded by sklocus {sklocus.__version__}",
    ):
        loaded = sklocus.load(path)
    np.testing.assert_array_equal(
        loaded.selected_indices_, fitted["kcenter"].selected_indices_
    )


def test_joblib_pickles_carry_the_version(fitted, tmp_path, monkeypatch):
    path = tmp_path / "router.joblib"
    monkeypatch.setattr(sklocus._versioning, "__version__", "0.0.9")
    joblib.dump(fitted["router"], path)
    monkeypatch.undo()
    with pytest.warns(SklocusVersionWarning, match=r"sklocus 0\.0\.9 .* sklocus "):
        joblib.load(path)
    # The same version loads silently, nested estimators included.
    joblib.dump(fitted["router"], path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        joblib.load(path)


@pytest.mark.parametrize(
    "make",
    [
        lambda data: data.encoder,
        lambda data: SentenceEncoder(cache_dir=None),
    ],
    ids=["PrecomputedEncoder", "SentenceEncoder"],
)
def test_encoder_pickles_carry_the_version(data, tmp_path, monkeypatch, make):
    path = tmp_path / "encoder.joblib"
    monkeypatch.setattr(sklocus._versioning, "__version__", "0.0.9")
    joblib.dump(make(data), path)
    monkeypatch.undo()
    with pytest.warns(SklocusVersionWarning, match=r"pickled \w+Encoder .*0\.0\.9"):
        joblib.load(path)


def test_a_loaded_embedder_can_be_fine_tuned(fitted, data, tmp_path):
    sklocus.save(fitted["embedder"], tmp_path / "embedder")
    loaded = sklocus.load(tmp_path / "embedder")
    direct = clone(fitted["embedder"])
    direct.__dict__.update(fitted["embedder"].__dict__)
    sets = data.evaluation_sets[:8]
    for embedder in (loaded, direct):
        embedder.set_params(warm_start=True, max_epochs=1).fit(sets)
    np.testing.assert_allclose(
        loaded.transform(sets), direct.transform(sets), atol=1e-6
    )


def test_a_file_of_an_earlier_format_is_refused(fitted, tmp_path):
    """Formats 1 to 3 came only from development builds before the first release."""
    path = tmp_path / "router.sklocus"
    sklocus.save(fitted["router"], path)
    rewrite(path, lambda h: h.update({"format_version": 3}))
    with pytest.raises(
        ModelFileError,
        match=r"in model file format 3, which sklocus .* does not read for a "
        rf"LocusRouter \(it reads formats 6 to {NEWEST}\)\. Refit the estimator and "
        r"save it "
        r"again",
    ):
        sklocus.load(path)


def test_format_5_holds_every_estimator_but_a_router(fitted, tmp_path):
    """Format 6 added the evaluations a router keeps; nothing else changed."""
    path = tmp_path / "embedder.sklocus"
    sklocus.save(fitted["embedder"], path)
    rewrite(path, lambda h: h.update({"format_version": 5}))
    assert isinstance(sklocus.load(path), sklocus.LocusEmbedder)
    rewrite(path, lambda h: h.update({"format_version": 4}))
    with pytest.raises(
        ModelFileError, match=rf"does not read \(it reads formats 5 to {NEWEST}\)"
    ):
        sklocus.load(path)
    path = tmp_path / "router.sklocus"
    sklocus.save(fitted["router"], path)
    rewrite(path, lambda h: h.update({"format_version": 5}))
    with pytest.raises(ModelFileError, match=r"does not read for a LocusRouter"):
        sklocus.load(path)


def test_a_pickle_without_the_version_stamp_loads_with_a_warning(fitted):
    state = fitted["router"].__getstate__()
    del state["_sklocus_version"]
    router = LocusRouter.__new__(LocusRouter)
    with pytest.warns(SklocusVersionWarning, match="carries no sklocus version stamp"):
        router.__setstate__(state)
    assert router.get_params() == fitted["router"].get_params()


@pytest.mark.parametrize("name", ["embedder", "router"])
def test_a_pickle_lacking_a_parameter_is_refused(fitted, name):
    estimator = fitted[name]
    state = estimator.__getstate__()
    del state["refine_steps"]
    blank = type(estimator).__new__(type(estimator))
    with pytest.raises(
        ValueError,
        match=rf"pickled {type(estimator).__name__} lacks parameters "
        r"\['refine_steps'\], so another sklocus than this one",
    ):
        blank.__setstate__(state)


# -- a router's stages (format 9) ---------------------------------------------------


def test_a_router_file_holds_each_stage_under_its_name(fitted, tmp_path):
    router = fitted["router"]
    path = tmp_path / "router.sklocus"
    sklocus.save(router, path)
    with safe_open(path, "numpy") as file:
        header = json.loads(file.metadata()["sklocus"])
    estimator = header["estimator"]
    assert header["format_version"] == NEWEST == 9
    assert set(estimator["stages"]) == set(STAGES)
    assert "embeddings_" in estimator["stages"]["locus"]
    assert estimator["stages"]["calibration"] is None  # not fitted
    assert (
        "classes_" in estimator["fitted"] and "embeddings_" not in estimator["fitted"]
    )
    # Read as format 8 wrote it, flat, it is the same router.
    rewrite(path, as_format_8)
    again = sklocus.load(path)
    np.testing.assert_array_equal(again.embeddings_, router.embeddings_)
    assert again.model_offsets_ is None
    np.testing.assert_array_equal(again.cost_, router.cost_)


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda h: h["estimator"]["stages"]["locus"].update(cost_=None),
            r"stages.locus sets 'cost_', which is not an attribute of the "
            r"router's locus stage",
        ),
        (
            lambda h: h["estimator"]["stages"].pop("heads"),
            r"stages must map each of the stages \[.*\] to its attributes",
        ),
        (
            lambda h: h["estimator"]["stages"].update(heads=[1]),
            r"stages.heads is not a mapping or null",
        ),
        (
            lambda h: h["estimator"]["fitted"].update(
                embeddings_=h["estimator"]["stages"]["locus"]["embeddings_"]
            ),
            r"sets 'embeddings_' twice: in fitted and in stages.locus",
        ),
        (
            lambda h: h["estimator"]["stages"]["locus"].pop("embeddings_"),
            r"lacks fitted attributes \['embeddings_'\]",
        ),
        (
            lambda h: h.update(format_version=8),
            r"has stages, which only a LocusRouter of model file format 9",
        ),
    ],
    ids=["foreign", "missing-stage", "not-a-mapping", "twice", "missing", "format-8"],
)
def test_odd_stages_in_a_router_file_are_refused(fitted, tmp_path, edit, message):
    path = tmp_path / "router.sklocus"
    sklocus.save(fitted["router"], path)
    rewrite(path, edit)
    with pytest.raises(ModelFileError, match=message):
        sklocus.load(path)
