"""The group offsets stage: each model's shrunken correction per query group.

With ``query_groups`` at ``fit`` (a benchmark, subject or category per query), a
router fits each model an offset per group on the logit scale, on its own
evaluations against what the stages before predict (the model is in
:mod:`sklocus._groups`), and adds it for queries whose groups are given.
"""

from __future__ import annotations

import numpy as np

from sklocus._groups import apply_group_offsets, fit_group_offsets
from sklocus._router._tables import groups_of


class GroupOffsets:
    """The router's groups (``groups_``) and each model's offsets for them.

    Parameters
    ----------
    groups : ndarray of shape (n_groups,)
        The router's ``groups_``.
    shrinkage : float
        The router's ``group_shrinkage``.
    """

    def __init__(self, groups, shrinkage):
        self.groups = groups
        self.shrinkage = shrinkage

    @classmethod
    def of(cls, router):
        """Return the stage a fitted router holds, or None."""
        if getattr(router, "group_offsets_", None) is None:
            return None
        return cls(router.groups_, router.group_shrinkage)

    @classmethod
    def fit(cls, scorer, rows, queries, scores, query_groups, shrinkage):
        """Fit the groups and every model's offsets; return the stage and offsets."""
        base = scorer.logits(rows, queries)
        groups, offsets = fit_group_offsets(base, scores, query_groups, shrinkage)
        return cls(groups, shrinkage), offsets

    def fit_models(self, scorer, rows, queries, scores, query_groups):
        """Offsets of models for the router's groups (a query-to-group map).

        ``scores`` is ``(n_queries, n_models)``, NaN where unobserved.
        """
        groups = groups_of(query_groups, queries, "add_models")
        # Only the router's groups get offsets; others have nothing to apply to.
        known = set(self.groups.tolist())
        groups = np.array([g if g in known else None for g in groups], dtype=object)
        fitted, offsets = self.fit(
            scorer, rows, queries, scores, groups, self.shrinkage
        )
        column = {label: j for j, label in enumerate(self.groups)}
        out = np.zeros((scores.shape[1], len(self.groups)), dtype=np.float32)
        for j, label in enumerate(fitted.groups):
            out[:, column[label]] = offsets[:, j]
        return out

    def transform(self, probabilities, query_groups, offsets):
        """Add the offsets of each query's group; unknown groups get none."""
        return apply_group_offsets(probabilities, query_groups, self.groups, offsets)
