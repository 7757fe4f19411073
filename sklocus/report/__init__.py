"""The model map: an interactive, offline HTML report of a pool of models.

:func:`write_map` writes one self-contained HTML file (plotly.js inside, no
network request when opened) with a 3-D map of the embeddings, each model's
accuracy by group, neighbours and near-duplicates, portfolios with their routing
accuracy, and how a model's embedding converges as evaluations are added.
:func:`map_data` computes what the page shows, and :func:`plot_families` and
:func:`plot_convergence` draw static figures of it with matplotlib. Writing the
page needs plotly, and the figures matplotlib (``pip install "sklocus[report]"``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sklocus.report._assemble import map_data, split_evaluations
from sklocus.report._figures import plot_convergence, plot_families

__all__ = ["map_data", "plot_convergence", "plot_families", "write_map"]


def write_map(
    path,
    source,
    model_names,
    evaluation_sets=None,
    *,
    query_groups=None,
    metadata=None,
    color=None,
    test_queries=None,
    title="Model map",
    **options,
):
    """Write the model map of a pool of models to one HTML file.

    Read more in the :ref:`User Guide <model_map>`.

    Parameters
    ----------
    path : str or path-like
        The HTML file to write.
    source : LocusEmbedder or array-like of shape (n_models, embedding_dim)
        A fitted embedder, which embeds ``evaluation_sets`` (without the
        ``test_queries``), or the embeddings themselves.
    model_names : sequence of str
        The models, in the order of ``evaluation_sets`` or of the embeddings.
    evaluation_sets : sequence of mappings, default=None
        Each model's ``{query: score}``; required with an embedder.
    query_groups, metadata, color, test_queries, title, **options
        As for :func:`map_data`.

    Returns
    -------
    pathlib.Path
        The file written.

    Examples
    --------
    >>> import numpy as np
    >>> from sklocus.report import write_map
    >>> Z = np.random.default_rng(0).normal(size=(6, 4))
    >>> write_map("map.html", Z, [f"m{i}" for i in range(6)])  # doctest: +SKIP
    PosixPath('map.html')
    """
    from sklocus.report._html import render_html

    embedder = None
    if hasattr(source, "transform") and hasattr(source, "predict_correctness"):
        if evaluation_sets is None:
            raise ValueError(
                "an embedder needs the evaluation_sets to embed; or give embeddings"
            )
        embedder = source
        train, _ = split_evaluations(evaluation_sets, test_queries or [])
        embeddings = embedder.transform(train)
    else:
        embeddings = np.asarray(source)
    data = map_data(
        embeddings,
        model_names,
        evaluation_sets=evaluation_sets,
        embedder=embedder,
        query_groups=query_groups,
        metadata=metadata,
        color=color,
        test_queries=test_queries,
        title=title,
        **options,
    )
    path = Path(path)
    path.write_text(render_html(data, title), encoding="utf-8")
    return path
