"""Malformed requests for a served router, each one sure to be refused.

Shared by tests/test_hostile_server.py and benchmarks/serve_hostile.py. Every
request breaks exactly one rule (a field of the wrong type or out of range, a
name or query the router does not know, JSON that Python's parser would take
but a request may not hold, a body cut short), so a right answer is a 4xx.
Long strings in a request are recorded, so a test can check the answer does
not repeat them.
"""

import json
import string
from urllib.parse import quote

import numpy as np

LETTERS = np.array(list(string.ascii_letters))
# Characters a model name may not hold: a newline, NUL, a right-to-left
# override, a zero-width space, a line separator.
UNPRINTABLE = ["\n", "\x00", "\u202e", "\u200b", "\u2028", "\x1b"]


class Malformed:
    """Draw malformed requests against a router's queries and models.

    Parameters
    ----------
    queries : list of str
        Queries the router knows (ids of its precomputed encoder, or texts).
    models : list of str
        The models served.
    max_batch : int
    max_evaluations : int
    any_text : bool, default=False
        Whether the router encodes any text (a SentenceEncoder), so that an
        unknown query is no fault.
    seed : int, default=0
    """

    def __init__(
        self, queries, models, *, max_batch, max_evaluations, any_text=False, seed=0
    ):
        self.any_text = any_text
        self.queries = list(queries)
        self.models = list(models)
        self.max_batch = max_batch
        self.max_evaluations = max_evaluations
        self.rng = np.random.default_rng(seed)

    def text(self, n=None):
        """Return random letters: 48 to 400 of them unless ``n`` says."""
        n = int(self.rng.integers(48, 400)) if n is None else n
        return "".join(self.rng.choice(LETTERS, size=n))

    def pick(self, options):
        return options[int(self.rng.integers(len(options)))]

    # -- one field at a time, each value wrong for its field ----------------------

    def bad_queries(self):
        unknown = [] if self.any_text else [lambda: [self.text()]]
        return self.pick(
            unknown
            + [
                lambda: [],
                lambda: self.text(),
                lambda: {"q": 1},
                lambda: None,
                lambda: True,
                lambda: [7],
                lambda: [""],
                lambda: [self.queries[0], None],
                lambda: ["x" * 20_001],
                lambda: [self.queries[0]] * (self.max_batch + 1),
                lambda: [[self.queries[0]]],
            ]
        )()

    def bad_value(self, field):
        """A value wrong for ``field`` of /route or /models."""
        common = [lambda: "1", lambda: [], lambda: {}, lambda: self.text()]
        options = {
            "k": [
                lambda: True,
                lambda: 0,
                lambda: -3,
                lambda: 1.5,
                lambda: len(self.models) + 1,
                lambda: 10**17,
            ],
            "cost_weight": [lambda: -1, lambda: True, lambda: -0.5],
            "exclude": [
                lambda: [self.text()],
                lambda: list(self.models),  # every model
                lambda: [1],
                lambda: self.text(),
                lambda: [self.models[0] + self.pick(UNPRINTABLE)],
            ],
            "models": [
                lambda: [self.text()],
                lambda: [],
                lambda: [None],
                lambda: [self.models[0], self.text()],
            ],
            "name": [
                lambda: "",
                lambda: self.models[0],  # already served: 409
                lambda: "new" + self.pick(UNPRINTABLE) + "model",
                lambda: self.text(513),
                lambda: 12,
                lambda: None,
            ],
            "evaluations": [
                lambda: {},
                lambda: [self.queries[0]],
                lambda: {self.queries[0]: 1.5},
                lambda: {self.queries[0]: -0.1},
                lambda: {self.queries[0]: True},
                lambda: {self.queries[0]: "1"},
                lambda: {self.queries[0]: None},
                lambda: {
                    f"{self.queries[0]} {i}": 1.0
                    for i in range(self.max_evaluations + 1)
                },
            ],
            "cost": [lambda: -0.5, lambda: -2, lambda: True, lambda: "2"],
        }[field]
        if field == "evaluations" and not self.any_text:
            options.append(lambda: {self.text(): 1.0})  # an unknown query
        if field == "name":  # a text is a name
            common = common[1:3]
        return self.pick(options + common)()

    def valid(self, path):
        """A valid body for ``path``, to break in one place."""
        queries = list(self.rng.choice(self.queries, size=3))
        if path == "/route":
            return {"queries": queries, "k": 2, "cost_weight": 0.1}
        if path == "/predict":
            return {"queries": queries, "models": self.models[:2]}
        name = f"newcomer-{self.text(8)}"
        return {"name": name, "evaluations": {q: 1.0 for q in queries}, "cost": 1.0}

    # -- whole requests -------------------------------------------------------------

    def body(self, path):
        """A body for ``path`` with one field wrong, or one field too many."""
        body = self.valid(path)
        field = self.pick([*body, "unknown"])
        if field == "unknown":
            body[self.text()] = 1
        elif field == "queries":
            body[field] = self.bad_queries()
        else:
            body[field] = self.bad_value(field)
        return json.dumps(body).encode()

    def raw(self, path):
        """Bytes that no request may be: broken or non-JSON JSON."""
        valid = self.valid(path)
        valid.pop("k", None)
        good = json.dumps(valid)
        number = self.pick(["NaN", "Infinity", "-Infinity", "1e400", "9" * 5000])
        tricks = [
            lambda: good[: int(self.rng.integers(0, len(good)))],  # cut short
            lambda: good[:-1] + f', "k": {number}}}',
            lambda: good.replace('"', '"\\ud800', 1),
            lambda: good.replace('"', '"\\udfff', 3),
            lambda: good[:-1] + ', "' + next(iter(json.loads(good))) + '": []}',
            lambda: "[" * 100_000 + "]" * 100_000,
            lambda: self.text(),
            lambda: "",
            lambda: "null",
            lambda: json.dumps([self.text()]),
            lambda: good + "}",
        ]
        text = self.pick(tricks)()
        return text.encode("utf-8", "surrogatepass")

    def request(self):
        """Return ``(method, path, content, headers, echoes)``.

        ``echoes`` are the long strings of the request, which no answer may
        repeat.
        """
        kind = self.rng.random()
        headers = {"content-type": "application/json"}
        if kind < 0.1:
            name = self.pick(
                [
                    self.text(),
                    "ghost" + self.pick(UNPRINTABLE),
                    self.models[0] + "/" + self.text(),
                ]
            )
            echoes = [name] if len(name) >= 45 else []
            return "DELETE", "/models/" + quote(name, safe="/"), None, {}, echoes
        path = self.pick(["/route", "/predict", "/models"])
        if kind < 0.45:
            content = self.raw(path)
        elif kind < 0.5:
            content = bytes(self.rng.integers(128, 256, size=64).astype(np.uint8))
        elif kind < 0.55:
            content, headers = (
                json.dumps(self.valid(path)).encode(),
                {"content-type": "text/plain"},
            )
            if path == "/models":  # a valid body: keep it from onboarding
                content = content.replace(b'"cost"', b'"cost ')
        else:
            content = self.body(path)
        echoes = [
            s
            for s in _strings(content.decode("utf-8", "replace"))
            if len(s) >= 45 and s.isalpha()
        ]
        return "POST", path, content, headers, echoes


def _strings(text):
    """The quoted strings of a JSON text, roughly (for echo checks)."""
    return text.split('"')[1::2]
