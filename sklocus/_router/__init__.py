"""LocusRouter and the stages it composes.

A router scores every query against every model by LOCUS (:mod:`._locus`), then
by the stages it has fitted on the pool's own evaluations, in this order: the
pool calibration (:mod:`._pool_calibration`), the query heads (:mod:`._heads`),
the probability map (:mod:`._probability_map`) and, for queries whose groups
are given, the group offsets (:mod:`._group_offsets`); exploration moves
LOCUS's logits first (:mod:`._exploration`). :mod:`._scoring` composes them and
:mod:`._policy` turns probabilities into routes. Each stage is fitted on what
the stages before it predict, keeps its pool-wide values and one row per model
as fitted attributes of the router (what model files hold), and is rebuilt from
them (``of(router)``; LOCUS and exploration read the router's own).
:mod:`._editing` changes the pool of a fitted router, one model's rows at a
time (:mod:`._rows`).
"""

from sklocus._router._core import LocusRouter
from sklocus._router._tables import check_cost

__all__ = ["LocusRouter", "check_cost"]
