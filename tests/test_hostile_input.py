"""Clumsy or hostile input to the estimators: refused by name, or read once."""

import os
import signal

import numpy as np
import pandas as pd
import pytest
from skorch.callbacks import Callback
from tiny import TINY_NETWORK, TINY_POOL

from sklocus import LocusEmbedder, LocusRouter
from sklocus.datasets import make_evaluations
from sklocus.evaluations import to_matrix


@pytest.fixture(scope="module")
def data():
    return make_evaluations(**TINY_POOL)


def _table(data):
    scores, queries = to_matrix(data.evaluation_sets)
    return queries, pd.DataFrame(scores, columns=data.model_names)


def _router(data):
    return LocusRouter(
        LocusEmbedder(query_encoder=data.encoder, **TINY_NETWORK), refine_steps=0
    )


# -- finding 4: a routing table with two levels of columns -----------------------------


def test_a_two_level_column_index_is_refused(data):
    queries, Y = _table(data)
    Y.columns = pd.MultiIndex.from_tuples([(n, "acc") for n in Y.columns])
    with pytest.raises(ValueError, match=r"Y's columns have 2 levels.*Join the levels"):
        _router(data).fit(queries, Y)


# -- finding 8: names a user could not type back --------------------------------------


@pytest.mark.parametrize("name", ["a\nb", "tab\there", "bell\x07", "sep\u2028", " "])
def test_a_model_name_with_a_control_character_is_refused_at_fit(data, name):
    queries, Y = _table(data)
    Y = Y.rename(columns={Y.columns[3]: name})
    with pytest.raises(ValueError, match=r"Y's columns\[3\] is .*(control|blank)"):
        _router(data).fit(queries, Y)


def test_a_model_name_with_a_control_character_is_refused_at_onboarding(data):
    queries, Y = _table(data)
    router = _router(data).fit(queries, Y.iloc[:, :-1])
    with pytest.raises(ValueError, match=r"names\[0\] is 'new\\r'.*control character"):
        router.add_models(data.evaluation_sets[-1:], ["new\r"])
    assert len(router.classes_) == Y.shape[1] - 1


def test_names_that_are_neither_texts_nor_integers_are_refused(data):
    queries, Y = _table(data)
    router = _router(data).fit(queries, Y.iloc[:, :-1])
    with pytest.raises(TypeError, match=r"names\[0\] is \('a', 1\), a tuple"):
        router.add_models(data.evaluation_sets[-1:], [("a", 1)])


# -- finding 13: Ctrl-C during fit -----------------------------------------------------


class _PressCtrlC(Callback):
    """Sends this process SIGINT at the end of the first epoch, as Ctrl-C does."""

    def on_epoch_end(self, net, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)


class _StopTraining(Callback):
    """Stops training as skorch's callbacks do, by raising KeyboardInterrupt."""

    def on_epoch_end(self, net, **kwargs):
        raise KeyboardInterrupt


@pytest.fixture
def python_sigint():
    """SIGINT as a Python session has it, whatever an earlier test left behind.

    In the full suite an earlier test's library leaves another handler in place,
    under which Ctrl-C never becomes a KeyboardInterrupt at all.
    """
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    if previous is not None:
        signal.signal(signal.SIGINT, previous)


def test_ctrl_c_during_fit_is_raised_and_keeps_no_partial_model(data, python_sigint):
    embedder = LocusEmbedder(
        query_encoder=data.encoder,
        **{**TINY_NETWORK, "max_epochs": 5},
        callbacks=[_PressCtrlC()],
    )
    with pytest.raises(KeyboardInterrupt):
        embedder.fit(data.evaluation_sets)
    assert not hasattr(embedder, "net_")
    # The handler of the caller is back in place.
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_ctrl_c_during_fine_tuning_keeps_the_network_as_it_was(data, python_sigint):
    embedder = LocusEmbedder(query_encoder=data.encoder, **TINY_NETWORK)
    embedder.fit(data.evaluation_sets)
    before = embedder.transform(data.evaluation_sets)
    net = embedder.net_
    embedder.set_params(warm_start=True, callbacks=[_PressCtrlC()])
    with pytest.raises(KeyboardInterrupt):
        embedder.fit(data.evaluation_sets[:6])
    assert embedder.net_ is net
    np.testing.assert_array_equal(embedder.transform(data.evaluation_sets), before)


def test_a_callback_that_stops_training_still_returns_a_fitted_model(data):
    embedder = LocusEmbedder(
        query_encoder=data.encoder,
        **{**TINY_NETWORK, "max_epochs": 5},
        callbacks=[_StopTraining()],
    ).fit(data.evaluation_sets)
    assert len(embedder.history_) == 1


# -- finding 15: generators are read once ----------------------------------------------


def test_fit_transform_reads_a_generator_once(data):
    sets = data.evaluation_sets
    embedder = LocusEmbedder(query_encoder=data.encoder, **TINY_NETWORK)
    from_generator = embedder.fit_transform(s for s in sets)
    assert from_generator.shape == (len(sets), TINY_NETWORK["embedding_dim"])
    np.testing.assert_array_equal(from_generator, embedder.fit_transform(sets))


def test_add_models_reads_a_generator_once(data):
    queries, Y = _table(data)
    router = _router(data).fit(queries, Y.iloc[:, :-2])
    twin = _router(data).fit(queries, Y.iloc[:, :-2])
    new, names = data.evaluation_sets[-2:], list(Y.columns[-2:])
    router.add_models((s for s in new), names)
    twin.add_models(new, names)
    np.testing.assert_array_equal(router.embeddings_, twin.embeddings_)
    assert list(router.classes_) == list(Y.columns)
