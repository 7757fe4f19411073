"""The installed sklocus version, and the stamp that saved estimators carry."""

from __future__ import annotations

import warnings
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("sklocus")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0+unknown"


class SklocusVersionWarning(UserWarning):
    """A saved estimator was written by another version of sklocus.

    It loads, but its behaviour may differ from what it had when saved: refit it,
    or load it with the version named in the message.
    """


def warn_if_other_version(written, what):
    """Warn when ``written`` (the version that saved ``what``) is not this one."""
    if written != __version__:
        warnings.warn(
            f"{what} was saved by sklocus {written} and is loaded by sklocus "
            f"{__version__}; it may behave differently. Refit it, or load it with "
            f"sklocus {written}.",
            SklocusVersionWarning,
            stacklevel=3,
        )


class VersionStampMixin:
    """Stamp pickles (joblib included) with the sklocus version that wrote them.

    Loading a pickle from another version, or one without the stamp (which no
    release writes), warns with :class:`SklocusVersionWarning`, as scikit-learn
    does for its own version. A pickle that lacks one of the estimator's
    parameters is refused: nothing would say what it was fitted with.
    """

    def __getstate__(self):
        # A copy: object.__getstate__ gives the estimator's own __dict__, and a
        # stamp written there would show in (and vanish from) other copies.
        state = dict(super().__getstate__())
        state["_sklocus_version"] = __version__
        return state

    def __setstate__(self, state):
        what = f"This pickled {type(self).__name__}"
        written = state.pop("_sklocus_version", None)
        if written is None:
            warnings.warn(
                f"{what} carries no sklocus version stamp, so no sklocus release "
                f"wrote it; sklocus {__version__} may not load it as it was. "
                "Refit it.",
                SklocusVersionWarning,
                stacklevel=2,
            )
        else:
            warn_if_other_version(written, what)
        missing = [name for name in self._get_param_names() if name not in state]
        if missing:
            raise ValueError(
                f"{what} lacks parameters {missing}, so another sklocus than this "
                f"one ({__version__}) wrote it (its version stamp: {written}). "
                "Load it with the sklocus that wrote it, or refit it."
            )
        super().__setstate__(state)
