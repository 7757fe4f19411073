"""The router's stages as components: composed in order, held as its state.

Each stage's own model has its tests (test_calibration, test_query_heads,
test_probability_calibration, test_groups, test_exploration, test_budget in
test_router); these check how LocusRouter composes them.
"""

import pickle

import numpy as np
import pandas as pd
import pytest
from model_file_edits import as_format_8, rewrite
from sklearn.frozen import FrozenEstimator
from tiny import SMALL_NETWORK

import sklocus
from sklocus import LocusEmbedder, LocusRouter
from sklocus._groups import apply_group_offsets
from sklocus._router._fitting import CALIBRATIONS, merge_calibration_settings
from sklocus._router._heads import apply_heads
from sklocus._router._learnt_groups import shifted
from sklocus._router._pool_calibration import apply_calibration
from sklocus._router._stages import STAGES
from sklocus.cli._parsers import CALIBRATION_CHOICES
from sklocus.datasets import make_evaluations
from sklocus.evaluations import to_matrix


@pytest.fixture(scope="module")
def pool():
    data = make_evaluations(
        n_models=8, n_queries=200, evals_per_model=None, query_dim=8, random_state=1
    )
    embedder = LocusEmbedder(query_encoder=data.encoder, **SMALL_NETWORK)
    embedder.fit(data.evaluation_sets)
    scores, queries = to_matrix(data.evaluation_sets)
    table = scores.copy()
    table[np.random.default_rng(0).random(table.shape) < 0.3] = np.nan
    Y = pd.DataFrame(table[:150], columns=data.model_names)
    groups = np.array([f"g{i % 2}" for i in range(len(queries))], dtype=object)
    return embedder, list(queries), Y, groups


@pytest.fixture(scope="module")
def every_stage(pool):
    """A router with every stage that changes probabilities: both calibrations,
    query heads and group offsets."""
    embedder, queries, Y, groups = pool
    router = LocusRouter(
        FrozenEstimator(embedder), calibration="pool+isotonic", query_heads=True
    )
    return router.fit(queries[:150], Y, query_groups=groups[:150])


def test_the_stages_apply_in_order_on_locus_probabilities(pool, every_stage):
    embedder, queries, _, groups = pool
    router, test = every_stage, queries[150:]
    vectors = embedder._encode(test)
    z = embedder._check_embeddings(router.embeddings_)
    found = embedder._predict(z, vectors).T  # LOCUS, refined embeddings
    found = apply_calibration(found, router.calibration_slope_, router.model_offsets_)
    heads = (router.head_weights_, router.head_biases_, router.head_blends_)
    found = apply_heads(found, vectors, *heads)
    found = router.probability_calibrator_.predict(found)
    # Without groups, those told from the encodings (soft, from labels).
    told = router.stages_.groups.learnt.memberships(vectors)
    assert router.group_source_ == "labels" and told.shape == (len(test), 2)
    np.testing.assert_allclose(told.sum(axis=1), 1.0, rtol=1e-12)
    np.testing.assert_array_equal(
        router.predict_correctness(test), shifted(found, told, router.group_offsets_)
    )
    grouped = apply_group_offsets(
        found, groups[150:], router.groups_, router.group_offsets_
    )
    np.testing.assert_array_equal(
        router.predict_correctness(test, groups[150:]), grouped
    )


def test_the_fitted_attributes_are_the_stages_own(every_stage):
    stages = every_stage.stages_
    assert stages.calibration.slope == every_stage.calibration_slope_
    assert stages.heads.blend == every_stage.head_blend_
    assert stages.probability_map.calibrator is every_stage.probability_calibrator_
    assert stages.groups.labels is every_stage.groups_
    assert stages.locus.embeddings is every_stage.embeddings_
    assert stages.heads.weights is every_stage.head_weights_
    with pytest.raises(AttributeError, match="embeddings_ is read-only"):
        every_stage.embeddings_ = every_stage.embeddings_[:1]
    queries = every_stage.evaluation_queries_[:2].tolist()
    plain = LocusRouter(FrozenEstimator(every_stage.embedder_.estimator))
    plain.fit_evaluations([dict(zip(queries, [1.0, 0.0]))], ["m"])
    stages = plain.stages_
    assert (stages.calibration, stages.probability_map, stages.groups) == (
        None,
        None,
        None,
    )
    assert plain.model_offsets_ is None and plain.groups_ is None
    assert not hasattr(LocusRouter(), "embeddings_")


def _rows(router, index):
    """Every stage's rows of the model at ``index``, by stage and field."""
    return {
        (name, field): rows
        for name in STAGES
        if getattr(router.stages_, name) is not None
        for field, rows in getattr(router.stages_, name).rows_of([index]).items()
        if rows is not None
    }


def test_stages_fitted_for_new_models_are_those_a_fit_gives_them(pool, every_stage):
    """A model's rows depend on its evaluations and the pool-wide fit alone."""
    embedder, queries, Y, groups = pool
    router = pickle.loads(pickle.dumps(every_stage))
    kept = router.evaluations()
    name = router.classes_[3]
    own = kept[kept["model"] == name]
    router.remove_models([name])
    group_of = dict(zip(queries[:150], groups[:150]))
    router.add_models(
        [dict(zip(own["query"], own["score"]))], ["again"], None, group_of
    )
    before, after = _rows(every_stage, 3), _rows(router, -1)
    assert before.keys() == after.keys() and len(before) >= 6
    for key, rows in before.items():
        np.testing.assert_allclose(after[key], rows, rtol=1e-4, atol=1e-5)


def test_rows_are_written_anew_never_in_place(every_stage):
    router = pickle.loads(pickle.dumps(every_stage))
    stages = router.stages_
    embeddings, offsets = router.embeddings_, router.model_offsets_
    first = embeddings.copy()
    router.remove_models([router.classes_[0]])
    assert router.embeddings_ is not embeddings
    assert router.stages_ is not stages and stages.locus.embeddings is embeddings
    np.testing.assert_array_equal(embeddings, first)
    assert len(router.model_offsets_) == len(offsets) - 1


@pytest.mark.parametrize(
    ("calibrate", "method", "expected"),
    [
        (False, None, None),
        (True, None, "pool"),
        (False, "isotonic", "isotonic"),
        (True, "sigmoid", "pool+sigmoid"),
    ],
)
def test_the_two_calibration_settings_of_before_become_one(calibrate, method, expected):
    params = {"calibrate": calibrate, "calibration_method": method, "budget": None}
    assert merge_calibration_settings(params) == {
        "calibration": expected,
        "budget": None,
    }
    # Values they could not take are left for the checks to refuse.
    odd = {"calibrate": "yes", "calibration_method": None}
    assert merge_calibration_settings(dict(odd)) == odd
    assert CALIBRATIONS[expected][0] == calibrate


def test_the_command_line_offers_every_calibration():
    assert set(CALIBRATION_CHOICES) == {name for name in CALIBRATIONS if name}


def test_a_format_6_router_file_loads_with_its_calibration_merged(
    every_stage, tmp_path
):
    path = tmp_path / "router.sklocus"
    sklocus.save(every_stage, path)

    def as_format_6(header):
        as_format_8(header)
        params = header["estimator"]["params"]
        del params["calibration"]
        params.update(calibrate=True, calibration_method="isotonic")
        header["format_version"] = 6

    rewrite(path, as_format_6)
    loaded = sklocus.load(path)
    assert loaded.calibration == "pool+isotonic"
    queries = list(every_stage.evaluation_queries_[:20])
    np.testing.assert_array_equal(
        loaded.predict_correctness(queries), every_stage.predict_correctness(queries)
    )


def test_a_format_6_file_with_a_numpy_bool_or_odd_settings(every_stage, tmp_path):
    """A numpy bool is stored as an array, and read as one; odd values are refused."""
    path = tmp_path / "router.sklocus"
    sklocus.save(every_stage, path)

    def numpy_bool(header):
        as_format_8(header)
        params = header["estimator"]["params"]
        del params["calibration"]
        params.update(calibrate={"scalar": "calibrate"}, calibration_method="isotonic")
        header["format_version"] = 6

    rewrite(path, numpy_bool, lambda arrays: arrays.update(calibrate=np.array(True)))
    assert sklocus.load(path).calibration == "pool+isotonic"
    sklocus.save(every_stage, path)

    def odd(header):
        as_format_8(header)
        params = header["estimator"]["params"]
        del params["calibration"]
        params.update(calibrate="yes", calibration_method="isotonic")
        header["format_version"] = 6

    rewrite(path, odd)
    with pytest.raises(sklocus.ModelFileError, match="calibrate='yes' and "):
        sklocus.load(path)


def test_a_pickle_of_before_gets_the_one_setting(every_stage):
    state = every_stage.__getstate__()
    del state["calibration"]
    state.update(calibrate=True, calibration_method="isotonic")
    router = LocusRouter.__new__(LocusRouter)
    router.__setstate__(state)
    assert router.calibration == "pool+isotonic"
    assert "calibrate" not in router.__dict__
