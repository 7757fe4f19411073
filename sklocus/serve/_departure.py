"""Stop a request's work when its client has gone.

uvicorn does not cancel a request when its client disconnects: the answer would
still be computed (a routing on the router thread, a call to a paid upstream)
and then dropped. :func:`while_connected` awaits the work beside the client's
connection and cancels the work when the client goes first; a routing still
queued for the router thread is then never computed (its future is
cancelled).

It reads the request's ASGI ``receive`` for ``http.disconnect``, so it is used
once the body has been read, and the answer has not started (a streamed answer
listens for the disconnect itself).
"""

from __future__ import annotations

import asyncio
import contextlib

from starlette.responses import Response

# The status logged for an answer no one was there to take (nginx's "client
# closed request"); it is never sent.
CLIENT_GONE = 499
# The key in a request's ASGI scope that says its 4xx is not the client's
# fault, and so is not charged to its rate (sklocus.serve._gate).
NOT_CHARGED = "sklocus.not_charged"


def not_charged(scope):
    """Mark a request's answer as not charged to its client's rate."""
    scope[NOT_CHARGED] = True


async def while_connected(request, work):
    """Return ``await work``, or a 499 answer if the client leaves first.

    Parameters
    ----------
    request : starlette.requests.Request
        Its body already read.
    work : awaitable

    Returns
    -------
    object
        What ``work`` returned, or a :class:`~starlette.responses.Response`
        of status 499 (never sent: the client has gone).
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_departed(request.receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    not_charged(request.scope)
    return Response(status_code=CLIENT_GONE)


async def _departed(receive):
    while (await receive())["type"] != "http.disconnect":
        pass
