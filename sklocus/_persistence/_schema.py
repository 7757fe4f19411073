"""What a model file may hold: the classes, and the type of each fitted attribute."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sklearn.frozen import FrozenEstimator
from skorch import NeuralNet

from sklocus._embedder import LocusEmbedder
from sklocus._kept_evaluations import KeptEvaluations
from sklocus._kept_evaluations import inconsistency as kept_inconsistency
from sklocus._router import LocusRouter, check_cost
from sklocus._router._fitting import CALIBRATIONS
from sklocus._selection import (
    CoverageGreedySelector,
    KCenterSelector,
    KMedoidsSelector,
)
from sklocus._validation import check_model_names
from sklocus.calibration import ProbabilityCalibrator
from sklocus.encoders import PrecomputedEncoder, SentenceEncoder
from sklocus.nn.training import STOP_REASONS

NONE = type(None)
# The largest magnitudes a fit gives, with a wide margin: a router's embedding
# coordinates come out of a layer norm and one linear layer (a few units), and
# its offsets, biases and query heads are shrunk logits (sigmoid(100) is 1 to
# double precision). A file beyond them was not written by a fit: its
# probabilities would be 0 or 1 everywhere, and every query routed alike.
_LARGEST = {
    "embeddings_": 1e4,
    "model_offsets_": 100.0,
    "group_offsets_": 100.0,
    "head_weights_": 100.0,
    "head_biases_": 100.0,
}


@dataclass(frozen=True)
class Array:
    """A numpy array of one of ``kinds`` (dtype kind letters) and ``ndim`` axes."""

    kinds: str
    ndim: int

    def accepts(self, value):
        return (
            isinstance(value, np.ndarray)
            and value.dtype.kind in self.kinds
            and value.ndim == self.ndim
        )

    def __str__(self):
        return f"a {self.ndim}-D array of dtype kind {' or '.join(self.kinds)}"


FLOATS_2D = Array("f", 2)
INDICES = Array("iu", 1)
_SELECTED = {
    "selected_indices_": INDICES,
    "cluster_centers_": FLOATS_2D,
    "labels_": INDICES,
    "n_features_in_": int,
}
# Each class load rebuilds, with the type of each of its fitted attributes: a
# Python type, a tuple of them, or an Array. A file naming any other class, or
# holding another type, is refused.
FITTED = {
    LocusEmbedder: {
        "query_encoder_": (SentenceEncoder, PrecomputedEncoder),
        "query_dim_": int,
        "device_": str,
        "query_centroids_": FLOATS_2D,
        "query_radius_": float,
        "embedding_scale_": float,
        "validation_queries_": (list, NONE),
        "net_": NeuralNet,
    },
    LocusRouter: {
        "embedder_": (LocusEmbedder, FrozenEstimator),
        "embeddings_": FLOATS_2D,
        "classes_": Array("iuOU", 1),
        "cost_": (Array("f", 1), NONE),
        "groups_": (Array("iuOU", 1), NONE),
        "group_offsets_": (FLOATS_2D, NONE),
        "calibration_slope_": (float, NONE),
        "calibration_intercept_": (float, NONE),
        "model_offsets_": (Array("f", 1), NONE),
        "budget_curve_": (FLOATS_2D, NONE),
        "budget_cost_weight_": (float, NONE),
        "head_weights_": (FLOATS_2D, NONE),
        "head_biases_": (Array("f", 1), NONE),
        "head_blends_": (Array("f", 1), NONE),
        "head_blend_": (float, NONE),
        "probability_calibrator_": (ProbabilityCalibrator, NONE),
        "evaluation_queries_": Array("iuOU", 1),
        "evaluation_codes_": INDICES,
        "evaluation_sums_": Array("f", 1),
        "evaluation_counts_": INDICES,
        "evaluation_offsets_": INDICES,
        "evaluation_groups_": (INDICES, NONE),
    },
    ProbabilityCalibrator: {
        "n_pairs_": int,
        "x_thresholds_": (Array("f", 1), NONE),
        "y_thresholds_": (Array("f", 1), NONE),
        "slope_": (float, NONE),
        "intercept_": (float, NONE),
    },
    KCenterSelector: {**_SELECTED, "radius_": float},
    KMedoidsSelector: {**_SELECTED, "inertia_": float, "n_iter_": int},
    CoverageGreedySelector: {**_SELECTED, "coverage_": float, "total_cost_": float},
    SentenceEncoder: {},
    PrecomputedEncoder: {},
    # A router routes with a trained embedder as it is when it holds it frozen;
    # FrozenEstimator keeps no state of its own.
    FrozenEstimator: {},
}
# Fitted attributes that only some fits set (scikit-learn's, from a DataFrame).
OPTIONAL = {"feature_names_in_": Array("OU", 1)}
# Fitted attributes added since format 6: written whenever set, and optional on
# reading, so that the files of earlier versions still load (without them).
LATER = {
    LocusEmbedder: {"stop_reason_": str, "encoding_time_": float},
    # Since format 8: a format-7 router reads with them None.
    LocusRouter: {
        "group_source_": (str, NONE),
        "group_weights_": (FLOATS_2D, NONE),
        "group_biases_": (Array("f", 1), NONE),
        "held_out_losses_": (dict, NONE),
    },
}
CLASSES = {cls.__name__: cls for cls in FITTED}
# Parameters and attributes that hold an estimator, and the classes it may be.
NESTED = {
    "embedder": (LocusEmbedder, FrozenEstimator, NONE),
    "embedder_": (LocusEmbedder, FrozenEstimator),
    "estimator": (LocusEmbedder,),  # FrozenEstimator's
    "query_encoder": (SentenceEncoder, PrecomputedEncoder, str),
    "query_encoder_": (SentenceEncoder, PrecomputedEncoder),
    "probability_calibrator_": (ProbabilityCalibrator, NONE),
}


def accepts(kind, value):
    """Whether ``value`` is of ``kind`` (a type, an Array or a tuple of them)."""
    if isinstance(kind, tuple):
        return any(accepts(k, value) for k in kind)
    if isinstance(kind, Array):
        return kind.accepts(value)
    if kind is int and isinstance(value, bool):
        return False
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return False
    return isinstance(value, kind)


def describe(kind):
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(
        "None" if k is NONE else k.__name__ if isinstance(k, type) else str(k)
        for k in kinds
    )


def inconsistency(estimator):
    """Say what in a rebuilt fitted estimator does not fit together (or None)."""
    if isinstance(estimator, LocusEmbedder):
        width = estimator.net_.get_params()["module__query_dim"]
        if width != estimator.query_dim_:
            return f"its network reads {width}-d queries, not query_dim_"
        if estimator.query_centroids_.shape[1] != estimator.query_dim_:
            return "query_centroids_ do not have query_dim_ columns"
        if not 0 < estimator.embedding_scale_ < np.inf:
            return f"embedding_scale_ is {estimator.embedding_scale_}; a fit gives > 0"
        if not 0 <= estimator.query_radius_ < np.inf:
            return f"query_radius_ is {estimator.query_radius_}; a fit gives >= 0"
        reason = getattr(estimator, "stop_reason_", STOP_REASONS[0])
        if reason not in STOP_REASONS:
            return f"stop_reason_ is {reason!r}, not one of {list(STOP_REASONS)}"
        if not 0 <= getattr(estimator, "encoding_time_", 0.0) < np.inf:
            return f"encoding_time_ is {estimator.encoding_time_}; a fit gives >= 0"
    elif isinstance(estimator, LocusRouter):
        if not hasattr(estimator.embedder_, "net_"):
            return "its embedder_ is not fitted"
        if not len(estimator.classes_):
            return "it routes to no model (classes_ is empty)"
        try:
            check_model_names(estimator.classes_, "classes_")
            check_cost(estimator.cost_, estimator.classes_.tolist())
        except (TypeError, ValueError) as error:
            return str(error)
        rows = len(estimator.classes_)
        kept = KeptEvaluations(
            *(
                getattr(estimator, f"evaluation_{name}_")
                for name in KeptEvaluations._fields
            )
        )
        problem = kept_inconsistency(kept, rows)
        if problem is not None:
            return problem
        groups = estimator.evaluation_groups_
        if (groups is None) != (estimator.groups_ is None):
            return "evaluation_groups_ and groups_ are not given together"
        if groups is not None and (
            groups.shape != kept.queries.shape
            or (
                len(groups)
                and not -1 <= groups.min() <= groups.max() < len(estimator.groups_)
            )
        ):
            return "evaluation_groups_ do not give each query one of groups_ or -1"
        width = estimator.embedder_.net_.get_params()["module__embedding_dim"]
        if estimator.embeddings_.shape != (rows, width):
            return f"embeddings_ are not ({rows} models, {width})"
        if estimator.cost_ is not None and len(estimator.cost_) != rows:
            return "cost_ does not give one cost per model"
        if (estimator.groups_ is None) != (estimator.group_offsets_ is None):
            return "groups_ and group_offsets_ are not given together"
        if estimator.groups_ is not None and estimator.group_offsets_.shape != (
            rows,
            len(estimator.groups_),
        ):
            return f"group_offsets_ are not ({rows} models, {len(estimator.groups_)})"
        problem = _learnt_groups_inconsistency(estimator)
        if problem is None:
            problem = _implausible_scale(estimator)
        if problem is not None:
            return problem
        calibration = (
            estimator.calibration_slope_,
            estimator.calibration_intercept_,
            estimator.model_offsets_,
        )
        if len({value is None for value in calibration}) > 1:
            return (
                "calibration_slope_, calibration_intercept_ and model_offsets_ are "
                "not given together"
            )
        if estimator.model_offsets_ is not None:
            if estimator.model_offsets_.shape != (rows,):
                return f"model_offsets_ do not give one offset per model ({rows})"
            for name in ("calibration_slope_", "calibration_intercept_"):
                if not np.isfinite(getattr(estimator, name)):
                    return f"{name} is {getattr(estimator, name)}; a fit gives a number"
        if (estimator.budget_curve_ is None) != (estimator.budget_cost_weight_ is None):
            return "budget_curve_ and budget_cost_weight_ are not given together"
        if estimator.budget_curve_ is not None:
            curve = estimator.budget_curve_
            if curve.shape[0] != 3 or not np.isfinite(curve).all():
                return "budget_curve_ is not 3 rows of finite numbers"
            if not 0 <= estimator.budget_cost_weight_ < np.inf:
                return f"budget_cost_weight_ is {estimator.budget_cost_weight_}"
        _, method = CALIBRATIONS[estimator.calibration]
        if (method is None) != (estimator.probability_calibrator_ is None):
            return "calibration and probability_calibrator_ do not agree"
        if (
            estimator.probability_calibrator_ is not None
            and estimator.probability_calibrator_.method != method
        ):
            return "probability_calibrator_ is not of calibration's method"
        heads = (
            estimator.head_weights_,
            estimator.head_biases_,
            estimator.head_blends_,
            estimator.head_blend_,
        )
        if len({value is None for value in heads}) > 1:
            return (
                "head_weights_, head_biases_, head_blends_ and head_blend_ are "
                "not given together"
            )
        if heads[0] is not None:
            query_dim = getattr(estimator.embedder_, "estimator", estimator.embedder_)
            query_dim = query_dim.query_dim_
            if heads[0].shape != (rows, query_dim):
                return f"head_weights_ are not ({rows} models, {query_dim})"
            if heads[1].shape != (rows,) or heads[2].shape != (rows,):
                return f"head_biases_ or head_blends_ are not one per model ({rows})"
            if not all(np.isfinite(values).all() for values in heads):
                return "the query heads hold a number that is not finite"
            if not 0 <= heads[3] <= 1:
                return f"head_blend_ is {heads[3]}, not in [0, 1]"
            if not np.isin(heads[2], (0, np.float32(heads[3]))).all():
                return "head_blends_ are not all head_blend_ or 0"
    elif isinstance(estimator, ProbabilityCalibrator):
        isotonic = estimator.method == "isotonic"
        steps = (estimator.x_thresholds_, estimator.y_thresholds_)
        line = (estimator.slope_, estimator.intercept_)
        if isotonic and (
            any(value is None for value in steps)
            or steps[0].shape != steps[1].shape
            or not len(steps[0])
            or (np.diff(steps[0]) < 0).any()
            or (np.diff(steps[1]) < 0).any()
            or steps[1].min() < 0
            or steps[1].max() > 1
        ):
            return "its isotonic steps are not non-decreasing probabilities"
        if not isotonic and any(v is None or not np.isfinite(v) for v in line):
            return "its sigmoid has no finite slope_ and intercept_"
    elif isinstance(
        estimator, KCenterSelector | KMedoidsSelector | CoverageGreedySelector
    ):
        chosen, labels = estimator.selected_indices_, estimator.labels_
        for name in ("radius_", "inertia_", "coverage_", "total_cost_"):
            if np.isnan(getattr(estimator, name, 0.0)):
                return f"{name} is NaN"
        if estimator.cluster_centers_.shape != (len(chosen), estimator.n_features_in_):
            return "cluster_centers_ do not match selected_indices_"
        if len(chosen) and (chosen.min() < 0 or chosen.max() >= len(labels)):
            return "selected_indices_ point outside the models"
        if len(labels) and (labels.min() < 0 or labels.max() >= len(chosen)):
            return "labels_ point outside the selection"
    return None


def _learnt_groups_inconsistency(router):
    """Return what does not fit together in a router's learnt groups, or None."""
    learnt = (router.group_source_, router.group_weights_, router.group_biases_)
    if len({value is None for value in learnt}) > 1:
        return "group_source_, group_weights_ and group_biases_ are not given together"
    losses = router.held_out_losses_
    if losses is not None and not all(
        isinstance(key, str) and type(value) is float and np.isfinite(value)
        for key, value in losses.items()
    ):
        return "held_out_losses_ do not map names to finite losses"
    source, weights, biases = learnt
    if source is None:
        return None
    if source not in ("labels", "clusters"):
        return f"group_source_ is {source!r}, not 'labels' or 'clusters'"
    if router.groups_ is None:
        return "group_weights_ are given without groups_"
    inner = getattr(router.embedder_, "estimator", router.embedder_)
    shape = (len(router.groups_), inner.query_dim_)
    if weights.shape != shape or biases.shape != shape[:1]:
        return f"group_weights_ are not {shape} or group_biases_ not one per group"
    return None


def _implausible_scale(router):
    """Name the first of a router's arrays that no fit could give, or None."""
    for name, largest in _LARGEST.items():
        values = getattr(router, name, None)
        if values is None or not np.size(values):
            continue
        magnitude = float(np.max(np.abs(values)))
        if magnitude > largest:
            return (
                f"{name} hold a value of magnitude {magnitude:.3g}; a fit gives "
                f"at most {largest:g}"
            )
    return None
