"""What a request to the service may be refused with, and what it reads."""

from __future__ import annotations


class RequestError(ValueError):
    """A request the service cannot answer, with the field it blames.

    Parameters
    ----------
    field : tuple
        Where in the request body the fault lies, e.g. ``("exclude", 2)``; empty
        for the request as a whole.
    message : str
        What is wrong and what was expected.
    status : int, default=422
        The HTTP status that answers it.
    """

    def __init__(self, field, message, status=422):
        super().__init__(message)
        self.field = tuple(field)
        self.message = message
        self.status = status


def query_encoder(router):
    """Return the query encoder of a router's embedder (frozen or not)."""
    embedder = router.embedder_
    return getattr(embedder, "estimator", embedder).query_encoder_


def check_item_count(field, items, limit):
    """Refuse an empty list (or mapping) of ``field``, or one over ``limit``.

    Parameters
    ----------
    field : str
        The field holding the items, named in the message.
    items : sized
    limit : int

    Raises
    ------
    RequestError
    """
    if len(items) == 0:
        raise RequestError((field,), f"{field} is empty; give at least one")
    if len(items) > limit:
        raise RequestError(
            (field,), f"{len(items):,} {field} in one request; at most {limit:,}"
        )
