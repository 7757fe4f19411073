"""LocusRouter and the stages it composes.

A router scores every query against every model by LOCUS (:mod:`._locus`), then
by the stages it has fitted on the pool's own evaluations, in this order: the
pool calibration (:mod:`._pool_calibration`), the query heads (:mod:`._heads`),
the probability map (:mod:`._probability_map`) and the query groups' offsets
(:mod:`._query_groups`, told from the text by :mod:`._learnt_groups` when not
given); exploration moves LOCUS's logits first (:mod:`._exploration`), and the
policy (:mod:`._policy`) turns probabilities into routes.

Each stage is one small frozen object (:mod:`._stage`) holding what ``fit``
learnt for the pool and one row per model; the router keeps them together as
``stages_`` (:mod:`._stages`, which composes them), fitted in order by
:mod:`._fitting`, and its public fitted attributes read from them. Routing is in
:mod:`._routes`; changing the pool gives new stages (:mod:`._editing`,
:mod:`._learning`).
"""

from sklocus._router._core import LocusRouter
from sklocus._router._tables import check_cost

__all__ = ["LocusRouter", "check_cost"]
