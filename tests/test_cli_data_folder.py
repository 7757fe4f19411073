"""A data folder from the shell: the shipped one, its prices and its split."""

import numpy as np
import pandas as pd
import pytest
from marks import slow_fixture
from test_cli import TINY, in_process, sklocus, succeeded

from sklocus.datasets import load_evaluations, make_evaluations

PRICE = "input_price"


def _error(run):
    assert run.returncode == 2, run.stderr
    (line,) = run.stderr.strip().splitlines()[-1:]
    return line


@slow_fixture(scope="module")
def folder(tmp_path_factory):
    """A folder in the shipped layout: split, prices, encodings; and a model."""
    path = tmp_path_factory.mktemp("folder")
    data = make_evaluations(n_models=12, n_queries=120, query_dim=16, random_state=1)
    rows = [
        (name, query, score)
        for name, evaluations in zip(data.model_names, data.evaluation_sets)
        for query, score in evaluations.items()
    ]
    pd.DataFrame(rows, columns=["model", "query_id", "score"]).to_parquet(
        path / "responses.parquet"
    )
    split = ["test" if i % 4 == 0 else "train" for i in range(len(data.query_ids))]
    pd.DataFrame(
        {
            "query_id": data.query_ids,
            "query": [f"text of {q}" for q in data.query_ids],
            "split": split,
        }
    ).to_parquet(path / "queries.parquet")
    prices = np.round(np.linspace(0.1, 1.2, len(data.model_names)), 2)
    pd.DataFrame({"model": data.model_names, PRICE: prices}).to_parquet(
        path / "models.parquet"
    )
    np.save(path / "encodings_all-MiniLM-L6-v2.npy", data.query_vectors)
    fit = sklocus("fit", ".", "-o", "model.sklocus", *TINY, cwd=path)
    succeeded(fit)
    test = [q for q, s in zip(data.query_ids, split) if s == "test"]
    return path, data, dict(zip(data.model_names, prices)), test


@pytest.mark.slow
def test_data_names_the_shipped_folders(tmp_path):
    listed = succeeded(sklocus("data", cwd=tmp_path))
    assert listed.stdout.startswith("llmrouter\t")
    assert "500 test" in listed.stdout
    path = succeeded(sklocus("data", "llmrouter", cwd=tmp_path)).stdout.strip()
    data = load_evaluations(path)
    assert len(data.model_names) == 9
    assert (data.queries["split"] == "test").sum() == 500
    assert {"input_price", "output_price"} <= set(data.models.columns)
    line = _error(sklocus("data", "llmrouters", cwd=tmp_path))
    assert "no shipped data set is called 'llmrouters'" in line
    assert "['llmrouter']" in line


def test_a_folder_gives_each_models_cost_from_models_parquet(folder, capsys):
    path, data, prices, _ = folder
    embed = ("embed", "model.sklocus", ".", "-o", "emb.csv", "--cost-column", PRICE)
    succeeded(in_process(*embed, cwd=path, capsys=capsys))
    written = pd.read_csv(path / "emb.csv")
    assert dict(zip(written["model"], written[PRICE])) == pytest.approx(prices)
    missing = in_process(*embed[:-1], "params_b", cwd=path, capsys=capsys)
    line = _error(missing)
    assert "models.parquet: no column 'params_b' (--cost-column)" in line


def test_a_folder_cost_that_is_missing_is_named(folder, tmp_path, capsys):
    path, data, prices, _ = folder
    for name in ("responses.parquet", "queries.parquet"):
        (tmp_path / name).write_bytes((path / name).read_bytes())
    (tmp_path / "encodings_all-MiniLM-L6-v2.npy").write_bytes(
        (path / "encodings_all-MiniLM-L6-v2.npy").read_bytes()
    )
    # One model has no row in models.parquet, and one listed has no responses.
    table = pd.DataFrame({"model": data.model_names[1:] + ["retired"]})
    table[PRICE] = 1.0
    table.to_parquet(tmp_path / "models.parquet")
    model = path / "model.sklocus"
    embed = ("embed", model, ".", "-o", "emb.csv", "--cost-column", PRICE)
    run = in_process(*embed, cwd=tmp_path, capsys=capsys)
    line = _error(run)
    assert f"model {data.model_names[0]!r} has no value in column {PRICE!r}" in line
    # The model with no responses is said, not dropped without a word.
    assert "lists 1 model(s) that" in run.stderr and "'retired'" in run.stderr


def test_test_split_holds_out_the_folders_split(folder, capsys):
    path, data, prices, test = folder
    split = ("--test-split", "test")
    fit = ("fit", ".", "-o", "split.sklocus", *TINY, *split)
    fit = succeeded(in_process(*fit, cwd=path, capsys=capsys))
    assert f", {len(test)} held out" in fit.stderr
    (line,) = [x for x in fit.stderr.splitlines() if "Routing accuracy" in x]
    assert line.endswith(f"on the {len(test)} held-out queries of split 'test'.")
    # Without QUERIES, route routes the held-out queries, and says what the
    # best single model scores on them.
    route = ("route", "split.sklocus", ".", "-o", "routes.csv", *split)
    run = succeeded(in_process(*route, cwd=path, capsys=capsys))
    routes = pd.read_csv(path / "routes.csv")
    assert routes["query"].tolist() == test
    assert line in run.stderr.splitlines()
    assert "The best single model on the pool, " in run.stderr
    # The same routing accuracy as the file of the same queries gives.
    (path / "test.txt").write_text("\n".join(test) + "\n")
    listed = ("route", "split.sklocus", ".", "-o", "listed.csv")
    listed = succeeded(
        in_process(*listed, "--test-queries", "test.txt", cwd=path, capsys=capsys)
    )
    (other,) = [x for x in listed.stderr.splitlines() if "Routing accuracy" in x]
    assert other.split(" on the ")[0] == line.split(" on the ")[0]
    pd.testing.assert_frame_equal(pd.read_csv(path / "listed.csv"), routes)


def test_route_says_what_a_cost_policy_spends(folder, capsys):
    path, data, prices, test = folder
    route = ("route", "model.sklocus", ".", "-o", "cheap.csv", "--test-split", "test")
    route += ("--cost-column", PRICE, "--cost-weight", "0.5")
    run = succeeded(in_process(*route, cwd=path, capsys=capsys))
    (said,) = [x for x in run.stderr.splitlines() if "best single model" in x]
    chosen = pd.read_csv(path / "cheap.csv")["model"]
    spent = np.mean([prices[m] for m in chosen])
    assert said.endswith(f"the routes cost {spent:.4g} per query.")
    best = said.split("on the pool, ")[1].split(",")[0]
    assert f"at a cost of {prices[best]:.4g} per query" in said
    # Routing other queries (QUERIES), it still says what the held-out ones cost.
    train = [q for q in data.query_ids if q not in set(test)]
    (path / "train.txt").write_text("\n".join(train[:7]) + "\n")
    other = ("route", "model.sklocus", ".", "train.txt", "-o", "other.csv")
    other += route[5:]
    run = succeeded(in_process(*other, cwd=path, capsys=capsys))
    assert len(pd.read_csv(path / "other.csv")) == 7
    assert said in run.stderr.splitlines()


def test_test_split_errors_name_what_was_expected(folder, capsys):
    path, *_ = folder
    route = ("route", "model.sklocus", ".", "-o", "r.csv")
    line = _error(in_process(*route, "--test-split", "dev", cwd=path, capsys=capsys))
    assert "no query of . has 'split' equal to 'dev'" in line
    assert "['test', 'train']" in line
    column = ("--test-split", "test", "--split-column", "fold")
    line = _error(in_process(*route, *column, cwd=path, capsys=capsys))
    assert "--split-column" in line and "'fold'" in line
    both = ("--test-split", "test", "--test-queries", "x.txt")
    line = _error(in_process(*route, *both, cwd=path, capsys=capsys))
    assert "not allowed with argument" in line
    line = _error(in_process(*route, cwd=path, capsys=capsys))
    assert "QUERIES is missing" in line and "--test-split" in line


def test_queries_text_column_names_the_texts_of_queries(folder, capsys):
    path, data, *_ = folder
    pd.DataFrame({"query": ["a", "b"], "prompt": ["Name a prime.", "2 + 2?"]}).to_csv(
        path / "new.csv", index=False
    )
    # The folder brings its own texts: --text-column is refused, and says
    # which option names those of QUERIES.
    route = ("route", "model.sklocus", ".", "new.csv", "-o", "new_routes.csv")
    line = _error(
        in_process(*route, "--text-column", "prompt", cwd=path, capsys=capsys)
    )
    assert "--queries-text-column" in line
    # The option names a column of QUERIES, checked there.
    known = pd.DataFrame({"query": data.query_ids[:2], "prompt": ["x", "y"]})
    known.to_csv(path / "known.csv", index=False)
    route = ("route", "model.sklocus", ".", "known.csv", "-o", "known_routes.csv")
    run = in_process(*route, "--queries-text-column", "nope", cwd=path, capsys=capsys)
    line = _error(run)
    assert "--queries-text-column" in line and "'nope'" in line
