"""Where each model of a served router answers: the upstreams of the chat proxy.

``sklocus serve --upstreams FILE`` forwards OpenAI chat completions to the model
the router picks. The file is TOML, one table per model, keyed by the router's
name for it::

    [models."llama-3.1-8b"]
    base_url = "http://gpu-1:8000/v1"      # an OpenAI-compatible API
    model = "meta-llama/Llama-3.1-8B"      # its name there (default: the key)
    api_key_env = "GPU1_KEY"               # the variable holding its key

A key is never written in the file: ``api_key_env`` names the environment
variable it is read from, once, when the upstreams are built. The key then
lives in :class:`Upstream` only, whose ``repr`` leaves it out, and goes
nowhere but the ``Authorization`` header of requests to its own upstream.
"""

from __future__ import annotations

import math
import numbers
import os
import sys
import urllib.parse
from collections.abc import Mapping
from pathlib import Path

from sklocus._validation import has_control_character
from sklocus.serve._scrub import KeyScrubber

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the serve extra installs tomli on 3.10
    import tomli as tomllib

_FIELDS = ("base_url", "model", "api_key_env")
DEFAULT_MAX_ANSWER_BYTES = 16 * 2**20


class Upstream:
    """An OpenAI-compatible API that answers for one model of the router.

    Parameters
    ----------
    base_url : str
        The API's base URL, such as ``"https://api.openai.com/v1"``: a chat
        completion is posted to ``{base_url}/chat/completions``. It may not
        hold credentials, a query or a fragment.
    model : str
        The model's name at that API.
    api_key_env : str, default=None
        The environment variable the key was read from; None for an API that
        takes no key.
    api_key : str, default=None
        The key, sent as ``Authorization: Bearer KEY`` to this API alone. It is
        kept out of the ``repr``, comparisons and pickles.
    """

    __slots__ = ("base_url", "model", "api_key_env", "_api_key", "_scrubber")

    def __init__(self, base_url, model, api_key_env=None, *, api_key=None):
        self.base_url = base_url
        self.model = model
        self.api_key_env = api_key_env
        self._api_key = api_key
        self._scrubber = KeyScrubber(api_key) if api_key else None

    def __repr__(self):
        return (
            f"Upstream(base_url={self.base_url!r}, model={self.model!r}, "
            f"api_key_env={self.api_key_env!r})"
        )

    @property
    def completions_url(self):
        """The URL chat completions are posted to."""
        return self.base_url.rstrip("/") + "/chat/completions"

    def headers(self):
        """Return the headers of a request to this upstream, with its key if any."""
        headers = {"content-type": "application/json", "accept-encoding": "identity"}
        if self._api_key is not None:
            headers["authorization"] = f"Bearer {self._api_key}"
        return headers

    def scrubbed(self, text):
        """Return ``text`` (from the upstream) with fragments of its key cut out.

        Every run of 8 or more of the key's characters, in any case
        (:mod:`sklocus.serve._scrub`), is replaced by ``[key]``.
        """
        return text if self._scrubber is None else self._scrubber.text(text)

    def scrubbed_bytes(self, data):
        """Return ``data`` (an answer's body) with fragments of the key cut out."""
        return data if self._scrubber is None else self._scrubber.bytes(data)

    def stream_scrubber(self):
        """Return a scrubber of a body read in parts (``feed``, then ``end``), or None.

        None for an upstream without a key.
        """
        return None if self._scrubber is None else self._scrubber.stream()

    def __reduce__(self):
        raise TypeError(
            "an Upstream holds an API key and is never pickled; build it again "
            "from its file"
        )


class Upstreams(Mapping):
    """The upstream of each model the chat proxy forwards to, and how it falls back.

    A read-only mapping of the router's model names to :class:`Upstream`.

    Parameters
    ----------
    models : mapping of str to mapping
        Each model's ``{"base_url", "model", "api_key_env"}`` (``model``
        defaults to the model's name; ``api_key_env`` to none).
    fallbacks : int, default=1
        How many of the next-ranked models a request tries, one after the
        other, when the chosen one's upstream fails (cannot be reached, times
        out, or answers 401, 403, 404, 408, 429 or 5xx); 0 answers the first
        failure.
    timeout : float, default=60
        Seconds to wait for an upstream to connect, and then for each part of
        its answer.
    deadline : float, default=600
        Seconds a whole call to an upstream may take, from connecting to the
        answer's last byte, streamed or not: an upstream that trickles its
        answer a byte at a time is cut off then. At least ``timeout``.
    max_answer_bytes : int, default=16 MiB
        Largest answer read from an upstream (a JSON body, or a stream in all);
        a larger one is cut off there and reported as the upstream's failure.
        An error's body is read up to 4 KiB, whatever this says.
    environ : mapping, default=None
        Where keys are read (``os.environ`` by default).
    source : str, default="upstreams"
        What errors name as the configuration's origin (the file's path).

    Raises
    ------
    ValueError
        Naming the model and field at fault: a missing or unknown field, a URL
        that is not http(s) or holds credentials, a key variable that is not
        set. A key itself is never repeated.
    """

    def __init__(
        self,
        models,
        *,
        fallbacks=1,
        timeout=60.0,
        deadline=600.0,
        max_answer_bytes=DEFAULT_MAX_ANSWER_BYTES,
        environ=None,
        source="upstreams",
    ):
        environ = os.environ if environ is None else environ
        if isinstance(fallbacks, bool) or not isinstance(fallbacks, numbers.Integral):
            raise TypeError(f"fallbacks={fallbacks!r}; expected an integer")
        if fallbacks < 0:
            raise ValueError(f"fallbacks={fallbacks}; expected at least 0")
        for name, seconds in (("timeout", timeout), ("deadline", deadline)):
            if (
                isinstance(seconds, bool)
                or not isinstance(seconds, numbers.Real)
                or not math.isfinite(seconds)
                or seconds <= 0
            ):
                raise ValueError(
                    f"{name}={seconds!r}; expected a number of seconds above 0"
                )
        if deadline < timeout:
            raise ValueError(
                f"deadline={deadline!r} is below timeout={timeout!r}; the whole "
                "call's deadline must leave room for one silence"
            )
        if (
            isinstance(max_answer_bytes, bool)
            or not isinstance(max_answer_bytes, numbers.Integral)
            or max_answer_bytes < 1
        ):
            raise ValueError(
                f"max_answer_bytes={max_answer_bytes!r}; expected an integer above 0"
            )
        if not isinstance(models, Mapping) or not models:
            raise ValueError(f"{source}: no models; give a table per model")
        self.fallbacks = int(fallbacks)
        self.timeout = float(timeout)
        self.deadline = float(deadline)
        self.max_answer_bytes = int(max_answer_bytes)
        self._upstreams = {
            name: _upstream(name, fields, environ, source)
            for name, fields in models.items()
        }

    @classmethod
    def read(cls, path, *, environ=None, **settings):
        """Read the upstreams from a TOML file (see the module's description).

        Parameters
        ----------
        path : str or path-like
        environ : mapping, default=None
            As the class takes it.
        **settings
            ``fallbacks``, ``timeout``, ``deadline`` and ``max_answer_bytes``,
            as the class takes them.

        Returns
        -------
        Upstreams
        """
        path = Path(path)
        try:
            table = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as error:
            raise ValueError(f"{path}: cannot read it ({error})") from None
        except tomllib.TOMLDecodeError as error:
            raise ValueError(f"{path}: not valid TOML: {error}") from None
        extra = sorted(set(table) - {"models"})
        if extra:
            raise ValueError(
                f"{path}: unknown table {extra[0]!r}; the file holds [models.NAME] "
                "tables only"
            )
        return cls(
            table.get("models", {}), environ=environ, source=str(path), **settings
        )

    def __getitem__(self, name):
        return self._upstreams[name]

    def __iter__(self):
        return iter(self._upstreams)

    def __len__(self):
        return len(self._upstreams)

    def __repr__(self):
        return (
            f"Upstreams({len(self)} models, fallbacks={self.fallbacks}, "
            f"timeout={self.timeout:g}, deadline={self.deadline:g})"
        )

    def __reduce__(self):
        raise TypeError(
            "Upstreams hold API keys and are never pickled; read them again"
        )


def _upstream(name, fields, environ, source):
    """Build one model's :class:`Upstream`, checking each field by name."""
    where = f"{source}: model {name!r}"
    if not isinstance(name, str) or not name.strip() or has_control_character(name):
        raise ValueError(f"{source}: model name {name!r}; expected printable text")
    if not isinstance(fields, Mapping):
        raise ValueError(f"{where}: expected a table of {', '.join(_FIELDS)}")
    for field in fields:
        if field not in _FIELDS:
            hint = (
                "; a key is never written in the file: give api_key_env, the "
                "environment variable that holds it"
                if "key" in str(field).lower()
                else ""
            )
            # The value is not repeated: it may be a key written by mistake.
            raise ValueError(
                f"{where}: unknown field {field!r}; expected {', '.join(_FIELDS)}"
                + hint
            )
    for field in _FIELDS:
        value = fields.get(field)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise ValueError(f"{where}: {field} must be non-empty text")
    if "base_url" not in fields:
        raise ValueError(f"{where}: no base_url, the upstream's OpenAI-compatible API")
    base_url = _checked_url(fields["base_url"], where)
    key_variable = fields.get("api_key_env")
    key = None
    if key_variable is not None:
        key = environ.get(key_variable)
        if key is None or not key.strip():
            raise ValueError(
                f"{where}: the environment variable {key_variable} (api_key_env) "
                "is not set or is empty"
            )
        key = key.strip()
        if not key.isascii() or has_control_character(key):
            raise ValueError(
                f"{where}: the environment variable {key_variable} (api_key_env) "
                "holds a character that cannot go in a header (not ASCII, or a "
                "control character)"
            )
    return Upstream(base_url, fields.get("model", name), key_variable, api_key=key)


def _checked_url(url, where):
    """Return ``url`` when it is an http(s) URL without credentials, else refuse."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        # Not repeated: a URL written wrong may still hold a secret.
        raise ValueError(
            f"{where}: base_url is not an http:// or https:// URL with a host"
        )
    try:
        port = parts.port
    except ValueError:  # out of range, or not a number
        port = -1
    if port is not None and not 0 < port < 65536:
        raise ValueError(
            f"{where}: base_url has a port that is not a number from 1 to 65535"
        )
    if any(character.isspace() for character in url) or has_control_character(url):
        raise ValueError(f"{where}: base_url holds a space or a control character")
    if parts.username is not None or parts.password is not None:
        # Not repeated: the URL holds a secret.
        raise ValueError(
            f"{where}: base_url holds credentials; give the key through api_key_env"
        )
    if parts.query or parts.fragment:
        raise ValueError(
            f"{where}: base_url holds a query or fragment; expected the API's base, "
            "such as https://api.openai.com/v1"
        )
    return url
