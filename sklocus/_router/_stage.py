"""What every stage of a router is: a frozen fitted object, one row per model.

A router's stages each hold what ``fit`` learnt for the whole pool and, for
some, one row per model in the order of the router's ``classes_``. A stage is
never changed: adding, re-embedding and removing models gives a new one
(:meth:`Stage.with_rows`, :meth:`Stage.without_rows`), so the router's copies
(a served router's snapshots) that share a stage can never see it half changed.
Only a stage's own module builds it (``fit``, ``from_arrays``).

``ATTRIBUTES`` maps the router's public fitted attributes (what its model files
hold) to a stage's fields; :class:`StageAttribute` gives the router each of
them, read-only.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np
import torch


def placed(old, new, indices):
    """Return ``old`` with ``new`` at ``indices`` (past the end: appended), anew."""
    n = max(len(old), int(indices.max()) + 1)
    if isinstance(old, torch.Tensor):
        out = old.new_empty((n, *old.shape[1:]))
    else:
        out = np.empty((n, *old.shape[1:]), dtype=old.dtype)
    out[: len(old)] = old
    out[indices] = new
    return out


@dataclasses.dataclass(frozen=True, eq=False)
class Stage:
    """A fitted stage: pool-wide fields, and per-model ``ROWS`` (None: none).

    A stage whose rows are None is fitted for the pool but applies to no
    model: what the stages are while ``fit`` builds them, and for models
    embedded from parts of their evaluations.
    """

    # The router's public fitted attributes, each the name of a field.
    ATTRIBUTES: ClassVar[dict[str, str]] = {}
    # Fields with one row per model, along their first axis.
    ROWS: ClassVar[tuple[str, ...]] = ()
    # Whether a router may lack the stage (read as None when its attributes are).
    OPTIONAL: ClassVar[bool] = True

    def with_rows(self, indices, rows):
        """Return the stage with ``rows`` (field to new rows) at ``indices``.

        Indices past the end append.
        """
        return dataclasses.replace(
            self,
            **{
                name: placed(getattr(self, name), rows[name], indices)
                for name in self.ROWS
                if getattr(self, name) is not None
            },
        )

    def without_rows(self, kept):
        """Return the stage with the rows of the models ``kept`` (a mask) only."""
        return dataclasses.replace(
            self,
            **{
                name: getattr(self, name)[kept]
                for name in self.ROWS
                if getattr(self, name) is not None
            },
        )

    def rows_of(self, indices):
        """Return the rows (field to rows) of the models at ``indices``."""
        return {
            name: None if getattr(self, name) is None else getattr(self, name)[indices]
            for name in self.ROWS
        }

    def to_arrays(self):
        """Return the router's fitted attributes this stage holds, by name."""
        return {public: getattr(self, name) for public, name in self.ATTRIBUTES.items()}

    @classmethod
    def from_arrays(cls, values, **settings):
        """Build the stage from the router's fitted attributes (a mapping).

        Returns None where the router has no such stage (its attributes None)
        and the stage is ``OPTIONAL``.
        """
        fields = {name: values.get(public) for public, name in cls.ATTRIBUTES.items()}
        if cls.OPTIONAL and all(value is None for value in fields.values()):
            return None
        return cls(**fields, **settings)


class StageAttribute:
    """A router's public fitted attribute, read from one of its stages.

    None where the router has not fitted that stage; an ``AttributeError``
    before ``fit`` (so that ``check_is_fitted`` and ``hasattr`` see it
    unfitted). Read-only: the stages change only as wholes.
    """

    def __init__(self, name, stage, field):
        self.name = name
        self.stage = stage
        self.field = field

    def __get__(self, router, owner=None):
        if router is None:
            return self
        stages = router.__dict__.get("stages_")
        if stages is None:
            raise AttributeError(
                f"{type(router).__name__} has no attribute {self.name!r} before fit"
            )
        stage = getattr(stages, self.stage)
        return None if stage is None else getattr(stage, self.field)

    def __set__(self, router, value):
        raise AttributeError(
            f"{self.name} is read-only: it belongs to the router's "
            f"{self.stage} stage, which fit, add_models, partial_fit and "
            "remove_models change whole"
        )
