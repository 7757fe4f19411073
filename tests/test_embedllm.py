"""fetch_embedllm on a tiny copy of the EmbedLLM files; nothing touches the network."""

import csv
import shutil

import pytest
from huggingface_hub import constants as hub_constants

from sklocus.datasets import _embedllm
from sklocus.datasets._embedllm import fetch_embedllm
from sklocus.encoders import SentenceEncoder

MODELS = [(0, "org__alpha-7b"), (1, "org__beta-2b"), (2, "org__gamma-13b")]
# model 3 is listed but has no evaluations, as a model of model_order.csv may.
MODEL_ORDER = [*MODELS, (3, "org__delta-1b")]
PROMPTS = {
    0: "What is 2 + 2?",
    1: "Name a prime number.",
    2: "Which gas do plants absorb?",
    3: 'He said "yes, and no", then left.\nWhat did he say?',
    4: "Translate 'chat' to English.",
    5: "What is the boiling point of water at sea level?",
    6: "A question no model was asked.",
}
NAME = dict(MODEL_ORDER)
COLUMNS = ["model_id", "model_name", "prompt_id", "prompt", "category", "label"]

# (model_id, prompt_id, category, label), in file order. Prompt 2 is listed under
# three MMLU subjects, so each model has several rows for it: model 0 has 1, 1, 0
# (majority 1), model 1 has 1, 0 (a tie: 0.5), model 2 has 0, 0, 0.
TRAIN = [
    (1, 0, "gsm8k", 0),
    (0, 0, "gsm8k", 1),
    (2, 0, "gsm8k", 1),
    (0, 1, "asdiv", 0),
    (1, 1, "asdiv", 1),
    (0, 2, "mmlu_biology", 1),
    (0, 2, "mmlu_botany", 1),
    (0, 2, "mmlu_chemistry", 0),
    (1, 2, "mmlu_biology", 1),
    (1, 2, "mmlu_botany", 0),
    (2, 2, "mmlu_biology", 0),
    (2, 2, "mmlu_botany", 0),
    (2, 2, "mmlu_chemistry", 0),
]
VAL = [(0, 3, "logiqa", 1), (1, 3, "logiqa", 0), (2, 3, "logiqa", 1), (0, 4, "piqa", 0)]
TEST = [(1, 5, "mathqa", 1), (2, 5, "mathqa", 0)]

EXPECTED_SETS = [
    {0: 1.0, 1: 0.0, 2: 1.0, 3: 1.0, 4: 0.0},
    {0: 0.0, 1: 1.0, 2: 0.5, 3: 0.0, 5: 1.0},
    {0: 1.0, 2: 0.0, 3: 1.0, 5: 0.0},
]


def write_csv(path, header, rows):
    with open(path, "w", newline="", encoding="utf-8") as file:
        writer = csv.writer(file)
        writer.writerow(header)
        writer.writerows(rows)


def write_split(path, rows, columns=COLUMNS):
    values = {
        "model_name": lambda m, p, c, y: NAME[m],
        "model_id": lambda m, p, c, y: m,
        "prompt_id": lambda m, p, c, y: p,
        "prompt": lambda m, p, c, y: PROMPTS[p],
        "category": lambda m, p, c, y: c,
        "label": lambda m, p, c, y: y,
    }
    write_csv(path, columns, [[values[c](*row) for c in columns] for row in rows])


def write_fixture(data_home, train=TRAIN, columns=COLUMNS):
    folder = data_home / "embedllm"
    folder.mkdir(parents=True, exist_ok=True)
    write_split(folder / "train.csv", train, columns)
    write_split(folder / "val.csv", VAL, columns)
    write_split(folder / "test.csv", TEST, columns)
    write_csv(folder / "question_order.csv", ["prompt_id", "prompt"], PROMPTS.items())
    write_csv(folder / "model_order.csv", ["model_id", "model_name"], MODEL_ORDER)
    return folder


@pytest.fixture
def hub_calls(monkeypatch):
    """Record calls to hf_hub_download instead of making them; start offline."""
    calls = []

    def fake_download(**kwargs):
        calls.append(kwargs)
        raise AssertionError("fetch_embedllm must not reach the hub here")

    monkeypatch.setattr(_embedllm, "hf_hub_download", fake_download)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return calls


@pytest.fixture
def online(monkeypatch):
    """Pretend the hub is reachable (the test replaces the download itself)."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", False)


def test_reads_the_files_without_the_network(tmp_path, hub_calls):
    write_fixture(tmp_path)
    data = fetch_embedllm(data_home=tmp_path)
    assert hub_calls == []
    assert data.model_names == [name for _, name in MODELS]
    assert data.evaluation_sets == EXPECTED_SETS
    assert list(data.models["model"]) == data.model_names
    assert list(data.models["model_id"]) == [0, 1, 2]
    assert list(data.models["n_evaluations"]) == [5, 5, 4]
    assert "EmbedLLM" in data.DESCR and "2410.02223" in data.DESCR


def test_orders_models_by_model_id_not_by_file_order(tmp_path, hub_calls):
    # The first row of train.csv is model 1's; the sets still follow model_id.
    write_fixture(tmp_path)
    data = fetch_embedllm(data_home=tmp_path)
    assert data.model_names[0] == "org__alpha-7b"


def test_majority_vote_resolves_repeated_rows(tmp_path, hub_calls):
    write_fixture(tmp_path)
    sets = fetch_embedllm(data_home=tmp_path).evaluation_sets
    assert sets[0][2] == 1.0  # labels 1, 1, 0
    assert sets[1][2] == 0.5  # labels 1, 0: a tie gives the mean
    assert sets[2][2] == 0.0  # labels 0, 0, 0


def test_queries_record_text_category_and_split(tmp_path, hub_calls):
    write_fixture(tmp_path)
    queries = fetch_embedllm(data_home=tmp_path).queries
    assert list(queries.columns) == ["query_id", "query", "category", "split"]
    # Prompt 6 is in question_order.csv but was never evaluated.
    assert list(queries["query_id"]) == [0, 1, 2, 3, 4, 5]
    assert list(queries["query"]) == [PROMPTS[i] for i in range(6)]
    by_id = queries.set_index("query_id")
    assert by_id.loc[2, "category"] == "mmlu_biology|mmlu_botany|mmlu_chemistry"
    assert by_id.loc[0, "category"] == "gsm8k"
    assert list(queries["split"]) == ["train", "train", "train", "val", "val", "test"]


def test_a_prompt_in_several_files_lists_them_all(tmp_path, hub_calls):
    folder = write_fixture(tmp_path)
    write_split(folder / "test.csv", [*TEST, (2, 0, "gsm8k", 1)])
    queries = fetch_embedllm(data_home=tmp_path).queries.set_index("query_id")
    assert queries.loc[0, "split"] == "train|test"


def test_files_without_a_category_column(tmp_path, hub_calls):
    write_fixture(tmp_path, columns=["prompt_id", "model_id", "label"])
    data = fetch_embedllm(data_home=tmp_path)
    assert data.evaluation_sets == EXPECTED_SETS
    assert list(data.queries.columns) == ["query_id", "query", "split"]


def test_encoder_encodes_the_prompt_ids_through_their_texts(tmp_path, hub_calls):
    write_fixture(tmp_path)
    data = fetch_embedllm(data_home=tmp_path)
    assert isinstance(data.encoder, SentenceEncoder)
    assert data.encoder.model == "all-MiniLM-L6-v2"
    assert data.encoder.texts == {i: PROMPTS[i] for i in range(6)}
    for evaluations in data.evaluation_sets:
        for prompt_id in evaluations:
            assert data.encoder._text_of(0, prompt_id) == PROMPTS[prompt_id]
    other = fetch_embedllm(data_home=tmp_path, encoder="all-mpnet-base-v2")
    assert other.encoder.model == "all-mpnet-base-v2"


def test_default_data_home_is_scikit_learns(tmp_path, monkeypatch, hub_calls):
    write_fixture(tmp_path)
    monkeypatch.setenv("SCIKIT_LEARN_DATA", str(tmp_path))
    assert fetch_embedllm().evaluation_sets == EXPECTED_SETS


@pytest.mark.parametrize(
    "missing", ["train.csv", "val.csv", "test.csv", "question_order.csv"]
)
def test_missing_file_offline_says_what_to_download_and_where(
    tmp_path, hub_calls, missing
):
    folder = write_fixture(tmp_path)
    (folder / missing).unlink()
    with pytest.raises(OSError) as error:
        fetch_embedllm(data_home=tmp_path)
    message = str(error.value)
    assert missing in message
    assert str(folder) in message
    assert "https://huggingface.co/datasets/RZ412/EmbedLLM" in message
    assert "offline" in message
    assert hub_calls == []


def test_missing_files_without_download_lists_each(tmp_path, hub_calls, online):
    message_files = ["train.csv", "model_order.csv"]
    folder = write_fixture(tmp_path)
    for name in message_files:
        (folder / name).unlink()
    with pytest.raises(OSError, match="download_if_missing=False") as error:
        fetch_embedllm(data_home=tmp_path, download_if_missing=False)
    message = str(error.value)
    for name in message_files:
        assert f"/{name}" in message
    assert "val.csv" not in message
    assert hub_calls == []


def test_downloads_only_the_missing_files(tmp_path, monkeypatch, online):
    source = write_fixture(tmp_path / "source")
    folder = write_fixture(tmp_path / "home")
    (folder / "val.csv").unlink()
    (folder / "model_order.csv").unlink()
    calls = []

    def fake_download(*, repo_id, repo_type, filename, revision, local_dir):
        calls.append((repo_id, repo_type, filename, local_dir))
        shutil.copy(source / filename, local_dir)
        return str(local_dir / filename)

    monkeypatch.setattr(_embedllm, "hf_hub_download", fake_download)
    data = fetch_embedllm(data_home=tmp_path / "home")
    assert sorted(call[2] for call in calls) == ["model_order.csv", "val.csv"]
    assert {call[:2] for call in calls} == {("RZ412/EmbedLLM", "dataset")}
    assert {call[3] for call in calls} == {folder}
    assert data.evaluation_sets == EXPECTED_SETS


def test_a_failed_download_says_what_to_download_and_where(
    tmp_path, monkeypatch, online
):
    folder = write_fixture(tmp_path)
    (folder / "test.csv").unlink()

    def unreachable(**kwargs):
        raise ConnectionError("no route to host")

    monkeypatch.setattr(_embedllm, "hf_hub_download", unreachable)
    with pytest.raises(OSError, match="no route to host") as error:
        fetch_embedllm(data_home=tmp_path)
    message = str(error.value)
    assert "test.csv" in message and str(folder) in message
    assert "https://huggingface.co/datasets/RZ412/EmbedLLM" in message
    assert isinstance(error.value.__cause__, ConnectionError)


def test_a_missing_label_is_an_error_not_a_zero(tmp_path, hub_calls):
    folder = write_fixture(tmp_path)
    rows = [[*row] for row in TRAIN]
    rows[4][3] = ""  # model 1 ("org__beta-2b") on prompt 1
    write_split(folder / "train.csv", rows)
    with pytest.raises(ValueError, match="missing label") as error:
        fetch_embedllm(data_home=tmp_path)
    message = str(error.value)
    assert "train.csv" in message
    assert "'org__beta-2b'" in message
    assert "prompt 1" in message


def test_a_label_outside_0_1_is_an_error(tmp_path, hub_calls):
    folder = write_fixture(tmp_path)
    write_split(folder / "val.csv", [*VAL[:-1], (0, 4, "piqa", 2)])
    with pytest.raises(ValueError, match="'org__alpha-7b'.*score 2.*query 4"):
        fetch_embedllm(data_home=tmp_path)


def test_a_model_missing_from_model_order_is_an_error(tmp_path, hub_calls):
    folder = write_fixture(tmp_path)
    write_csv(folder / "model_order.csv", ["model_id", "model_name"], MODELS[:2])
    with pytest.raises(ValueError, match="model_id 2.*model_order.csv"):
        fetch_embedllm(data_home=tmp_path)


def test_a_file_without_a_required_column_is_named(tmp_path, hub_calls):
    folder = write_fixture(tmp_path)
    write_split(folder / "test.csv", TEST, ["model_id", "prompt_id", "category"])
    with pytest.raises(
        ValueError, match=r"test\.csv lacks the column\(s\) \['label'\]"
    ):
        fetch_embedllm(data_home=tmp_path)


def test_a_prompt_without_text_warns(tmp_path, hub_calls):
    folder = write_fixture(tmp_path)
    texts = [(i, text) for i, text in PROMPTS.items() if i != 4]
    write_csv(folder / "question_order.csv", ["prompt_id", "prompt"], texts)
    with pytest.warns(UserWarning, match="prompt_id 4"):
        data = fetch_embedllm(data_home=tmp_path)
    assert data.evaluation_sets == EXPECTED_SETS
    assert 4 not in data.encoder.texts
