import subprocess
import sys
import textwrap

import joblib
import numpy as np
import pandas as pd
import pytest
import torch
from marks import slow_fixture
from sklearn.base import clone
from sklearn.cluster import KMeans
from sklearn.exceptions import NotFittedError
from sklearn.model_selection import GridSearchCV, KFold, cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import (
    check_estimator_repr,
    check_get_params_invariance,
    check_no_attributes_set_in_init,
    check_parameters_default_constructible,
    check_set_params,
)
from skorch.callbacks import Callback
from vectors import assert_same_probabilities, assert_same_vectors

from sklocus import LocusEmbedder, PrecomputedEncoder, _progress
from sklocus.datasets import make_evaluations
from sklocus.evaluations import to_matrix
from sklocus.metrics import correctness_accuracy, correctness_log_likelihood
from sklocus.nn import LocusNetwork, training

TINY = dict(
    embedding_dim=16,
    n_latents=4,
    n_layers=1,
    n_heads=2,
    predictor_hidden=16,
    encoder_sizes=(8, 64),
    max_epochs=3,
    epoch_size=1,
    batch_size=16,
    random_state=0,
)


@pytest.fixture(scope="module")
def data():
    return make_evaluations(
        n_models=48,
        n_queries=300,
        evals_per_model=(40, 150),
        query_dim=16,
        random_state=0,
    )


@pytest.fixture(scope="module")
def fitted(data):
    return LocusEmbedder(query_encoder=data.encoder, **TINY).fit(data.evaluation_sets)


@slow_fixture(scope="module")
def trained():
    """A small embedder trained long enough to learn, on train queries only."""
    data = make_evaluations(
        n_models=150,
        n_queries=800,
        evals_per_model=(100, 600),
        query_dim=32,
        random_state=1,
    )
    rng = np.random.default_rng(0)
    test_queries = set(rng.choice(data.query_ids, size=200, replace=False).tolist())
    train_part = [
        {q: s for q, s in e.items() if q not in test_queries}
        for e in data.evaluation_sets
    ]
    test_part = [
        {q: s for q, s in e.items() if q in test_queries} for e in data.evaluation_sets
    ]
    embedder = LocusEmbedder(
        query_encoder=data.encoder,
        embedding_dim=32,
        n_latents=8,
        n_layers=1,
        n_heads=2,
        predictor_hidden=32,
        encoder_sizes=(8, 512),
        max_epochs=30,
        epoch_size=1,
        batch_size=8,
        lr=1e-3,
        predictor_lr=2e-3,
        validation_fraction=None,
        random_state=0,
    ).fit(train_part[:120])
    return embedder, data, train_part, test_part, sorted(test_queries)


# -- what it computes ---------------------------------------------------------------


def test_transform_gives_float32_rows(fitted, data):
    z = fitted.transform(data.evaluation_sets[:5])
    assert z.shape == (5, 16) and z.dtype == np.float32
    assert np.isfinite(z).all()
    assert fitted.fit_transform(data.evaluation_sets[:8]).shape == (8, 16)


def test_permutation_invariance(fitted, data):
    evaluations = data.evaluation_sets[3]
    items = list(evaluations.items())
    reordered = dict(items[::-1])
    shuffled = dict(items[i] for i in np.random.default_rng(0).permutation(len(items)))
    z = fitted.transform([evaluations, reordered, shuffled])
    assert np.abs(z[1] - z[0]).max() <= 1e-5
    assert np.abs(z[2] - z[0]).max() <= 1e-5


@pytest.mark.slow
def test_prior_tokens_make_the_embedding_depend_on_the_evidence(data):
    # The same rates from twice the evidence: a set whose evaluations are each
    # repeated (as if two query ids per query) embeds like the set itself without
    # prior tokens, and differently with them.
    encoder = data.encoder
    twice = PrecomputedEncoder(
        [*encoder.queries, *(f"{q}-again" for q in encoder.queries)],
        np.vstack([encoder.vectors, encoder.vectors]),
    )
    evaluations = data.evaluation_sets[5]
    doubled = {**evaluations, **{f"{q}-again": s for q, s in evaluations.items()}}
    for prior_tokens in (0, 1):
        embedder = LocusEmbedder(
            query_encoder=twice, **{**TINY, "prior_tokens": prior_tokens}
        ).fit(data.evaluation_sets)
        assert embedder.net_.module_.encoder.prior.shape == (prior_tokens, 16)
        z = embedder.transform([evaluations, doubled])
        gap = np.linalg.norm(z[0] - z[1]) / np.linalg.norm(z[0])
        assert (gap > 1e-3) if prior_tokens else (gap < 1e-5), (prior_tokens, gap)


def test_determinism_is_bitwise_and_batches_agree_within_rounding(fitted, data):
    sets = data.evaluation_sets
    first = fitted.transform(sets[:10])
    np.testing.assert_array_equal(fitted.transform(sets[:10]), first)
    alone = fitted.transform([sets[4]])
    in_other_company = fitted.transform([sets[20], sets[4], sets[31], {"q00001": 1.0}])
    assert_same_vectors(alone[0], first[4])
    assert_same_vectors(in_other_company[1], first[4])


def test_outputs_do_not_depend_on_inference_batch_size(fitted, data, monkeypatch):
    import sklocus.nn.inference

    sets = data.evaluation_sets
    embeddings, score = fitted.transform(sets), fitted.score(sets)
    # Batches of at most 64 tokens: every set in a batch of its own or few.
    monkeypatch.setattr(
        sklocus.nn.inference, "CPU_BATCH_FLOATS", 64 * fitted.embedding_dim
    )
    monkeypatch.setattr(sklocus.nn.inference, "GPU_MAX_TOKENS", 64)
    assert fitted._max_tokens() == 64
    np.testing.assert_allclose(fitted.transform(sets), embeddings, atol=1e-5, rtol=0)
    assert fitted.score(sets) == pytest.approx(score, abs=1e-6)


def test_onboarding_is_training_free(fitted, data):
    before = {k: v.clone() for k, v in fitted.net_.module_.state_dict().items()}
    earlier = fitted.transform(data.evaluation_sets[:6])
    fitted.transform(data.evaluation_sets[6:30])
    fitted.predict_correctness(earlier, data.query_ids[:5])
    fitted.score(data.evaluation_sets[:6])
    after = fitted.net_.module_.state_dict()
    for name, value in before.items():
        torch.testing.assert_close(after[name], value, atol=0, rtol=0)
    np.testing.assert_array_equal(fitted.transform(data.evaluation_sets[:6]), earlier)


def test_sets_of_any_size_and_unseen_queries(fitted, data):
    rng = np.random.default_rng(0)
    big = {f"new-{i}": float(rng.integers(2)) for i in range(10_500)}
    vectors = rng.normal(size=(10_500, 16)).astype(np.float32)
    encoder = PrecomputedEncoder(
        list(big) + data.query_ids, np.vstack([vectors, data.query_vectors])
    )
    onboarding = clone(fitted)
    onboarding.__dict__.update(fitted.__dict__)
    onboarding.query_encoder_ = encoder
    z = onboarding.transform([{"q00007": 1.0}, big])
    assert z.shape == (2, 16) and np.isfinite(z).all()
    p = onboarding.predict_correctness(z, ["new-3", "q00002"])
    assert p.shape == (2, 2) and ((p > 0) & (p < 1)).all()


def test_predict_correctness_gives_probabilities(fitted, data):
    z = fitted.transform(data.evaluation_sets[:4])
    p = fitted.predict_correctness(z, data.query_ids[:7])
    assert p.shape == (7, 4) and p.dtype == np.float32  # a row per query
    assert p.flags.c_contiguous
    assert ((p > 0) & (p < 1)).all()
    # Same as scoring one model at a time, up to the rounding of a matrix
    # product that stacks one model rather than four.
    assert_same_probabilities(
        fitted.predict_correctness(z[2:3], data.query_ids[:7])[:, 0], p[:, 2]
    )


@pytest.mark.parametrize("precision", ["bfloat16", "float16"])
def test_16_bit_inference_stays_close_to_float32(fitted, data, precision):
    import copy

    low = copy.deepcopy(fitted).set_params(inference_precision=precision)
    sets, queries = data.evaluation_sets[:6], data.query_ids[:9]
    z, z_low = fitted.transform(sets), low.transform(sets)
    assert z_low.dtype == np.float32
    assert not np.array_equal(z_low, z)  # it did run in 16 bits
    relative = np.linalg.norm(z_low - z, axis=1) / np.linalg.norm(z, axis=1)
    assert relative.max() < 0.05, relative
    p, p_low = (
        fitted.predict_correctness(z, queries),
        low.predict_correctness(z, queries),
    )
    assert np.abs(p_low - p).max() < 0.02


def test_inference_precision_set_after_fit_is_checked(fitted, data):
    import copy

    wrong = copy.deepcopy(fitted).set_params(inference_precision="int8")
    with pytest.raises(ValueError, match="inference_precision='int8'; expected"):
        wrong.transform(data.evaluation_sets[:2])


@pytest.mark.slow
def test_score_is_a_deterministic_held_out_log_likelihood(fitted, data, trained):
    score = fitted.score(data.evaluation_sets)
    assert score < 0.0
    assert fitted.score(data.evaluation_sets) == score
    embedder, _, _, test_part, _ = trained
    # A trained embedder beats predicting 0.5 everywhere, which earns log(0.5).
    assert embedder.score(test_part) > np.log(0.5) + 0.01


def test_it_learns(trained):
    embedder, data, train_part, test_part, test_queries = trained
    new = slice(120, 150)
    z = embedder.transform(train_part[new])
    probabilities = embedder.predict_correctness(z, test_queries)
    scores, _ = to_matrix(test_part[new], queries=test_queries)
    locus = correctness_accuracy(scores, probabilities)
    own_accuracy = np.array([np.mean(list(s.values())) for s in train_part[new]])
    baseline = correctness_accuracy(
        scores, np.repeat(own_accuracy[None, :], len(test_queries), axis=0)
    )
    # The baseline is 0.601; LOCUS measured 0.627-0.672 over random_state 0-3 (and
    # 0.628 for random_state=0 trained on an H200, whose rounding differs).
    assert locus > baseline + 0.02, (locus, baseline)


def test_embeddings_converge_as_evaluations_grow(trained):
    embedder, data, *_ = trained
    full_sets = data.evaluation_sets[120:150]
    full = embedder.transform(full_sets)
    rng = np.random.default_rng(0)
    mean_distance = []
    for n in (16, 64, 256, 512):
        distances = []
        for _ in range(3):
            subsets = []
            for evaluations in full_sets:
                items = list(evaluations.items())
                keep = rng.choice(len(items), size=min(n, len(items)), replace=False)
                subsets.append(dict(items[i] for i in keep))
            distances.append(np.linalg.norm(embedder.transform(subsets) - full, axis=1))
        mean_distance.append(np.mean(distances))
    assert all(a > b for a, b in zip(mean_distance, mean_distance[1:])), mean_distance
    assert mean_distance[-1] < 0.5 * mean_distance[0]


# -- training -------------------------------------------------------------------------


@pytest.mark.slow
def test_random_state_reproduces_and_spares_global_rngs(data):
    torch.manual_seed(123)
    np.random.seed(123)
    expected_torch = torch.rand(1)
    expected_numpy = np.random.rand()
    torch.manual_seed(123)
    np.random.seed(123)
    first = LocusEmbedder(query_encoder=data.encoder, **TINY).fit(data.evaluation_sets)
    assert torch.rand(1) == expected_torch
    assert np.random.rand() == expected_numpy
    second = LocusEmbedder(query_encoder=data.encoder, **TINY).fit(data.evaluation_sets)
    np.testing.assert_array_equal(
        first.transform(data.evaluation_sets[:5]),
        second.transform(data.evaluation_sets[:5]),
    )


@pytest.mark.slow
def test_history_callbacks_and_early_stopping(data):
    class CountEpochs(Callback):
        def initialize(self):
            self.epochs = 0
            return self

        def on_epoch_end(self, net, **kwargs):
            self.epochs += 1

    counter = CountEpochs()
    params = {**TINY, "max_epochs": 4, "callbacks": [("count", counter)]}
    embedder = LocusEmbedder(query_encoder=data.encoder, **params).fit(
        data.evaluation_sets
    )
    assert len(embedder.history_) == 4
    assert dict(embedder.net_.callbacks_)["count"].epochs == 4
    assert not hasattr(counter, "epochs")  # fit used a copy of the parameter
    assert embedder.callbacks[0][1] is counter
    assert "valid_loss" in embedder.history_[-1]
    assert "early_stopping" in dict(embedder.net_.callbacks_)
    no_validation = LocusEmbedder(
        query_encoder=data.encoder, **{**TINY, "validation_fraction": None}
    ).fit(data.evaluation_sets)
    assert "valid_loss" not in no_validation.history_[-1]


class StopAfterFirstEpoch(Callback):
    """Ends training after one epoch, as a user's callback may."""

    def on_epoch_end(self, net, **kwargs):
        raise KeyboardInterrupt


# A rate that changes nothing: the validation loss stays as it was, so early
# stopping counts misses from the second epoch on.
STILL = {"lr": 1e-9, "predictor_lr": 1e-9}


@pytest.mark.slow
@pytest.mark.parametrize(
    "settings, reason, epochs",
    [
        ({**STILL, "max_epochs": 6, "patience": 1}, "early_stopping", 2),
        ({**STILL, "max_epochs": 2}, "max_epochs", 2),
        (
            {"max_epochs": 3, "lr": 1e-3, "predictor_lr": 3e-3},
            "max_epochs_improving",
            3,
        ),
        ({"max_epochs": 2, "validation_fraction": None}, "max_epochs", 2),
        ({"max_epochs": 1}, "max_epochs", 1),  # one epoch improves on nothing
        (
            {"max_epochs": 3, "callbacks": [("stop", StopAfterFirstEpoch())]},
            "callback",
            1,
        ),
    ],
)
def test_the_embedder_says_why_training_stopped(settings, reason, epochs):
    data = make_evaluations(
        n_models=12, n_queries=120, evals_per_model=(30, 80), query_dim=8,
        random_state=0,
    )  # fmt: skip
    params = {**TINY, "epoch_size": 64, **settings}
    embedder = LocusEmbedder(query_encoder=data.encoder, **params)
    embedder.fit(data.evaluation_sets)
    assert embedder.stop_reason_ == reason
    assert len(embedder.history_) == epochs
    if reason == "max_epochs_improving":
        losses = [row["valid_loss"] for row in embedder.history_]
        assert losses[-1] == min(losses)
    # Encoding is timed apart from the epochs, whose durations history_ keeps.
    assert embedder.encoding_time_ >= 0


def test_verbose_prints_progress(data, capsys):
    LocusEmbedder(
        query_encoder=data.encoder, **{**TINY, "max_epochs": 1, "verbose": 1}
    ).fit(data.evaluation_sets)
    captured = capsys.readouterr()
    assert "train_loss" in captured.err and "train_loss" not in captured.out


@pytest.mark.slow
def test_verbose_draws_each_epoch_on_a_terminal(data, capsys, monkeypatch):
    # An epoch of a large pool lasts minutes before skorch prints its row; on a
    # terminal a redrawn line shows it moving, cleared before the row comes.
    monkeypatch.setattr(_progress, "on_terminal", lambda: True)
    monkeypatch.setattr(training, "_EPOCH_DELAY", 0.0)
    # Every batch redrawn, however quick: what is drawn does not hang on timing.
    monkeypatch.setattr(_progress, "_REDRAW_SECONDS", 0.0)
    params = {**TINY, "max_epochs": 2, "epoch_size": 64, "batch_size": 8}
    LocusEmbedder(query_encoder=data.encoder, **params, verbose=1).fit(
        data.evaluation_sets
    )
    captured = capsys.readouterr()
    draws = captured.err.split("\r")
    # A small pool validates every model: 2 draws of each of the 48, and 2 in
    # training (64 draws at least): 12 batches of 8 each, 24 in an epoch.
    assert any(draw.startswith("Epoch 1 of 2: 0/24 batches (0%)") for draw in draws)
    assert any(draw.startswith("Epoch 2 of 2: 12/24 batches (50%)") for draw in draws)
    # Cleared, not ended: the table's row, which says how long the epoch
    # took, comes at once in its place, on the same stream.
    assert "Epoch 2 of 2" not in draws[-1] and draws[-1].split()[0] == "2"
    assert "train_loss" in captured.err and not captured.out


def test_verbose_leaves_a_log_plain_when_epochs_are_short(data, capsys):
    LocusEmbedder(
        query_encoder=data.encoder, **{**TINY, "max_epochs": 2, "verbose": 1}
    ).fit(data.evaluation_sets)
    captured = capsys.readouterr()
    assert "Epoch" not in captured.err and "\r" not in captured.err
    # The table's rows, uncoloured; nothing on standard output.
    assert "train_loss" in captured.err and "\x1b" not in captured.err
    assert not captured.out


class NaNWeightsMidEpoch(Callback):
    """Make every weight NaN after the first batch, so that the fit fails."""

    def on_batch_end(self, net, **kwargs):
        with torch.no_grad():
            for parameter in net.module_.parameters():
                parameter.fill_(float("nan"))


def test_a_failed_fit_ends_its_epoch_line(data, capsys, monkeypatch):
    monkeypatch.setattr(_progress, "on_terminal", lambda: True)
    monkeypatch.setattr(training, "_EPOCH_DELAY", 0.0)
    embedder = LocusEmbedder(
        query_encoder=data.encoder,
        **{**TINY, "verbose": 1, "callbacks": [("nan", NaNWeightsMidEpoch())]},
    )
    with pytest.raises(FloatingPointError):
        embedder.fit(data.evaluation_sets)
    # Ended where it stopped, and no longer redrawn below the error.
    assert capsys.readouterr().err.endswith("\n")
    assert not _progress._screen.steps


def test_verbose_reports_long_embeddings_and_refinements(
    fitted, data, capsys, monkeypatch
):
    import copy

    import sklocus._embedder

    embedder = copy.copy(fitted).set_params(refine_steps=2)
    embedder.transform(data.evaluation_sets)
    assert capsys.readouterr().err == ""  # verbose=0: quiet
    embedder.set_params(verbose=1)
    # A step shorter than the delay (a second by default) says nothing.
    monkeypatch.setattr(sklocus._embedder, "_PROGRESS_DELAY", 3600.0)
    embedder.transform(data.evaluation_sets)
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(sklocus._embedder, "_PROGRESS_DELAY", 0.0)
    embedder.transform(data.evaluation_sets)
    err = capsys.readouterr().err
    for step in ("Embedding models", "Refining embeddings"):
        assert f"{step}: 48 models...\n" in err
        assert f"{step}: 48 models in " in err


def test_verbose_embedding_shows_at_once_on_a_terminal(
    fitted, data, capsys, monkeypatch
):
    # Two steps each just under their own delay would leave a silence of two:
    # the status around them shows while neither does.
    import copy

    import sklocus._embedder

    monkeypatch.setattr(_progress, "on_terminal", lambda: True)
    monkeypatch.setattr(_progress, "_STATUS_DELAY", 0.0)
    monkeypatch.setattr(sklocus._embedder, "_PROGRESS_DELAY", 3600.0)
    embedder = copy.copy(fitted).set_params(refine_steps=2, verbose=1)
    embedder.transform(data.evaluation_sets)
    err = capsys.readouterr().err
    assert "\rEmbedding 48 models... 0 s" in err
    assert "Embedding models:" not in err and "Refining" not in err
    assert err.endswith("\r")  # cleared: nothing is left drawn
    assert not _progress._screen.steps


@pytest.mark.slow
def test_default_query_encoder_is_minilm_by_name():
    sets = [
        {"What is 2 + 2?": 1, "Name a prime number.": 0},
        {"What is 2 + 2?": 0, "Spell 'cat'.": 1},
    ]
    embedder = LocusEmbedder(**{**TINY, "max_epochs": 1}).fit(sets)
    assert embedder.query_dim_ == 384
    assert embedder.transform([{"A question never seen.": 1}]).shape == (1, 16)


# -- scikit-learn integration ---------------------------------------------------------


@pytest.mark.parametrize(
    "check",
    [
        check_no_attributes_set_in_init,
        check_get_params_invariance,
        check_set_params,
        check_parameters_default_constructible,
        check_estimator_repr,
    ],
)
def test_data_free_estimator_checks(check):
    check("LocusEmbedder", LocusEmbedder())


def test_clone_and_nested_params(data):
    embedder = LocusEmbedder(query_encoder=data.encoder, **TINY)
    params = embedder.get_params(deep=True)
    assert params["query_encoder__queries"] is data.encoder.queries
    embedder.set_params(n_latents=8, query_encoder__vectors=data.query_vectors * 2)
    assert embedder.n_latents == 8
    twin = clone(embedder)
    assert twin.get_params()["n_latents"] == 8
    assert not hasattr(twin, "net_")


@pytest.mark.slow
def test_joblib_round_trip_in_a_fresh_process(fitted, data, tmp_path):
    path = tmp_path / "embedder.joblib"
    joblib.dump(fitted, path)
    expected = fitted.transform(data.evaluation_sets[:3])
    np.testing.assert_array_equal(
        joblib.load(path).transform(data.evaluation_sets[:3]), expected
    )
    np.save(tmp_path / "expected.npy", expected)
    script = textwrap.dedent(
        f"""
        import joblib, numpy as np
        from sklocus.datasets import make_evaluations
        data = make_evaluations(n_models=48, n_queries=300, evals_per_model=(40, 150),
                                query_dim=16, random_state=0)
        z = joblib.load({str(path)!r}).transform(data.evaluation_sets[:3])
        np.testing.assert_array_equal(z, np.load({str(tmp_path / "expected.npy")!r}))
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine with no GPU")
def test_gpu_trained_embedder_loads_on_a_cpu_machine(fitted, data):
    import copy
    import pickle

    from skorch.exceptions import DeviceWarning

    # What a GPU-trained embedder looks like once pickled (tests/test_cuda.py
    # checks the real thing on a GPU).
    gpu = copy.deepcopy(fitted)
    gpu.device_ = "cuda"
    gpu.net_.device = "cuda"
    with pytest.warns(DeviceWarning, match="no CUDA devices"):
        loaded = pickle.loads(pickle.dumps(gpu))
    assert loaded.device_ == "cpu"
    sets = data.evaluation_sets[:3]
    np.testing.assert_array_equal(loaded.transform(sets), fitted.transform(sets))


@pytest.mark.slow
def test_pipeline_and_set_output(fitted, data):
    pipeline = make_pipeline(
        LocusEmbedder(query_encoder=data.encoder, **TINY),
        StandardScaler(),
        KMeans(n_clusters=3, n_init=2, random_state=0),
    )
    labels = pipeline.fit_predict(data.evaluation_sets)
    assert labels.shape == (48,)
    embedder = clone(fitted).set_output(transform="pandas")
    frame = embedder.fit(data.evaluation_sets).transform(data.evaluation_sets[:2])
    assert isinstance(frame, pd.DataFrame)
    assert list(frame.columns) == [f"locusembedder{i}" for i in range(16)]
    assert list(fitted.get_feature_names_out()) == list(frame.columns)


@pytest.mark.slow
def test_grid_search_and_cross_val_score_over_models(data):
    search = GridSearchCV(
        LocusEmbedder(query_encoder=data.encoder, **{**TINY, "max_epochs": 2}),
        {"n_latents": [8, 16]},
        cv=3,
    )
    search.fit(data.evaluation_sets)
    assert search.best_params_["n_latents"] in (8, 16)
    assert np.isfinite(search.cv_results_["mean_test_score"]).all()
    scores = cross_val_score(
        LocusEmbedder(query_encoder=data.encoder, **{**TINY, "max_epochs": 1}),
        data.evaluation_sets,
        cv=KFold(3, shuffle=True, random_state=0),
    )
    assert scores.shape == (3,) and (scores < 0).all()


def _held_out_log_likelihood(embedder, sets):
    """The documented held-out score, recomputed through the public API.

    Each set in query order; a quarter of it, at positions drawn by a generator
    seeded with the set's size, is predicted from the embedding of the rest.
    """
    truth, predicted = [], []
    for evaluation_set in sets:
        items = sorted(evaluation_set.items())
        order = np.random.default_rng(len(items)).permutation(len(items))
        n_held = max(1, round(0.25 * len(items)))
        held = [items[i] for i in order[:n_held]]
        kept = dict(items[i] for i in order[n_held:])
        z = embedder.transform([kept])
        predicted.append(embedder.predict_correctness(z, [q for q, _ in held])[:, 0])
        truth.append(np.array([s for _, s in held]))
    return correctness_log_likelihood(
        np.concatenate(truth)[None], np.concatenate(predicted)[None]
    )


@pytest.mark.slow
def test_grid_search_prefers_the_better_held_out_log_likelihood(data):
    # Thresholded accuracy once scored two settings exactly p and 1 - p.
    base = LocusEmbedder(query_encoder=data.encoder, **{**TINY, "max_epochs": 2})
    cv = KFold(3, shuffle=True, random_state=0)
    grid = [2, 16]
    search = GridSearchCV(base, {"n_latents": grid}, cv=cv).fit(data.evaluation_sets)
    sets = data.evaluation_sets
    recomputed = []
    for n_latents in grid:
        folds = []
        for train, test in cv.split(sets):
            fitted = clone(base).set_params(n_latents=n_latents)
            fitted.fit([sets[i] for i in train])
            folds.append(_held_out_log_likelihood(fitted, [sets[i] for i in test]))
        recomputed.append(np.mean(folds))
    scores = search.cv_results_["mean_test_score"]
    np.testing.assert_allclose(scores, recomputed, atol=1e-5)
    assert scores[0] != scores[1] and (scores < 0).all()
    assert search.best_params_["n_latents"] == grid[int(np.argmax(recomputed))]


# -- misuse and bad input ---------------------------------------------------------------


def test_misuse_gives_clear_errors(fitted, data):
    with pytest.raises(NotFittedError):
        LocusEmbedder(query_encoder=data.encoder).transform(data.evaluation_sets)
    z = fitted.transform(data.evaluation_sets[:2])
    with pytest.raises(
        ValueError,
        match=r"embeddings have shape \(2, 15\); this embedder makes \(n_models, 16\)",
    ):
        fitted.predict_correctness(z[:, :15], data.query_ids[:3])
    wide = clone(fitted)
    wide.__dict__.update(fitted.__dict__)
    wide.query_encoder_ = PrecomputedEncoder(data.query_ids, np.ones((300, 8)))
    with pytest.raises(
        ValueError, match="gives 8-d vectors but this embedder was fitted on 16-d"
    ):
        wide.transform(data.evaluation_sets[:2])
    with pytest.raises(ValueError, match="query 'nope' \\(position 0\\) is not one of"):
        fitted.transform([{"nope": 1.0}])


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"n_heads": 3}, "n_heads=3 must divide embedding_dim=16"),
        (
            {"encoder_sizes": (10, 5)},
            "encoder_sizes=(10, 5) must be a tuple (low, high)",
        ),
        ({"query_noise": (0.1, -1.0)}, "query_noise=(0.1, -1.0) must be a tuple"),
        ({"n_latents": 0}, "'n_latents' parameter of LocusEmbedder must be an int"),
        ({"prior_tokens": -1}, "'prior_tokens' parameter of LocusEmbedder must be"),
        ({"query_encoder": 42}, "'query_encoder' parameter of LocusEmbedder"),
    ],
)
def test_bad_parameters_are_named(data, params, message):
    with pytest.raises((ValueError, TypeError)) as raised:
        LocusEmbedder(**{**TINY, "query_encoder": data.encoder, **params}).fit(
            data.evaluation_sets
        )
    assert message in str(raised.value)


def test_bad_evaluation_sets_are_named(data):
    with pytest.raises(TypeError, match="got a single dict"):
        LocusEmbedder(query_encoder=data.encoder, **TINY).fit(data.evaluation_sets[0])
    with pytest.raises(
        ValueError, match="evaluation set 1 has score 3.0 for query 'q00001'"
    ):
        LocusEmbedder(query_encoder=data.encoder, **TINY).fit(
            [{"q00000": 1.0}, {"q00001": 3.0}]
        )


# -- test-time refinement -------------------------------------------------------------


def _refining(embedder, steps=10, penalty=0.1):
    import copy

    return copy.deepcopy(embedder).set_params(
        refine_steps=steps, refine_penalty=penalty
    )


@pytest.mark.slow
def test_refined_embeddings_are_deterministic_and_invariant(fitted, data):
    refining = _refining(fitted)
    sets = data.evaluation_sets[:6]
    z = refining.transform(sets)
    np.testing.assert_array_equal(refining.transform(sets), z)
    assert not np.allclose(z, fitted.transform(sets), atol=1e-4)
    # Batch-independent: a set embeds alike alone and among others.
    assert_same_vectors(refining.transform(sets[2:3]), z[2:3])
    others = [data.evaluation_sets[9], sets[2], data.evaluation_sets[30]]
    assert_same_vectors(refining.transform(others)[1], z[2])
    rng = np.random.default_rng(0)
    shuffled = [dict(rng.permutation(list(s.items())).tolist()) for s in sets]
    shuffled = [{q: float(v) for q, v in s.items()} for s in shuffled]
    np.testing.assert_allclose(refining.transform(shuffled), z, atol=1e-4)


def test_refinement_fits_a_models_own_evaluations_better(trained):
    embedder, data, train_part, _, _ = trained
    sets = train_part[120:150]
    forward = embedder.transform(sets)
    refined = _refining(embedder, steps=50).transform(sets)

    def log_loss(z):
        losses = []
        for row, evaluations in zip(z, sets):
            queries = list(evaluations)
            p = embedder.predict_correctness(row[None], queries)[:, 0]
            p = p.clip(1e-6, 1 - 1e-6)
            y = np.array([evaluations[q] for q in queries])
            losses.append(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))
        return np.array(losses)

    assert (log_loss(refined) < log_loss(forward)).all()
    # The penalty decides how far evidence moves an embedding.
    stiff = _refining(embedder, steps=50, penalty=1e4).transform(sets)
    assert np.abs(stiff - forward).max() < np.abs(refined - forward).max() / 10


def test_refinement_settings_are_checked_on_a_fitted_embedder(fitted, data):
    with pytest.raises(ValueError, match="refine_penalty=0"):
        _refining(fitted, penalty=0).transform(data.evaluation_sets[:2])
    with pytest.raises(ValueError, match="refine_steps=-1"):
        _refining(fitted, steps=-1).transform(data.evaluation_sets[:2])


# -- fine-tuning (warm_start) -----------------------------------------------------------


@pytest.fixture(scope="module")
def fine_tuned(fitted, data):
    import copy

    return (
        copy.deepcopy(fitted)
        .set_params(warm_start=True, max_epochs=2, random_state=1)
        .fit(data.evaluation_sets[:12])
    )


@pytest.mark.slow
def test_fine_tuning_starts_from_the_fitted_network(fitted, data):
    import copy

    frozen = copy.deepcopy(fitted).set_params(
        warm_start=True, lr=1e-30, predictor_lr=1e-30, weight_decay=0, max_epochs=1
    )
    frozen.fit(data.evaluation_sets[:12])
    sets = data.evaluation_sets[20:24]
    np.testing.assert_allclose(
        frozen.transform(sets), fitted.transform(sets), atol=1e-6
    )
    afresh = (
        copy.deepcopy(fitted).set_params(max_epochs=1).fit(data.evaluation_sets[:12])
    )
    assert not np.allclose(afresh.transform(sets), fitted.transform(sets), atol=1e-3)


def test_fine_tuning_is_deterministic_and_keeps_the_query_encoder(
    fitted, fine_tuned, data
):
    import copy

    again = (
        copy.deepcopy(fitted)
        .set_params(warm_start=True, max_epochs=2, random_state=1)
        .fit(data.evaluation_sets[:12])
    )
    sets = data.evaluation_sets[20:26]
    np.testing.assert_array_equal(again.transform(sets), fine_tuned.transform(sets))
    assert not np.allclose(
        fine_tuned.transform(sets), fitted.transform(sets), atol=1e-4
    )
    assert fine_tuned.query_encoder_ is not None
    assert fine_tuned.query_dim_ == fitted.query_dim_
    reordered = [dict(reversed(list(s.items()))) for s in sets]
    # Equal up to float32 summation order: components reach about 20 here.
    np.testing.assert_allclose(
        fine_tuned.transform(reordered),
        fine_tuned.transform(sets),
        rtol=2e-6,
        atol=1e-5,
    )
    # Training queries of both fits count as known.
    assert len(fine_tuned.query_centroids_) > len(fitted.query_centroids_)


def test_fine_tuning_refuses_another_architecture(fitted, data):
    import copy

    changed = copy.deepcopy(fitted).set_params(warm_start=True, n_latents=8)
    with pytest.raises(
        ValueError, match="n_latents=4; n_latents=8 needs a new network"
    ):
        changed.fit(data.evaluation_sets[:12])


@pytest.mark.slow
def test_fine_tuned_embedder_round_trips_through_joblib_in_a_fresh_process(
    fine_tuned, data, tmp_path
):
    path = tmp_path / "fine_tuned.joblib"
    joblib.dump(fine_tuned, path)
    expected = fine_tuned.transform(data.evaluation_sets[:3])
    np.save(tmp_path / "expected.npy", expected)
    script = textwrap.dedent(
        f"""
        import joblib, numpy as np
        from sklocus.datasets import make_evaluations
        data = make_evaluations(n_models=48, n_queries=300, evals_per_model=(40, 150),
                                query_dim=16, random_state=0)
        embedder = joblib.load({str(path)!r})
        assert embedder.warm_start
        z = embedder.transform(data.evaluation_sets[:3])
        np.testing.assert_array_equal(z, np.load({str(tmp_path / "expected.npy")!r}))
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True)


# -- how new the queries are ------------------------------------------------------------


def test_query_novelty_tells_new_kinds_of_queries_apart():
    rng = np.random.default_rng(0)
    known = rng.normal(size=(200, 8)).astype(np.float32)
    far = known[:50] + 6.0
    ids = [f"q{i}" for i in range(250)]
    encoder = PrecomputedEncoder(ids, np.concatenate([known, far]))
    sets = [
        {ids[j]: float(rng.integers(0, 2)) for j in rng.choice(200, 60, replace=False)}
        for _ in range(20)
    ]
    embedder = LocusEmbedder(query_encoder=encoder, **TINY).fit(sets)
    seen = [q for s in sets for q in s]
    novelty = embedder.query_novelty(sorted(set(seen)))
    assert novelty.shape == (len(set(seen)),) and novelty.dtype == np.float32
    assert 0.03 <= (novelty > 1).mean() <= 0.07
    assert (embedder.query_novelty(ids[200:]) > 2).all()
    with pytest.raises(NotFittedError):
        LocusEmbedder().query_novelty(["q1"])


def test_a_bare_string_of_queries_is_refused_not_split(fitted, data):
    z = fitted.transform(data.evaluation_sets[:2])
    with pytest.raises(TypeError, match=r"single str 'q1'.*\['q1'\]"):
        fitted.predict_correctness(z, "q1")


def test_no_queries_give_an_empty_prediction(fitted, data):
    z = fitted.transform(data.evaluation_sets[:2])
    out = fitted.predict_correctness(z, [])
    assert out.shape == (0, 2) and out.dtype == np.float32


def test_a_diverging_fit_stops_with_the_epoch(data):
    from skorch.callbacks import Callback

    class Diverge(Callback):
        """Make every weight NaN at the start of the second epoch."""

        def on_epoch_begin(self, net, **kwargs):
            if len(net.history) == 2:
                with torch.no_grad():
                    for parameter in net.module_.parameters():
                        parameter.fill_(float("nan"))

    embedder = LocusEmbedder(
        query_encoder=data.encoder, callbacks=[("diverge", Diverge())], **TINY
    )
    with pytest.raises(FloatingPointError, match=r"nan in epoch 2.*Lower the learn"):
        embedder.fit(data.evaluation_sets)


def test_a_validation_fraction_that_leaves_no_training_model_is_refused(data):
    embedder = LocusEmbedder(
        query_encoder=data.encoder, **{**TINY, "validation_fraction": 0.95}
    )
    with pytest.raises(ValueError, match=r"validation_fraction=0.95 .* none to train"):
        embedder.fit(data.evaluation_sets[:8])


class _CountItems(Callback):
    """Count the (model, draw) items of the first epoch's batches."""

    def initialize(self):
        self.items = 0
        self.training_items = 0
        return self

    def on_batch_begin(self, net, batch=None, training=None, **kwargs):
        if len(net.history) == 1:
            n = len(batch[0]["encoder_codes"])
            if training:
                self.training_items += n
            else:
                self.items += n


@pytest.mark.parametrize(
    "settings, items",
    [
        # 48 models: below 100, "auto" validates every model on held-out queries.
        ({}, 48 * 2),
        ({"validation_fraction": 0.0}, 48 * 2),
        ({"validation_fraction": 0.1}, 5 * 2),
        # No held-out queries to validate on: "auto" holds out models instead.
        ({"validation_queries": 0.0}, 5 * 2),
    ],
)
def test_small_pools_validate_every_model_on_held_out_queries(data, settings, items):
    params = {**TINY, "max_epochs": 1, **settings}
    params["callbacks"] = [("count", _CountItems())]
    embedder = LocusEmbedder(query_encoder=data.encoder, **params)
    embedder.fit(data.evaluation_sets)
    assert dict(embedder.net_.callbacks_)["count"].items == items
    assert np.isfinite(embedder.history_[-1]["valid_loss"])


@pytest.mark.slow
@pytest.mark.parametrize(
    "n_models, evaluations, epochs, draws",
    [
        # Small pools: 8 epochs of 1,024 draws, however many evaluations.
        (48, None, 8, 1024),
        (20, 1200, 8, 1024),
        # 100 models: a large pool, 10 epochs of 4,096 draws.
        (100, None, 10, 4096),
    ],
)
def test_auto_schedule_follows_the_pool(n_models, evaluations, epochs, draws):
    sizes = (40, 150) if evaluations is None else (evaluations, evaluations)
    pool = make_evaluations(
        n_models=n_models,
        n_queries=max(300, sizes[1]),
        evals_per_model=sizes,
        query_dim=16,
        random_state=0,
    )
    sets = pool.evaluation_sets
    count = _CountItems()
    params = {**TINY, "max_epochs": 1, "epoch_size": "auto"}
    embedder = LocusEmbedder(
        query_encoder=pool.encoder, **params, callbacks=[("count", count)]
    ).fit(sets)
    n_train = n_models if n_models < 100 else n_models - 10
    trained = dict(embedder.net_.callbacks_)["count"].training_items
    assert trained == n_train * -(-draws // n_train)
    # With no validation nothing stops training before max_epochs.
    params = {**TINY, "max_epochs": "auto", "validation_fraction": None}
    embedder = LocusEmbedder(query_encoder=pool.encoder, **params).fit(sets)
    assert len(embedder.history_) == epochs


def test_validating_on_held_out_queries_needs_some(data):
    embedder = LocusEmbedder(
        query_encoder=data.encoder,
        **{**TINY, "validation_fraction": 0, "validation_queries": 0},
    )
    with pytest.raises(ValueError, match=r"validation_fraction=0 .* validation_quer"):
        embedder.fit(data.evaluation_sets)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine with no GPU")
def test_cuda_without_a_gpu_is_a_clear_error(data):
    embedder = LocusEmbedder(query_encoder=data.encoder, **{**TINY, "device": "cuda"})
    with pytest.raises(ValueError, match=r"device='cuda'.*sees none.*device='cpu'"):
        embedder.fit(data.evaluation_sets)


def test_a_fitted_embedder_keeps_no_training_data(fitted, data):
    import pickle

    blob = pickle.dumps(fitted)
    # The collators held every training model's queries, scores and vectors.
    assert b"SetCollator" not in blob and b"RaggedEvaluations" not in blob
    assert fitted.net_.optimizer_ is None
    loaded = pickle.loads(blob)
    sets = data.evaluation_sets[:4]
    np.testing.assert_array_equal(loaded.transform(sets), fitted.transform(sets))
    assert len(loaded.history_) == len(fitted.history_) > 0


# -- variants through the module and criterion parameters -------------------------------


class _CountingNetwork(LocusNetwork):
    """LocusNetwork that also returns its decoder codes in training."""

    def forward(self, decoder_codes, **inputs):
        return super().forward(decoder_codes=decoder_codes, **inputs), decoder_codes


class _CodesAwareLoss(torch.nn.Module):
    calls = 0

    def forward(self, output, targets):
        logits, codes = output
        assert codes.shape == targets.shape
        type(self).calls += 1
        real = ~torch.isnan(targets)
        return 2 * torch.nn.functional.binary_cross_entropy_with_logits(
            logits[real], targets[real]
        )


@pytest.mark.slow
def test_module_and_criterion_are_the_seam_for_variants(data):
    plain = LocusEmbedder(query_encoder=data.encoder, **TINY).fit(data.evaluation_sets)
    variant = LocusEmbedder(
        query_encoder=data.encoder,
        module=_CountingNetwork,
        criterion=_CodesAwareLoss,
        **TINY,
    ).fit(data.evaluation_sets)
    assert type(variant.net_.module_) is _CountingNetwork
    assert _CodesAwareLoss.calls > 0
    # The same draws and weights: the doubled loss doubles the first epoch's figure.
    first = plain.history_[0]["train_loss"], variant.history_[0]["train_loss"]
    assert first[1] == pytest.approx(2 * first[0], rel=0.05)
    # Inference goes through the encoder and predictor, not forward.
    z = variant.transform(data.evaluation_sets[:4])
    assert variant.predict_correctness(z, data.query_ids[:5]).shape == (5, 4)
    assert clone(variant).get_params()["module"] is _CountingNetwork


def test_warm_start_refuses_another_module(fitted, data):
    import copy

    embedder = copy.deepcopy(fitted).set_params(
        warm_start=True, module=_CountingNetwork
    )
    with pytest.raises(ValueError, match=r"a LocusNetwork; module=_CountingNetwork"):
        embedder.fit(data.evaluation_sets)


# -- units of the embeddings ------------------------------------------------------------


def test_embeddings_are_in_units_of_the_typical_distance_between_training_models(
    data,
):
    from scipy.spatial.distance import pdist

    sets = data.evaluation_sets[:30]
    embedder = LocusEmbedder(query_encoder=data.encoder, **TINY).fit(sets)
    z = embedder.transform(sets)
    # Up to 1,024 training models set the scale; this pool has 30, all of them.
    assert np.median(pdist(z.astype(np.float64))) == pytest.approx(1.0, rel=1e-4)
    assert embedder.embedding_scale_ > 0
    # Predictions read the embeddings in those units: scaling them changes the answer.
    p = embedder.predict_correctness(z, data.query_ids[:20])
    assert not np.allclose(p, embedder.predict_correctness(2 * z, data.query_ids[:20]))


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"embedding_dim": 0}, "embedding_dim"),
        ({"embedding_dim": 10, "n_heads": 4}, "n_heads=4 must divide"),
        ({"encoder_sizes": (9, 3)}, "encoder_sizes=.9, 3. must be"),
    ],
)
def test_check_params_refuses_what_fit_would(settings, message):
    with pytest.raises(ValueError, match=message):
        LocusEmbedder(**settings).check_params()
    assert LocusEmbedder().check_params().get_params() == LocusEmbedder().get_params()
