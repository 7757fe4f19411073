"""Read evaluations stored in sklocus's on-disk format.

The format is a folder of Parquet files, the layout in which the benchmarks read
the Open LLM Leaderboard evaluations of 5,949 models on 1,075 queries (licence CC
BY-NC-SA 4.0; not distributed with sklocus):

``responses.parquet`` (required)
    Long table, one row per evaluation: ``model`` (str), ``query_id`` (str or int),
    ``score`` (number in [0, 1]). Each (model, query_id) pair appears once.
``queries.parquet`` (required)
    One row per query: ``query_id``, ``query`` (the text to encode), and any other
    columns (``benchmark``, ``subject``, ``split``...).
``models.parquet`` (optional)
    One row per model: ``model`` and any metadata (``params_b``...).
``encodings_<encoder>.npy`` (optional)
    float32 array ``(n_queries, dim)``: encodings of ``query`` by the named encoder,
    rows in the order of ``queries.parquet``.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.utils import Bunch

from sklocus._shipped import shipped_folder
from sklocus.encoders import PrecomputedEncoder, SentenceEncoder
from sklocus.evaluations import from_long


def _require_columns(frame, columns, path):
    missing = [column for column in columns if column not in frame.columns]
    if missing:
        raise ValueError(
            f"{path} lacks the column(s) {missing}; its columns are "
            f"{list(frame.columns)}"
        )


def _read_parquet(path):
    """Read a Parquet file; any failure is a ValueError that names the file."""
    try:
        return pd.read_parquet(path)
    except Exception as error:  # pyarrow raises its own types, OSError among them
        raise ValueError(
            f"{path} is not a readable Parquet file ({type(error).__name__}: {error})"
        ) from error


def load_evaluations(path, *, encoder="all-MiniLM-L6-v2"):
    """Load evaluations from a folder in sklocus's on-disk format.

    Read more in the :ref:`User Guide <data_folder>`.

    Parameters
    ----------
    path : str or path-like
        The folder, e.g. a copy of the Open LLM Leaderboard data.
    encoder : str, default="all-MiniLM-L6-v2"
        Query encoder to provide. When the folder holds ``encodings_<encoder>.npy``
        those encodings are used; otherwise a :class:`~sklocus.SentenceEncoder` of
        that name encodes the query texts.

    Returns
    -------
    data : Bunch
        With the fields:

        evaluation_sets : list of dict
            One ``{query_id: score}`` dict per model.
        model_names : list of str
            In order of first appearance in ``responses.parquet``.
        queries : DataFrame
            The query table (with its ``split``, where present).
        models : DataFrame
            Model metadata, one row per entry of ``model_names`` in that order (only
            a ``model`` column when ``models.parquet`` is absent).
        encoder : PrecomputedEncoder or SentenceEncoder
            Encodes the query ids of ``evaluation_sets``.

    Examples
    --------
    >>> from sklocus.datasets import load_evaluations
    >>> data = load_evaluations("openllm")  # doctest: +SKIP
    >>> len(data.model_names), len(data.queries)  # doctest: +SKIP
    (5949, 1075)
    """
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a folder of evaluation data")
    for required in ("responses.parquet", "queries.parquet"):
        if not (folder / required).is_file():
            raise FileNotFoundError(
                f"{folder} lacks {required}; see sklocus.datasets.load_evaluations "
                "for the expected layout"
            )

    queries = _read_parquet(folder / "queries.parquet")
    _require_columns(queries, ["query_id", "query"], folder / "queries.parquet")
    if not queries["query_id"].is_unique:
        repeated = queries["query_id"][queries["query_id"].duplicated()].iloc[0]
        raise ValueError(f"{folder / 'queries.parquet'} lists query {repeated!r} twice")

    responses = _read_parquet(folder / "responses.parquet")
    _require_columns(
        responses, ["model", "query_id", "score"], folder / "responses.parquet"
    )
    unknown = ~responses["query_id"].isin(queries["query_id"])
    if unknown.any():
        stray = responses["query_id"][unknown].iloc[0]
        raise ValueError(
            f"{folder / 'responses.parquet'} has query {stray!r} that "
            f"{folder / 'queries.parquet'} does not list"
        )
    try:
        evaluation_sets, model_names = from_long(responses, query="query_id")
    except (TypeError, ValueError) as error:
        raise type(error)(f"{folder / 'responses.parquet'}: {error}") from error

    models_path = folder / "models.parquet"
    if models_path.is_file():
        models = _read_parquet(models_path)
        _require_columns(models, ["model"], models_path)
        if not models["model"].is_unique:
            repeated = models["model"][models["model"].duplicated()].iloc[0]
            raise ValueError(
                f"{models_path} has more than one row for model {repeated!r}; give "
                "each model one row"
            )
        unevaluated = ~models["model"].isin(model_names)
        if unevaluated.any():
            warnings.warn(
                f"{models_path} lists {int(unevaluated.sum())} model(s) that "
                f"{folder / 'responses.parquet'} has no row for, such as "
                f"{models['model'][unevaluated].iloc[0]!r}; they are left out",
                UserWarning,
                stacklevel=2,
            )
        models = models.set_index("model").reindex(model_names).reset_index()
    else:
        models = pd.DataFrame({"model": model_names})

    encodings_path = folder / f"encodings_{encoder}.npy"
    if encodings_path.is_file():
        try:
            vectors = np.load(encodings_path, allow_pickle=False)
        except (OSError, ValueError) as error:
            raise ValueError(
                f"{encodings_path} is not a readable .npy array: {error}"
            ) from error
        if vectors.shape[0] != len(queries):
            raise ValueError(
                f"{encodings_path} has {vectors.shape[0]} rows but "
                f"{folder / 'queries.parquet'} lists {len(queries)} queries"
            )
        query_encoder = PrecomputedEncoder(list(queries["query_id"]), vectors)
    else:
        texts = dict(zip(queries["query_id"], queries["query"]))
        query_encoder = SentenceEncoder(model=encoder, texts=texts)

    return Bunch(
        evaluation_sets=evaluation_sets,
        model_names=[str(name) for name in model_names],
        queries=queries,
        models=models,
        encoder=query_encoder,
    )


def load_llmrouter(*, encoder="all-MiniLM-L6-v2"):
    """Load the LLMRouter routing data packaged with sklocus.

    Real results of 9 open language models on 6,108 questions (math, code,
    science, logic puzzles and more; every model on every question), with each
    model's price, from the LLMRouter project (``ulab-uiuc/LLMRouter`` on GitHub,
    MIT licence). The pool most teams have: a handful of models they serve, each
    evaluated on thousands of their own questions.

    Read more in the :ref:`User Guide <llmrouter_data>`.

    Parameters
    ----------
    encoder : str, default="all-MiniLM-L6-v2"
        Sentence encoder of the question texts. The default's encodings of
        them ship with sklocus and are used as they are; another encoder
        encodes them on first use (MiniLM takes two to four minutes for all
        6,108 on two CPU cores).

    Returns
    -------
    data : Bunch
        As :func:`load_evaluations` returns it: ``evaluation_sets`` and
        ``model_names`` (9), ``queries`` (``query_id``, ``query``, ``split``:
        the source's own 5,608 ``train`` and 500 ``test`` questions), ``models``
        (``params_b`` and ``input_price`` and ``output_price`` in US$ per million
        tokens) and ``encoder``, which encodes the query ids.

    Examples
    --------
    >>> from sklocus.datasets import load_llmrouter
    >>> data = load_llmrouter()
    >>> len(data.model_names), data.queries["split"].value_counts()["test"]
    (9, np.int64(500))
    """
    return load_evaluations(shipped_folder("llmrouter"), encoder=encoder)
