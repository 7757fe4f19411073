"""Fetch the EmbedLLM correctness data (Zhuang et al., ICLR 2025).

The data is the Hugging Face dataset ``RZ412/EmbedLLM``
(https://huggingface.co/datasets/RZ412/EmbedLLM, Apache-2.0). What is known of its
files, and where it was found (the files themselves could not be opened here):

``train.csv``, ``val.csv``, ``test.csv`` (2.7 GB, 273 MB, 282 MB)
    One row per (model, question, category): ``model_id``, ``model_name``,
    ``prompt_id``, ``prompt``, ``category`` and ``label`` (0/1 correctness); the
    column order is not known and does not matter here. Sources: the authors' code,
    github.com/richardzhuang0412/EmbedLLM, ``algorithm/mf.py`` (reads ``model_id``,
    ``prompt_id``, ``label``, ``model_name``) and ``algorithm/knn.py`` (groups by
    ``model_id``, ``prompt_id``, ``prompt``); github.com/kholdrex/irt-llm-budget-eval,
    ``src/irteval/prepare.py`` (reads ``prompt_id``, ``model_id``, ``label``,
    ``category``; counts 3,814,272 / 383,488 / 388,528 rows, 112 models and 35,673
    distinct questions at revision 266ae3e).
``question_order.csv`` (19.8 MB)
    ``prompt_id``, ``prompt``: the text of each question. Source:
    ``data_preprocessing/get_question_embedding_tensor.py`` of the authors' code
    (reads ``prompt``) and other users of the data reading ``prompt_id``, ``prompt``.
``model_order.csv`` (3.9 kB)
    ``model_id``, ``model_name`` (names such as ``microsoft__phi-2``). Source:
    ``src/irteval/prepare.py`` above, which sorts it by ``model_id``.

The file list is the dataset's tree at ``main`` (huggingface.co, revision 266ae3e) and
the authors' ``download_data.py``; the ``*.pth`` tensors there are not needed.

The paper (arXiv:2410.02223) splits the *questions* 80/10/10 at random into train,
validation and test, so the split is a property of a question: ``queries["split"]``
records the file each question's rows came from (several joined by ``"|"``, should a
question appear in more than one file).

A question listed under several categories (task variants) has one row per category
for the same model (noted in ``irteval/prepare.py``), so a (model, question) pair can
have several labels, which may disagree. The authors' ``knn.py`` keeps the maximum,
which counts a disagreement as correct; here the pairs are resolved by majority vote
with :func:`~sklocus.evaluations.from_long`, a tie giving the mean (0.5). A missing
label is an error, never a 0.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from huggingface_hub import constants as hub_constants
from huggingface_hub import hf_hub_download
from sklearn.datasets import get_data_home
from sklearn.utils import Bunch

from sklocus.encoders import SentenceEncoder
from sklocus.evaluations import from_long

__all__ = ["fetch_embedllm"]

_REPO_ID = "RZ412/EmbedLLM"
_REPO_URL = "https://huggingface.co/datasets/RZ412/EmbedLLM"
# The revision whose row counts are documented above; pinned so that every download
# gets the same data.
_REVISION = "266ae3e180ccb533c86afc9cfb2f5db99d171aea"
_SPLITS = ("train", "val", "test")
_FILES = (
    *(f"{split}.csv" for split in _SPLITS),
    "question_order.csv",
    "model_order.csv",
)
_FOLDER_NAME = "embedllm"

_DESCR = """\
EmbedLLM correctness data
=========================

Zhuang, Wu, Wen, Li, Jiao and Ramchandran, "EmbedLLM: Learning Compact
Representations of Large Language Models", ICLR 2025 (arXiv:2410.02223).
Data: {url} (Apache-2.0),
revision {revision}.

Whether each of {n_models} open language models answered each of {n_queries} benchmark
questions correctly (0/1). The questions come from the test sets of MMLU,
TruthfulQA, SocialIQA, PIQA, MedMCQA, MathQA, LogiQA, GSM8K, GPQA and ASDiv; the
paper splits them 80/10/10 into train, val and test (queries["split"]).

{n_rows} rows of train.csv, val.csv and test.csv give {n_evaluations} evaluations: a
(model, question) pair with several rows (a question listed under several
categories) is resolved by majority vote, a tie giving 0.5. Missing labels are
errors, never zeros.

Files read from {folder}.
"""


def _hub_offline() -> bool:
    """Whether the hub is in offline mode, now or when huggingface_hub was imported."""
    # huggingface_hub reads HF_HUB_OFFLINE once, at import; the variable may have been
    # set since.
    if hub_constants.HF_HUB_OFFLINE:
        return True
    return any(
        os.environ.get(name, "").upper() in hub_constants.ENV_VARS_TRUE_VALUES
        for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def _missing_files(folder: Path) -> list[str]:
    return [name for name in _FILES if not (folder / name).is_file()]


def _not_found_message(folder: Path, missing: list[str], reason: str) -> str:
    links = "\n".join(f"  {_REPO_URL}/resolve/{_REVISION}/{name}" for name in missing)
    return (
        f"EmbedLLM data not found: {folder} lacks {', '.join(missing)} ({reason}). "
        f"Download these files from {_REPO_URL} and put them in {folder}:\n{links}"
    )


def _download(folder: Path, missing: list[str]) -> None:
    """Download the missing files into ``folder``, or raise OSError saying how to."""
    if _hub_offline():
        raise OSError(
            _not_found_message(
                folder,
                missing,
                "the Hugging Face hub is in offline mode: HF_HUB_OFFLINE",
            )
        )
    for name in missing:
        try:
            hf_hub_download(
                repo_id=_REPO_ID,
                repo_type="dataset",
                filename=name,
                revision=_REVISION,
                local_dir=folder,
            )
        except Exception as exc:  # offline, refused, timed out, not found...
            raise OSError(
                _not_found_message(
                    folder,
                    _missing_files(folder),
                    f"downloading {name} failed: {type(exc).__name__}: {exc}",
                )
            ) from exc


def _read_csv(path: Path, required: list[str], optional=(), dtype=None):
    """Read the named columns of a CSV file, checking that the required ones exist."""
    header = list(pd.read_csv(path, nrows=0).columns)
    absent = [column for column in required if column not in header]
    if absent:
        raise ValueError(
            f"{path} lacks the column(s) {absent}; its columns are {header}"
        )
    columns = [*required, *(column for column in optional if column in header)]
    dtype = {key: value for key, value in (dtype or {}).items() if key in columns}
    return pd.read_csv(path, usecols=columns, dtype=dtype)


def _first_missing(frame: pd.DataFrame, column: str):
    """Position of the first NaN of ``frame[column]``, or None."""
    missing = frame[column].isna().to_numpy()
    return int(missing.argmax()) if missing.any() else None


def _value(frame: pd.DataFrame, column: str, position: int):
    """``frame[column]`` at ``position`` as a plain Python value, for messages."""
    value = frame[column].iloc[position]
    return value.item() if isinstance(value, np.generic) else value


def _read_models(path: Path) -> pd.DataFrame:
    models = pd.read_csv(path)
    for column in ("model_id", "model_name"):
        if column not in models.columns:
            raise ValueError(
                f"{path} lacks the column {column!r}; its columns are "
                f"{list(models.columns)}"
            )
        position = _first_missing(models, column)
        if position is not None:
            raise ValueError(f"{path}, data row {position + 1}, has no {column}")
        repeated = models[column].duplicated()
        if repeated.any():
            raise ValueError(
                f"{path} lists {column} "
                f"{_value(models, column, int(repeated.argmax()))!r} twice"
            )
    return models.sort_values("model_id", kind="stable").reset_index(drop=True)


def _read_questions(path: Path) -> pd.Series:
    questions = _read_csv(path, ["prompt_id", "prompt"])
    position = _first_missing(questions, "prompt_id")
    if position is not None:
        raise ValueError(f"{path}, data row {position + 1}, has no prompt_id")
    repeated = questions["prompt_id"].duplicated()
    if repeated.any():
        raise ValueError(
            f"{path} lists prompt_id "
            f"{_value(questions, 'prompt_id', int(repeated.argmax()))!r} twice"
        )
    return questions.set_index("prompt_id")["prompt"]


def _read_split(path: Path, split: str, models: pd.DataFrame) -> pd.DataFrame:
    """Read one split file: model, model_id, prompt_id, label, category, split."""
    rows = _read_csv(
        path,
        ["model_id", "prompt_id", "label"],
        optional=["category"],
        dtype={"category": "category"},
    )
    for column in ("model_id", "prompt_id"):
        position = _first_missing(rows, column)
        if position is not None:
            raise ValueError(f"{path}, data row {position + 1}, has no {column}")
    code = pd.Index(models["model_id"]).get_indexer(rows["model_id"])
    if (code < 0).any():
        position = int((code < 0).argmax())
        raise ValueError(
            f"{path}, data row {position + 1}, has model_id "
            f"{_value(rows, 'model_id', position)!r}, which "
            f"{path.with_name('model_order.csv')} does not list"
        )
    names = pd.Categorical.from_codes(code, categories=models["model_name"])
    position = _first_missing(rows, "label")
    if position is not None:
        raise ValueError(
            f"{path}, data row {position + 1}: model {names[position]!r} (model_id "
            f"{_value(rows, 'model_id', position)!r}) has no label for prompt "
            f"{_value(rows, 'prompt_id', position)!r}; a missing label is an error, "
            "never read as 0"
        )
    rows.insert(0, "model", names)
    # Categorical with the same categories in every file, so that they concatenate.
    rows["split"] = pd.Categorical.from_codes(
        np.full(len(rows), _SPLITS.index(split)), categories=list(_SPLITS)
    )
    return rows


def _join_per_prompt(frame: pd.DataFrame, column: str, order=None) -> pd.Series:
    """For each prompt, its distinct values of ``column`` joined by ``"|"``."""
    pairs = frame[["prompt_id", column]].dropna().drop_duplicates()
    rank = (lambda value: order.index(value)) if order is not None else str

    def join(values):
        return "|".join(str(value) for value in sorted(values, key=rank))

    return pairs.groupby("prompt_id", sort=True, observed=True)[column].agg(join)


def fetch_embedllm(
    data_home=None, *, download_if_missing=True, encoder="all-MiniLM-L6-v2"
):
    """Load the EmbedLLM data: 112 models' correctness on 35,673 benchmark questions.

    The data of Zhuang et al., "EmbedLLM: Learning Compact Representations of Large
    Language Models" (ICLR 2025), from the Hugging Face dataset ``RZ412/EmbedLLM``.
    ``train.csv``, ``val.csv``, ``test.csv``, ``question_order.csv`` and
    ``model_order.csv`` are read from the ``embedllm`` folder of the scikit-learn
    data home; those missing are downloaded first (about 3.3 GB in all, most of it
    ``train.csv``). When every file is there, nothing touches the network.

    The three splits are combined. Repeated (model, question) rows are resolved by
    majority vote, a tie giving the mean of the tied labels (0.5 for a 0/1 tie). A
    missing label is an error, never read as 0.

    Read more in the :ref:`User Guide <data_folder>`.

    Parameters
    ----------
    data_home : str or path-like, default=None
        The scikit-learn data home (see :func:`sklearn.datasets.get_data_home`); the
        files live in its ``embedllm`` folder. ``None`` means ``~/scikit_learn_data``
        or ``$SCIKIT_LEARN_DATA``.
    download_if_missing : bool, default=True
        Download missing files from the Hugging Face hub. When ``False``, or when the
        hub is offline (``HF_HUB_OFFLINE=1``, checked first, so nothing is tried)
        or unreachable (after huggingface_hub's retries, about 20 s), missing files
        raise ``OSError``.
    encoder : str or path-like, default="all-MiniLM-L6-v2"
        sentence-transformers model of the returned :class:`~sklocus.SentenceEncoder`.

    Returns
    -------
    data : Bunch
        With the fields:

        evaluation_sets : list of dict
            One ``{prompt_id: label}`` dict per model, ordered by ``model_id``; a
            model of ``model_order.csv`` with no evaluations is left out.
        model_names : list of str
            The ``model_name`` of each set.
        queries : DataFrame
            One row per evaluated question, by ``prompt_id``: ``query_id`` (the
            ``prompt_id``), ``query`` (its text), ``category`` (its categories in the
            files, several joined by ``"|"``; present when the files have it) and
            ``split`` (``"train"``, ``"val"`` or ``"test"``: the file its rows came
            from, several joined by ``"|"``).
        models : DataFrame
            One row per set: ``model`` (the name), ``model_id``, any other column of
            ``model_order.csv``, and ``n_evaluations``.
        encoder : SentenceEncoder
            Encodes the prompt ids of ``evaluation_sets`` through their texts.
        DESCR : str
            Description of the data.

    Raises
    ------
    OSError
        If files are missing and cannot be downloaded. The message lists the files,
        where to get them and the folder to put them in.
    ValueError
        If a file lacks a column, an id or a label is missing (the message names the
        file, the row, and for a label the model and the prompt), or a label is
        outside [0, 1] (the message names the model and the prompt).
    TypeError
        If a label is not a number.

    Examples
    --------
    >>> from sklocus.datasets import fetch_embedllm
    >>> data = fetch_embedllm()  # doctest: +SKIP
    >>> len(data.evaluation_sets), len(data.queries)  # doctest: +SKIP
    (112, 35673)
    """
    folder = Path(get_data_home(data_home)) / _FOLDER_NAME
    folder.mkdir(parents=True, exist_ok=True)
    missing = _missing_files(folder)
    if missing:
        if not download_if_missing:
            raise OSError(
                _not_found_message(folder, missing, "download_if_missing=False")
            )
        _download(folder, missing)

    models = _read_models(folder / "model_order.csv")
    texts = _read_questions(folder / "question_order.csv")
    frame = pd.concat(
        [_read_split(folder / f"{split}.csv", split, models) for split in _SPLITS],
        ignore_index=True,
    )
    evaluation_sets, model_names = from_long(
        frame, model="model", query="prompt_id", score="label", duplicates="majority"
    )
    model_ids = dict(zip(models["model_name"], models["model_id"], strict=True))
    order = sorted(range(len(model_names)), key=lambda i: model_ids[model_names[i]])
    evaluation_sets = [evaluation_sets[i] for i in order]
    model_names = [model_names[i] for i in order]

    queries = pd.DataFrame({"query_id": sorted(frame["prompt_id"].unique().tolist())})
    queries["query"] = texts.reindex(queries["query_id"]).to_numpy()
    untexted = queries["query_id"][queries["query"].isna()].tolist()
    if untexted:
        warnings.warn(
            f"{len(untexted)} evaluated prompt(s) have no text in "
            f"{folder / 'question_order.csv'} (prompt_id {untexted[0]!r} first); "
            "the encoder cannot encode them",
            UserWarning,
            stacklevel=2,
        )
    if "category" in frame.columns:
        category = _join_per_prompt(frame, "category")
        queries["category"] = category.reindex(queries["query_id"]).to_numpy()
    split = _join_per_prompt(frame, "split", order=list(_SPLITS))
    queries["split"] = split.reindex(queries["query_id"]).to_numpy()

    models = models.set_index("model_name").loc[model_names].reset_index()
    models = models.rename(columns={"model_name": "model"})
    models["n_evaluations"] = [len(evaluations) for evaluations in evaluation_sets]

    query_encoder = SentenceEncoder(
        model=encoder,
        texts={
            query_id: text
            for query_id, text in zip(
                queries["query_id"].tolist(), queries["query"], strict=True
            )
            if isinstance(text, str)
        },
    )
    descr = _DESCR.format(
        url=_REPO_URL,
        revision=_REVISION,
        n_models=len(evaluation_sets),
        n_queries=len(queries),
        n_rows=len(frame),
        n_evaluations=int(models["n_evaluations"].sum()),
        folder=folder,
    )
    return Bunch(
        evaluation_sets=evaluation_sets,
        model_names=[str(name) for name in model_names],
        queries=queries,
        models=models,
        encoder=query_encoder,
        DESCR=descr,
    )
