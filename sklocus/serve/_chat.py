"""What a router reads of an OpenAI chat request: its last user message's text."""

from __future__ import annotations

from collections.abc import Mapping

# The router reads the start of a long message: the sentence encoder would
# truncate it further still, and a message of megabytes would hold the router
# thread for seconds while it is tokenised.
ROUTED_CHARS = 20_000


def last_user_text(messages):
    """Return the text of the last user message, or None when there is none.

    At most its first :data:`ROUTED_CHARS` characters: what the router reads.

    Parameters
    ----------
    messages : list of dict
        OpenAI chat messages; a message's ``content`` is a string or a list of
        parts, whose ``{"type": "text", "text": ...}`` parts are joined by
        newlines.

    Returns
    -------
    str or None
    """
    users = [
        message
        for message in messages or []
        if isinstance(message, Mapping) and message.get("role") == "user"
    ]
    if not users:
        return None
    content = users[-1].get("content")
    if isinstance(content, list):
        content = "\n".join(
            part["text"]
            for part in content
            if isinstance(part, Mapping)
            and part.get("type") == "text"
            and isinstance(part.get("text"), str)
        )
    if not isinstance(content, str) or not content.strip():
        return None
    return content[:ROUTED_CHARS]
