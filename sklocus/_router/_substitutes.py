"""A router's models nearest to one of them: its substitutes."""

from __future__ import annotations

import numpy as np
import pandas as pd
from sklearn.utils.validation import check_is_fitted

from sklocus._validation import check_count
from sklocus.geometry import model_distances


class SubstitutesMixin:
    """``substitutes``, for :class:`~sklocus.LocusRouter`."""

    def substitutes(self, name, k=5, *, metric="euclidean"):
        """List the models nearest to ``name`` in embedding space, its substitutes.

        Parameters
        ----------
        name : object
            One of ``classes_``.
        k : int, default=5
            How many.
        metric : {"euclidean", "cosine"}, default="euclidean"

        Returns
        -------
        pandas.Series
            Distances, indexed by model name, nearest first.
        """
        check_is_fitted(self, "embeddings_")
        matches = np.flatnonzero(self.classes_ == name)
        if len(matches) == 0:
            raise ValueError(f"the router has no model {name!r}")
        check_count(k, "k")
        index = matches[0]
        distances = model_distances(
            self.embeddings_[index : index + 1], self.embeddings_, metric=metric
        )[0]
        distances[index] = np.inf
        order = np.argsort(distances, kind="stable")[: min(k, len(distances) - 1)]
        return pd.Series(
            distances[order],
            index=pd.Index(self.classes_[order], name="model"),
            name=f"{metric} distance to {name}",
        )
