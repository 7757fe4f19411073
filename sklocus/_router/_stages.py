"""A router's stages composed: from LOCUS's probabilities to those it routes by.

The stages apply in one order, each to the probabilities the one before gave,
on the logit scale: LOCUS (refined embeddings, :mod:`._locus`); the pool
calibration (:mod:`._pool_calibration`); the query heads (:mod:`._heads`); the
probability map (:mod:`._probability_map`); and the query groups' offsets
(:mod:`._query_groups`), of the groups given with the queries or else of those
told from their encodings. Exploration moves LOCUS's logits before the rest
(:mod:`._exploration`); the policy (:mod:`._policy`) turns probabilities into
routes. A stage a router has not fitted is None.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from sklocus._groups import logits
from sklocus._router._exploration import Exploration
from sklocus._router._heads import QueryHeads
from sklocus._router._locus import Locus, chunks
from sklocus._router._policy import Policy
from sklocus._router._pool_calibration import PoolCalibration
from sklocus._router._probability_map import ProbabilityMap
from sklocus._router._query_groups import QueryGroups
from sklocus._router._stage import StageAttribute
from sklocus.encoders import as_query_list

# Each stage's field in Stages, and its class.
STAGES = {
    "locus": Locus,
    "calibration": PoolCalibration,
    "heads": QueryHeads,
    "probability_map": ProbabilityMap,
    "groups": QueryGroups,
    "policy": Policy,
}


class StageAttributesMixin:
    """The router's public fitted attributes, each read from the stage holding it.

    One read-only attribute per entry of each stage's ``ATTRIBUTES``
    (``embeddings_`` is ``stages_.locus.embeddings``, and so on), so that the
    stages are the one place the fitted state lives.
    """

    def _fitted_state(self):
        """Return the router's attributes with its stages' fitted ones, by name.

        What a model file holds (the writer's view of ``vars``).
        """
        state = dict(vars(self))
        stages = state.pop("stages_", None)
        return state if stages is None else {**state, **stages.to_arrays()}


for _name, _stage in STAGES.items():
    for _public, _field in _stage.ATTRIBUTES.items():
        setattr(StageAttributesMixin, _public, StageAttribute(_public, _name, _field))


@dataclasses.dataclass(frozen=True, eq=False)
class Stages:
    """A fitted router's stages, each None where the router has not fitted it.

    The router's ``stages_``. Like each stage it is never changed: editing the
    pool gives a new one (:meth:`with_rows`, :meth:`without_rows`).
    """

    locus: Locus
    exploration: Exploration | None = None
    calibration: PoolCalibration | None = None
    heads: QueryHeads | None = None
    probability_map: ProbabilityMap | None = None
    groups: QueryGroups | None = None
    policy: Policy | None = None

    # -- building and changing -------------------------------------------------

    @classmethod
    def from_arrays(cls, values, random_state):
        """Build the stages of a router's fitted attributes (a mapping, by name).

        What a model file or an older pickle holds; ``random_state`` seeds
        the exploration's draws afresh.
        """
        return cls(
            exploration=Exploration.start(random_state),
            **{name: stage.from_arrays(values) for name, stage in STAGES.items()},
        )

    def to_arrays(self):
        """Every stage's fitted attributes, by the router's public names."""
        found = {}
        for name, stage in STAGES.items():
            held = getattr(self, name)
            found.update(
                dict.fromkeys(stage.ATTRIBUTES) if held is None else held.to_arrays()
            )
        return found

    def adding(self, **stages):
        """Return these stages with ``stages`` (name to stage) added or replaced."""
        return dataclasses.replace(self, **stages)

    def configured(self, router):
        """Return the stages with the router's settings of the time of use.

        ``refine_steps`` and ``group_shrinkage`` are read when used, as a
        ``set_params`` after ``fit`` sets them.
        """
        stages = {
            "locus": dataclasses.replace(self.locus, refine_steps=router.refine_steps)
        }
        if self.groups is not None:
            stages["groups"] = dataclasses.replace(
                self.groups, shrinkage=router.group_shrinkage
            )
        return dataclasses.replace(self, **stages)

    def _each(self):
        """Yield ``(name, stage)`` for each stage fitted."""
        for field in dataclasses.fields(self):
            stage = getattr(self, field.name)
            if stage is not None:
                yield field.name, stage

    def with_rows(self, indices, rows):
        """Return the stages with ``rows`` (stage name to its rows) at ``indices``.

        Indices past the end append.
        """
        return dataclasses.replace(
            self,
            **{
                name: stage.with_rows(indices, rows.get(name, {}))
                for name, stage in self._each()
            },
        )

    def without_rows(self, kept):
        """Return the stages with the rows of the models ``kept`` (a mask) only."""
        return dataclasses.replace(
            self, **{name: stage.without_rows(kept) for name, stage in self._each()}
        )

    def for_models(self, embeddings, model_offsets=None, heads=None, offsets=None):
        """Return the same pool-wide fit for other models: those of these rows.

        ``heads`` maps the query heads' fields to rows; ``offsets`` are the
        groups'. A stage given no rows applies to none of them.
        """
        stages = {"locus": dataclasses.replace(self.locus, embeddings=embeddings)}
        if self.calibration is not None:
            stages["calibration"] = dataclasses.replace(
                self.calibration, offsets=model_offsets
            )
        if self.heads is not None:
            heads = heads or dict.fromkeys(QueryHeads.ROWS)
            stages["heads"] = dataclasses.replace(self.heads, **heads)
        if self.groups is not None:
            stages["groups"] = dataclasses.replace(self.groups, offsets=offsets)
        return dataclasses.replace(self, **stages)

    # -- predicting ------------------------------------------------------------

    def probabilities(self, queries, vectors=None, explore=None):
        """P(correct) ``(n_queries, n_models)`` of the models, before groups.

        One chunk of queries (``vectors``: their encodings, when at hand).
        ``explore``, for the pool's own stages, is ``(pool_sets, mode,
        strength)`` (see :meth:`Exploration.move`); then returns
        ``(probabilities, explored)``: the second as routed by the
        exploration, LOCUS's logits moved before the other stages apply.
        """
        locus = self.locus
        n_models = len(locus.embeddings)
        if self._heads_apply() or explore is not None:
            if not len(queries):
                empty = np.empty((0, n_models), dtype=np.float32)
                return (empty, empty) if explore is not None else empty
            if vectors is None:
                vectors = locus.encode(as_query_list(queries))
            probabilities = locus.predict(locus.embeddings, vectors)
        else:
            probabilities = locus.probabilities(locus.embeddings, queries)
        if explore is not None:
            explored = self.exploration.move(probabilities, vectors, locus, *explore)
            return self._adjusted(probabilities, vectors), self._adjusted(
                explored, vectors
            )
        return self._adjusted(probabilities, vectors)

    def _heads_apply(self):
        return self.heads is not None and self.heads.weights is not None

    def _adjusted(self, probabilities, vectors):
        for stage in (self.calibration, self.heads, self.probability_map):
            if stage is not None:
                probabilities = stage.transform(probabilities, vectors)
        return probabilities

    def logits(self, queries):
        """Return :meth:`probabilities`' logits on every chunk of ``queries``."""
        found = np.empty((len(queries), len(self.locus.embeddings)))
        for chunk in chunks(len(queries)):
            part = queries[chunk]
            found[chunk.start : chunk.start + len(part)] = logits(
                self.probabilities(part)
            )
        return found

    def locus_logits(self, vectors):
        """LOCUS's logits on encoded queries, calibrated: what heads are fitted on."""
        locus, calibration = self.locus, self.calibration
        found = np.empty((len(vectors), len(locus.embeddings)))
        for chunk in chunks(len(vectors)):
            probabilities = locus.predict(locus.embeddings, vectors[chunk])
            if calibration is not None and calibration.offsets is not None:
                probabilities = calibration.transform(probabilities)
            found[chunk] = logits(probabilities)
        return found

    def chunks(self, queries, query_groups=None, explore=None):
        """Yield ``(start, probabilities, routed)`` for chunks of the queries.

        Every stage applies, the group offsets for the groups ``query_groups``
        (checked) give, or else for those the learnt groups tell.
        ``routed`` are the probabilities to route by: ``probabilities``
        themselves unless ``explore`` (see :meth:`probabilities`).
        """
        groups = self.groups
        if groups is not None and groups.offsets is None:
            groups = None
        learnt = None if groups is None or query_groups is not None else groups.learnt
        for chunk in chunks(len(queries)):
            part = queries[chunk]
            vectors = None
            if learnt is not None and len(part):
                vectors = self.locus.encode(as_query_list(part))
            found = self.probabilities(part, vectors, explore)
            found = found if explore is not None else (found,)
            if groups is not None and query_groups is not None:
                labels = query_groups[chunk.start : chunk.start + len(part)]
                found = [groups.transform(p, labels) for p in found]
            elif vectors is not None:
                memberships = learnt.memberships(vectors)
                found = [groups.shift(p, memberships) for p in found]
            yield chunk.start, found[0], found[-1]
