"""What a router reads of an OpenAI chat request: its last user message's text."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError

# The router reads the start of a long message: the sentence encoder would
# truncate it further still, and a message of megabytes would hold the router
# thread for seconds while it is tokenised.
ROUTED_CHARS = 20_000
# What routes by the text instead of naming a model.
ROUTED = "auto"
# What a request's field must be, by field.
_EXPECTED = {
    "model": f"model must be {ROUTED!r} (to route) or a served model's name",
    "messages": "messages must be a non-empty list of messages",
    "stream": "stream must be true or false",
}


class ChatRequestError(ValueError):
    """A chat request refused: the field at fault (OpenAI's ``param``), and why."""

    def __init__(self, param, message):
        super().__init__(message)
        self.param = param
        self.message = message


class ChatMessage(BaseModel):
    """One message of an OpenAI chat request."""

    model_config = ConfigDict(extra="allow")
    role: str = Field(strict=True)
    content: str | list[dict] | None = None


class ChatCompletionRequest(BaseModel):
    """OpenAI's chat request; every field besides these is forwarded as sent.

    The proxy checks each request by it (:func:`check_chat_request`), and the
    OpenAPI schema documents it.
    """

    model_config = ConfigDict(extra="allow")
    model: str = Field(
        min_length=1,
        strict=True,
        description="'auto' to route by the text of the last user message, or a "
        "served model with an upstream (GET /v1/models) to pin the request to it",
    )
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool | None = Field(
        default=None, strict=True, description="relay the upstream's server-sent events"
    )


def check_chat_request(request):
    """Check a parsed chat request by :class:`ChatCompletionRequest`.

    Returns ``(text, stream)``: the last user message's text
    (:func:`last_user_text`) and whether to stream; raises
    :class:`ChatRequestError` naming the first field at fault.
    """
    try:
        ChatCompletionRequest.model_validate(request)
    except ValidationError as error:
        where = error.errors()[0]["loc"]
        field = str(where[0]) if where else None
        message = _EXPECTED.get(field, error.errors()[0]["msg"])
        if field == "messages" and len(where) > 1:
            message = (
                f"messages[{where[1]}] is not a chat message: each is "
                '{"role": a string, "content": text, parts or null}'
            )
        raise ChatRequestError(field, message) from None
    text = last_user_text(request["messages"])
    if text is None:
        raise ChatRequestError(
            "messages", "the last user message has no text for the router to read"
        )
    return text, bool(request.get("stream"))


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
