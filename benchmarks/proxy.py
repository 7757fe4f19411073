"""What the chat proxy of ``sklocus serve --upstreams`` adds to a completion (issue 58).

    python benchmarks/proxy.py [--out docs/performance.md] [--repeats 200]

Builds the routers of ``benchmarks/serve.py`` (all-MiniLM-L6-v2 queries, an
embedder at the default architecture trained for one short epoch), saves the
100-model one and serves it with ``sklocus serve --upstreams`` in a process of
its own. Each model's upstream is a stand-in OpenAI-compatible API in this
process, which answers at once. Then, one new
text at a time, p50 and p99, each through one keep-alive ``http.client``
connection:

- the upstream's own latency: the chat request posted to the stand-in directly;
- the router's decision: ``router.rank_models`` for the text in this process
  (an encoder of its own, so each text is new to both sides);
- the same chat request through the proxy (``"model": "auto"``);
- the decision and the proxied request again for the same text, which the
  encoders' caches now answer: a decision of ranking alone.

The proxy's cost is what it adds over the upstream: the router's decision,
which any routed request pays wherever the router runs (encoding a new text
with all-MiniLM-L6-v2 is most of it), and the forwarding (two HTTP hops in
place of one, the body parsed and written again), which the second round
isolates. Each call is timed after SETTLE_S of idle (torch's OpenMP threads
spin after a call). Writes its section of ``--out`` (the rest of the page
stays).
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import http.server
import json
import platform
import tempfile
import threading
import urllib.parse
from pathlib import Path

import torch
from _sections import write_section
from provenance import commit as checked_out_commit
from serve import SETTLE_S, Server, Texts, build_router, percentiles, timed

import sklocus


class _Answer(http.server.BaseHTTPRequestHandler):
    """A chat completion at once, saying which model was asked."""

    protocol_version = "HTTP/1.1"
    wbufsize = -1  # head and body in one write (no wait on Nagle's algorithm)

    def do_POST(self):  # noqa: N802 - http.server's name
        asked = json.loads(self.rfile.read(int(self.headers["content-length"])))
        message = {"role": "assistant", "content": f"{asked['model']} answers"}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        body = json.dumps({"object": "chat.completion", "choices": [choice]})
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):
        pass


class InstantUpstream:
    """An OpenAI-compatible API on a loopback port that answers at once."""

    def __init__(self):
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
        self.server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class ChatClient:
    """One keep-alive connection that posts chat requests to a base URL."""

    def __init__(self, base_url):
        parts = urllib.parse.urlsplit(base_url)
        self.path = parts.path.rstrip("/") + "/chat/completions"
        self.connection = http.client.HTTPConnection(
            parts.hostname, parts.port, timeout=60
        )

    def ask(self, model, text):
        body = json.dumps(
            {"model": model, "messages": [{"role": "user", "content": text}]}
        )
        self.connection.request(
            "POST", self.path, body=body, headers={"content-type": "application/json"}
        )
        response = self.connection.getresponse()
        payload = response.read()
        if response.status != 200:
            raise RuntimeError(f"{response.status}: {payload[:300]}")
        return response.getheader("x-sklocus-model"), json.loads(payload)

    def close(self):
        self.connection.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="docs/performance.md")
    parser.add_argument("--repeats", type=int, default=200)
    arguments = parser.parse_args()
    commit = checked_out_commit()

    with tempfile.TemporaryDirectory() as folder:
        routers, _ = build_router(folder)
        router = routers[100]
        names = router.classes_.tolist()
        path = Path(folder) / "router-100.sklocus"
        sklocus.save(router, path)
        stand_in = InstantUpstream()
        table = "".join(
            f'[models."{name}"]\nbase_url = "{stand_in.base_url}"\n' for name in names
        )
        upstreams = Path(folder) / "upstreams.toml"
        upstreams.write_text(table)
        server = Server(path, "--upstreams", upstreams, "--log-level", "warning")
        direct = ChatClient(stand_in.base_url)
        proxied = ChatClient(f"http://127.0.0.1:{server.port}/v1")
        texts = Texts(seed=4)
        for warm in texts.take(20):
            direct.ask(names[0], warm)
            proxied.ask("auto", warm)
            router.rank_models([warm], k=2)
        found = {
            "upstream": [],
            "decision": [],
            "routed": [],
            "decision, cached": [],
            "routed, cached": [],
        }
        for _ in range(arguments.repeats):
            (text,) = texts.take(1)
            for name, call, argument in [
                ("upstream", lambda q: direct.ask(names[0], q), text),
                ("decision", lambda q: router.rank_models(q, k=2), [text]),
                ("routed", lambda q: proxied.ask("auto", q), text),
                ("decision, cached", lambda q: router.rank_models(q, k=2), [text]),
                ("routed, cached", lambda q: proxied.ask("auto", q), text),
            ]:
                found[name].append(timed(call, argument, SETTLE_S))
        chosen, _ = proxied.ask("auto", texts.take(1)[0])
        assert chosen in names, chosen
        direct.close()
        proxied.close()
        server.close()
        stand_in.close()

    p50 = {name: percentiles(seconds)[0] for name, seconds in found.items()}
    p99 = {name: percentiles(seconds)[1] for name, seconds in found.items()}
    added = p50["routed"] - p50["upstream"]
    added_cached = p50["routed, cached"] - p50["upstream"]
    forwarding = added_cached - p50["decision, cached"]
    lines = [
        "## The chat proxy: what `sklocus serve --upstreams` adds",
        "",
        f"Written by `python benchmarks/proxy.py` at commit {commit} on "
        f"{datetime.date.today()}, {platform.machine()}, "
        f"{torch.get_num_threads()} torch threads, torch {torch.__version__}. A "
        "router over 100 models (default architecture, all-MiniLM-L6-v2 "
        "queries) served with `--upstreams`; every model's upstream is a local "
        "stand-in OpenAI-compatible API that answers at once. One chat request "
        "of one text (12 to 40 words) at a time, through one keep-alive "
        f"`http.client` connection, each call after {1000 * SETTLE_S:.0f} ms "
        f"idle ({arguments.repeats} texts). Each text is new to the encoders, "
        "then asked again, when their caches answer it and the decision is "
        "the ranking alone:",
        "",
        "| path | p50 | p99 |",
        "|---|---|---|",
        *[
            f"| {label} | {p50[name]:.1f} ms | {p99[name]:.1f} ms |"
            for name, label in [
                ("upstream", "the upstream alone, posted to directly"),
                ("decision", "the router's decision in process, a new text"),
                ("routed", "through the proxy, a new text"),
                ("decision, cached", "the router's decision, the text cached"),
                ("routed, cached", "through the proxy, the text cached"),
            ]
        ],
        "",
        f"- Forwarding (the proxy over the upstream, less the decision, with the "
        f"text cached): {forwarding:.1f} ms at p50. Goal, the proxy adds at most "
        f"3 ms over the upstream's own latency: "
        f"{'met' if forwarding <= 3 else '**not met**'} for the forwarding; with "
        f"the decision's ranking it adds {added_cached:.1f} ms.",
        f"- A new text adds {added:.1f} ms, most of it the router's decision "
        f"({p50['decision']:.1f} ms in process): encoding the text, which "
        "routing pays wherever the router runs (the serving section above "
        "compares it with the encoder alone).",
    ]
    text = "\n".join(lines)
    print(text)
    write_section(arguments.out, "proxy", text)


if __name__ == "__main__":
    main()
