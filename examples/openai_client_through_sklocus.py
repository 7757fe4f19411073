"""
The openai client through ``sklocus serve``
===========================================

``sklocus serve --upstreams FILE`` answers OpenAI's ``POST
/v1/chat/completions``: it routes each request by the text of its last user
message, forwards it to the chosen model's own API and relays the answer, a
stream included. Any client of OpenAI's API can use it by pointing its base URL
at the server. Here every model's API is a stand-in on this machine (it answers
with the model's name), so the example runs without keys or network.
"""

# %%
# A router, and an API per model
# ------------------------------
#
# A synthetic pool of 8 models; its queries are ids that the pool's encoder
# knows, where real traffic would bring question texts (and a
# ``SentenceEncoder``). The stand-in answers as an OpenAI-compatible API
# would: ``model`` says which model is asked, and ``"stream": true`` gets
# server-sent events. Its ``failing`` models answer 503.
import collections
import http.server
import json
import threading

import pandas as pd
from openai import OpenAI

from sklocus import LocusEmbedder, LocusRouter
from sklocus.datasets import make_evaluations
from sklocus.evaluations import to_matrix
from sklocus.serve import RouterService, Upstreams, listen, server

data = make_evaluations(
    n_models=8, n_queries=400, evals_per_model=None, query_dim=16, random_state=0
)
scores, queries = to_matrix(data.evaluation_sets)
train, traffic = queries[:300], queries[300:]
embedder = LocusEmbedder(
    query_encoder=data.encoder,
    embedding_dim=16,
    n_latents=4,
    max_epochs=3,
    epoch_size=256,
    random_state=0,
)
router = LocusRouter(embedder).fit(
    train, pd.DataFrame(scores[:300], columns=data.model_names)
)

failing = set()


class StandInAPI(http.server.BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802
        request = json.loads(self.rfile.read(int(self.headers["content-length"])))
        model = request["model"]
        if model in failing:
            return self.answer(503, {"error": {"message": f"{model} is down"}})
        text = f"an answer from {model}"
        if not request.get("stream"):
            message = {"role": "assistant", "content": text}
            choice = {"index": 0, "message": message, "finish_reason": "stop"}
            return self.answer(
                200,
                {
                    "object": "chat.completion",
                    "model": model,
                    "id": "1",
                    "created": 0,
                    "choices": [choice],
                },
            )
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        for word in text.split(" "):
            delta = {"index": 0, "delta": {"content": word + " "}}
            chunk = {
                "object": "chat.completion.chunk",
                "model": model,
                "id": "1",
                "created": 0,
                "choices": [delta],
            }
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")

    def answer(self, status, payload):
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


api = http.server.ThreadingHTTPServer(("127.0.0.1", 0), StandInAPI)
threading.Thread(target=api.serve_forever, daemon=True).start()
api_url = f"http://127.0.0.1:{api.server_address[1]}/v1"

# %%
# Serve the router with its upstreams
# -----------------------------------
#
# ``Upstreams`` holds each model's API, as the TOML file of ``sklocus serve
# --upstreams`` does (``[models."model-0000"]`` with ``base_url``, and
# ``api_key_env``, the variable holding its key, for an API that needs one).
# The server runs in a thread here; ``sklocus serve router.sklocus
# --upstreams upstreams.toml`` is the same from the command line.
upstreams = Upstreams({name: {"base_url": api_url} for name in data.model_names})
listener = listen("127.0.0.1", 0)
served = server(RouterService(router), upstreams=upstreams, log_level="warning")
threading.Thread(target=served.run, kwargs={"sockets": [listener]}).start()
while not served.started:
    threading.Event().wait(0.01)
client = OpenAI(
    base_url=f"http://127.0.0.1:{listener.getsockname()[1]}/v1",
    api_key="unused",  # the server's token, when it has one
    max_retries=0,
)


# %%
# Ask through the client
# ----------------------
#
# ``"model": "auto"`` routes. ``with_raw_response`` shows the headers: the
# model that answered and its probability of a correct answer.
def ask(question, **request):
    raw = client.chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": question}], **request
    )
    return raw.headers, raw.parse()


answered = []
for question in traffic[:40]:
    headers, answer = ask(question)
    answered.append(answer.choices[0].message.content.removeprefix("an answer from "))
expected = [router.predict([question])[0] for question in traffic[:40]]
agree = sum(a == e for a, e in zip(answered, expected))
print(f"answers from the model router.predict names: {agree} of {len(expected)}")
print("answers per model:", dict(collections.Counter(answered).most_common()))
print(
    f"the last one: {headers['x-sklocus-model']}, "
    f"P(correct) = {float(headers['x-sklocus-p-correct']):.2f}"
)

# %%
# A stream, and a fallback
# ------------------------
#
# A stream is relayed event by event. When the chosen model's API fails before
# it answers, the request goes to the next-ranked model (``--fallbacks``, 1 by
# default), and ``x-sklocus-fallbacks`` counts the failures before the answer.
headers, stream = ask(traffic[40], stream=True)
text = "".join(chunk.choices[0].delta.content or "" for chunk in stream)
print(f"streamed from {headers['x-sklocus-model']}: {text.strip()!r}")

best = router.predict([traffic[41]])[0]
failing.add(best)
headers, answer = ask(traffic[41])
print(
    f"{best} is down; answered by {headers['x-sklocus-model']} after "
    f"{headers['x-sklocus-fallbacks']} failure"
)
client.close()
served.should_exit = True
api.shutdown()
