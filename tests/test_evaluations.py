import numpy as np
import pandas as pd
import pytest

from sklocus.evaluations import (
    check_evaluation_sets,
    from_long,
    subsample,
    to_matrix,
)

NAMES = ["org/alpha", "org/beta"]


def test_check_flattens_ragged_sets_in_order():
    sets = [{"q1": 1, "q2": 0.0}, pd.Series({"q3": 0.25, "q1": True})]
    ragged = check_evaluation_sets(sets, NAMES)
    assert ragged.queries == ["q1", "q2", "q3"]
    assert ragged.sizes.tolist() == [2, 2]
    assert ragged.set_codes(1).tolist() == [2, 0]
    assert ragged.set_scores(1).tolist() == [0.25, 1.0]
    assert ragged.model_names == NAMES
    assert ragged.to_dicts() == [{"q1": 1.0, "q2": 0.0}, {"q3": 0.25, "q1": 1.0}]


def test_check_accepts_hashable_non_text_queries():
    ragged = check_evaluation_sets([{1: 1, ("mmlu", 7): 0}, {1: 0}])
    assert ragged.queries == [1, ("mmlu", 7)]
    assert ragged.set_codes(1).tolist() == [0]


def test_check_does_not_change_the_input():
    sets = [{"q1": 1, "q2": 0}, pd.Series({"q1": 0.5})]
    before = [dict(sets[0]), sets[1].copy()]
    check_evaluation_sets(sets)
    assert sets[0] == before[0]
    pd.testing.assert_series_equal(sets[1], before[1])


def test_check_takes_model_names_from_a_series_of_sets():
    sets = pd.Series({"org/alpha": {"q1": 1}, "org/beta": {"q1": 0}})
    assert check_evaluation_sets(sets).model_names == NAMES


@pytest.mark.parametrize(
    ("sets", "error", "expected"),
    [
        ([], ValueError, "got an empty sequence"),
        ({"q1": 1}, TypeError, "got a single dict. Wrap one model's evaluations"),
        (pd.Series({"q1": 1.0}), TypeError, "got a single Series"),
        ("q1", TypeError, "got str"),
        (pd.DataFrame({"q1": [1]}), TypeError, "from_long"),
        ([{"q1": 1}, {}], ValueError, "evaluation set 1 (model 'org/beta') is empty"),
        (
            [{"q1": 1}, [("q1", 1)]],
            TypeError,
            "evaluation set 1 (model 'org/beta') is a list",
        ),
        (
            [{"q1": 1}, {"q2": np.nan}],
            ValueError,
            "model 'org/beta') has no score for query 'q2' (it is missing",
        ),
        ([{"q1": np.inf}, {"q2": 1}], ValueError, "has score inf for query 'q1'"),
        (
            [{"q1": 1}, {"q2": 1.7}],
            ValueError,
            "has score 1.7 for query 'q2'; scores must be finite numbers in [0, 1]",
        ),
        ([{"q1": -0.1}, {"q2": 1}], ValueError, "has score -0.1 for query 'q1'"),
        ([{"q1": 1}, {"q2": "1"}], TypeError, "has score '1' (str) for query 'q2'"),
        (
            [{"q1": None}, {"q2": 1}],
            TypeError,
            "has score None (NoneType) for query 'q1'",
        ),
        (
            [{"q1": 1}, pd.Series([1.0], index=pd.Index([["q", "x"]], dtype=object))],
            TypeError,
            "evaluation set 1 (model 'org/beta') has query ['q', 'x'] of unhashable type list",
        ),
        (
            [{"q1": 1}, pd.Series([1.0, 0.0], index=["q1", "q1"])],
            ValueError,
            "evaluation set 1 (model 'org/beta') has query 'q1' more than once",
        ),
    ],
)
def test_check_names_the_culprit(sets, error, expected):
    names = NAMES if isinstance(sets, list) and len(sets) == 2 else None
    with pytest.raises(error) as raised:
        check_evaluation_sets(sets, names)
    assert expected in str(raised.value)


def test_check_without_names_uses_the_index():
    with pytest.raises(ValueError, match=r"^evaluation set 2 has score 2\.0"):
        check_evaluation_sets([{"a": 1}, {"a": 0}, {"b": 2.0}])


def test_check_rejects_mismatched_model_names():
    with pytest.raises(ValueError, match="got 1 model names for 2 evaluation sets"):
        check_evaluation_sets([{"a": 1}, {"a": 0}], ["only-one"])


def _long(rows):
    return pd.DataFrame(rows, columns=["model", "query", "score"])


def test_from_long_groups_rows_by_model_in_order_of_appearance():
    frame = _long([("b", "q1", 1), ("a", "q2", 0), ("b", "q3", 0.5), ("a", "q1", 1)])
    sets, names = from_long(frame)
    assert names == ["b", "a"]
    assert sets == [{"q1": 1.0, "q3": 0.5}, {"q2": 0.0, "q1": 1.0}]


def test_from_long_uses_the_named_columns():
    frame = pd.DataFrame({"llm": ["m"], "item": [7], "correct": [1]})
    assert from_long(frame, model="llm", query="item", score="correct") == (
        [{7: 1.0}],
        ["m"],
    )


def test_from_long_refuses_duplicates_unless_told():
    frame = _long([("a", "q1", 1), ("b", "q1", 1), ("a", "q1", 0)])
    with pytest.raises(ValueError, match="model 'a' has 2 rows for query 'q1'"):
        from_long(frame)


def test_from_long_resolves_duplicates_as_asked():
    frame = _long(
        [
            ("a", "q1", 1),
            ("a", "q1", 1),
            ("a", "q1", 0),  # majority 1, mean 2/3
            ("a", "q2", 0),
            ("a", "q2", 1),  # a tie: majority gives the mean, 0.5
            ("b", "q1", 0),
        ]
    )
    majority, names = from_long(frame, duplicates="majority")
    assert names == ["a", "b"]
    assert majority == [{"q1": 1.0, "q2": 0.5}, {"q1": 0.0}]
    mean, _ = from_long(frame, duplicates="mean")
    assert mean[0]["q1"] == pytest.approx(2 / 3)
    assert list(mean[0]) == ["q1", "q2"]


@pytest.mark.parametrize("duplicates", ["error", "mean", "majority"])
def test_from_long_never_fills_a_missing_score(duplicates):
    frame = _long([("a", "q1", 1), ("a", "q1", np.nan)])
    with pytest.raises(
        ValueError, match=r"row 1 \(model 'a'\) has no score for query 'q1'"
    ):
        from_long(frame, duplicates=duplicates)


def test_from_long_names_the_keyword_and_rows_of_a_repeated_pair():
    frame = _long([("a", "q1", 1), ("b", "q1", 1), ("a", "q1", 0)])
    with pytest.raises(ValueError) as raised:
        from_long(frame)
    assert str(raised.value) == (
        "model 'a' has 2 rows for query 'q1' (rows 0, 2); pass duplicates='mean' "
        "or duplicates='majority' to resolve repeated evaluations"
    )


def test_from_long_quotes_a_long_value_cut_short():
    question = "Why " + "x" * 2000
    frame = _long([("a", "q1", 1), ("a", question, 1.5)])
    with pytest.raises(ValueError) as raised:
        from_long(frame)
    message = str(raised.value)
    assert message.startswith("row 1 (model 'a') has score 1.5 for query 'Why xxx")
    assert "…' (2,004 characters); scores must be" in message
    assert len(message) < 200, message


def test_from_long_names_a_missing_column_and_a_bad_rule():
    with pytest.raises(
        KeyError, match="the score column 'correct' is not in the frame"
    ):
        from_long(_long([("a", "q", 1)]), score="correct")
    with pytest.raises(ValueError, match="duplicates='first' is not understood"):
        from_long(_long([("a", "q", 1)]), duplicates="first")


def test_from_long_names_a_row_without_a_model():
    frame = _long([("a", "q", 1), (None, "q", 1)])
    with pytest.raises(ValueError, match="row 1 has no model"):
        from_long(frame)


def test_to_matrix_puts_nan_where_unobserved():
    matrix, queries = to_matrix([{"q1": 1, "q2": 0}, {"q2": 1}])
    assert queries == ["q1", "q2"]
    np.testing.assert_array_equal(matrix, [[1.0, np.nan], [0.0, 1.0]])


def test_to_matrix_with_given_queries():
    matrix, queries = to_matrix([{"q1": 1, "q2": 0}, {"q2": 1}], queries=["q2", "q9"])
    assert queries == ["q2", "q9"]
    np.testing.assert_array_equal(matrix, [[0.0, 1.0], [np.nan, np.nan]])
    with pytest.raises(ValueError, match="query 'q2' appears more than once"):
        to_matrix([{"q2": 1}], queries=["q2", "q2"])


def test_subsample_draws_without_replacement_and_keeps_small_sets():
    sets = [{f"q{i}": i % 2 for i in range(10)}, {"q0": 1.0}]
    drawn = subsample(sets, 4, random_state=0)
    assert [len(s) for s in drawn] == [4, 1]
    assert all(sets[0][q] == s for q, s in drawn[0].items())
    assert drawn == subsample(sets, 4, random_state=0)
    assert drawn != subsample(sets, 4, random_state=1)
    with pytest.raises(ValueError, match="'n' parameter of subsample must be an int"):
        subsample(sets, 0)


@pytest.mark.parametrize(
    "missing",
    [(float("nan"), float("nan")), (None, float("nan")), (None, np.float64("nan"))],
)
def test_two_missing_queries_in_one_set_are_one_repeated_query(missing):
    first, second = missing
    sets = [{"q1": 1, first: 0}, {"q1": 0, first: 1, second: 0}]
    with pytest.raises(ValueError, match=r"evaluation set 1.*missing query more than"):
        check_evaluation_sets(sets)


def test_one_missing_query_per_set_is_kept():
    ragged = check_evaluation_sets([{"q1": 1, None: 0}, {float("nan"): 1}])
    assert ragged.sizes.tolist() == [2, 1]


def test_a_bare_string_is_refused_where_queries_or_names_are_expected():
    sets = [{"q1": 1, "q2": 0}]
    with pytest.raises(TypeError, match=r"sequence of queries; got a single str 'q1'"):
        to_matrix(sets, queries="q1")
    with pytest.raises(TypeError, match=r"sequence of model names.*'ab'"):
        check_evaluation_sets([{"q": 1}, {"q": 0}], model_names="ab")


# -- the ragged form as input ---------------------------------------------------


def _long_frame():
    rng = np.random.default_rng(0)
    rows = [
        (f"m{m}", f"q{q}", float(rng.integers(0, 2)))
        for m in range(6)
        for q in rng.choice(20, size=int(rng.integers(3, 12)), replace=False)
    ]
    return pd.DataFrame(rows, columns=["model", "query", "score"])


def test_ragged_from_long_is_from_long_without_the_dicts():
    from sklocus.evaluations import RaggedEvaluations

    frame = _long_frame().sample(frac=1, random_state=0)  # models interleaved
    ragged = RaggedEvaluations.from_long(frame)
    sets, names = from_long(frame)
    assert ragged.model_names == names
    assert ragged.to_dicts() == sets
    checked = check_evaluation_sets(ragged)
    assert checked.to_dicts() == sets and checked.model_names == names
    again = check_evaluation_sets(sets, names)
    np.testing.assert_array_equal(checked.sizes, again.sizes)


def test_an_embedder_takes_the_ragged_form():
    from tiny import TINY_NETWORK, TINY_POOL

    from sklocus import LocusEmbedder
    from sklocus.datasets import make_evaluations
    from sklocus.evaluations import RaggedEvaluations

    data = make_evaluations(**TINY_POOL)
    sets = data.evaluation_sets
    embedder = LocusEmbedder(query_encoder=data.encoder, **TINY_NETWORK).fit(sets)
    rows = [(i, q, s) for i, e in enumerate(sets) for q, s in e.items()]
    frame = pd.DataFrame(rows, columns=["model", "query", "score"])
    ragged = RaggedEvaluations.from_long(frame)
    np.testing.assert_array_equal(embedder.transform(ragged), embedder.transform(sets))


def _ragged(**change):
    from sklocus.evaluations import RaggedEvaluations

    parts = dict(
        queries=["q0", "q1", "q2"],
        query_codes=np.array([0, 1, 2, 1]),
        scores=np.array([1.0, 0.0, 1.0, 0.5]),
        offsets=np.array([0, 3, 4]),
        model_names=["a", "b"],
    )
    parts.update(change)
    return RaggedEvaluations(**parts)


@pytest.mark.parametrize(
    "change, error, message",
    [
        (
            {"scores": np.array([1.0, 0.0, 1.0, 1.5])},
            ValueError,
            "evaluation set 1 (model 'b') has score 1.5 for query 'q1'; scores must",
        ),
        (
            {"scores": np.array([1.0, np.nan, 1.0, 1.0])},
            ValueError,
            "evaluation set 0 (model 'a') has no score for query 'q1'",
        ),
        (
            {"scores": np.array(["1", 0, 1, 1], dtype=object)},
            TypeError,
            "evaluation set 0 (model 'a') has score '1' (str) for query 'q0'",
        ),
        (
            {"query_codes": np.array([0, 1, 1, 2])},
            ValueError,
            "evaluation set 0 (model 'a') has query 'q1' more than once",
        ),
        (
            {"query_codes": np.array([0, 1, 3, 2])},
            ValueError,
            "evaluation set 0 (model 'a') has query code 3; codes must index the 3",
        ),
        (
            {"offsets": np.array([0, 4, 4])},
            ValueError,
            "evaluation set 1 (model 'b') is empty",
        ),
        ({"offsets": np.array([0, 3])}, ValueError, "got 2 model names for 1"),
        ({"offsets": np.array([0, 3, 5])}, ValueError, "offsets must be integers"),
        (
            {"query_codes": np.array([0.0, 1, 2, 1])},
            TypeError,
            "query_codes must be a 1-D array of integers",
        ),
        (
            {"scores": np.array([1.0, 0.0, 1.0])},
            ValueError,
            "scores has shape (3,) but query_codes has (4,)",
        ),
    ],
)
def test_bad_ragged_input_is_named(change, error, message):
    with pytest.raises(error) as raised:
        check_evaluation_sets(_ragged(**change))
    assert message in str(raised.value)


def test_repeated_queries_are_found_by_sorting_in_sparse_ragged_input(monkeypatch):
    import sklocus.evaluations

    monkeypatch.setattr(sklocus.evaluations, "_DENSE_PAIRS", -100)
    with pytest.raises(ValueError, match="model 'b'\\) has query 'q2' more than once"):
        check_evaluation_sets(
            _ragged(
                query_codes=np.array([0, 1, 2, 2, 2]),
                scores=np.ones(5),
                offsets=np.array([0, 3, 5]),
            )
        )
    assert check_evaluation_sets(_ragged()).sizes.tolist() == [3, 1]


def test_from_matrix_and_to_long_invert_to_matrix_and_from_long():
    from sklocus.evaluations import from_matrix, to_long

    rng = np.random.default_rng(0)
    queries = [f"q{i}" for i in range(30)] + [7, ("tuple", 1)]
    sets = []
    for _ in range(6):
        chosen = rng.choice(len(queries), rng.integers(1, 12), replace=False)
        sets.append({queries[i]: float(rng.integers(0, 3)) / 2 for i in chosen})
    names = [f"m{i}" for i in range(6)]
    matrix, columns = to_matrix(sets)
    assert from_matrix(matrix, columns, names) == sets
    frame = to_long(sets, names, model="llm", query="prompt", score="correct")
    assert list(frame.columns) == ["llm", "prompt", "correct"]
    assert len(frame) == sum(map(len, sets))
    back, back_names = from_long(frame, model="llm", query="prompt", score="correct")
    assert (back, back_names) == (sets, names)
    # Each set's queries keep their order.
    assert [list(s) for s in back] == [list(s) for s in sets]


def test_from_matrix_and_to_long_name_what_is_wrong():
    from sklocus.evaluations import from_matrix, to_long

    with pytest.raises(ValueError, match=r"shape \(3, 2\) for 2 queries"):
        from_matrix(np.zeros((3, 2)), ["a", "b"])
    with pytest.raises(ValueError, match="'b'.*empty|empty.*'b'"):
        from_matrix([[1.0, np.nan], [0.0, np.nan]], ["q1", "q2"], ["a", "b"])
    with pytest.raises(ValueError, match="1.5"):
        from_matrix([[1.5]], ["q1"])
    with pytest.raises(ValueError, match="1 model names for 2 evaluation sets"):
        to_long([{"q": 1}, {"q": 0}], ["a"])
    with pytest.raises(ValueError, match="three names"):
        to_long([{"q": 1}], ["a"], query="model")
