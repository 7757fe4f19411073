"""What the LiteLLM routing plugin adds to routing one query (issue 58).

    python benchmarks/litellm_plugin.py [--out docs/performance.md] [--repeats 200]

Builds the routers of ``benchmarks/serve.py`` (all-MiniLM-L6-v2 queries, an
embedder at the default architecture trained for one short epoch) and saves the
100-model one. Then, one new text at a time, p50 and p99:

- ``router.predict`` in process, the floor, on the router thread the plugin
  ranks on (torch keeps an OpenMP pool per calling thread);
- ``LocusRoutingPlugin.run`` on a LiteLLM ``RoutingContext`` of 10 candidate
  models, from the saved file (an encoder of its own, so each text is new to
  both), ranking on the router thread off the event loop;
- LiteLLM's ``Router.acompletion`` with mock answers, with the plugin and
  without, for what the gateway itself costs.

Each text is timed on both sides (a text's length sets most of its encoding
time) after SETTLE_S of idle (torch's OpenMP threads spin after a call). Writes
its section of ``--out`` (the rest of the page stays).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import tempfile
import time
from pathlib import Path

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import torch  # noqa: E402
from _sections import write_section  # noqa: E402
from litellm import Router  # noqa: E402
from litellm.types.router import RoutingContext  # noqa: E402
from provenance import commit as checked_out_commit  # noqa: E402
from serve import SETTLE_S, Texts, build_router, percentiles  # noqa: E402

import sklocus  # noqa: E402
from sklocus.integrations.litellm import LocusRoutingPlugin  # noqa: E402
from sklocus.serve._service import router_thread  # noqa: E402

N_CANDIDATES = 10


def gateway(names, plugin=None):
    deployments = [
        {
            "model_name": "auto",
            "litellm_params": {
                "model": f"openai/{name}",
                "api_key": "x",
                "mock_response": name,
            },
        }
        for name in names
    ]
    return Router(model_list=deployments, plugins=[plugin] if plugin else None)


async def timed(call, settle=SETTLE_S):
    await asyncio.sleep(settle)
    start = time.perf_counter()
    await call()
    return time.perf_counter() - start


async def measure(router, plugin, names, texts, repeats):
    plain, routed = gateway(names), gateway(names, plugin)
    found = {"predict": [], "plugin": [], "LiteLLM alone": [], "LiteLLM + plugin": []}

    def context(text):
        messages = [{"role": "user", "content": text}]
        return RoutingContext(
            raw_messages=messages,
            structured_messages=messages,
            candidate_models=[f"openai/{name}" for name in names],
        )

    def ask(gateway, text):
        messages = [{"role": "user", "content": text}]
        return gateway.acompletion(model="auto", messages=messages)

    for warm in texts.take(10):
        router_thread.call(router.predict, [warm])
        await plugin.run(context(warm))
        await ask(plain, warm)
        await ask(routed, warm)
    for _ in range(repeats):
        a, b = texts.take(2)

        async def predicted(text=a):
            # On the thread the plugin ranks on, so that both use one OpenMP
            # pool of torch's, as a served router does.
            router_thread.call(router.predict, [text])

        found["predict"].append(await timed(predicted))
        found["plugin"].append(await timed(lambda text=a: plugin.run(context(text))))
        found["LiteLLM alone"].append(await timed(lambda text=b: ask(plain, text)))
        found["LiteLLM + plugin"].append(await timed(lambda text=b: ask(routed, text)))
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="docs/performance.md")
    parser.add_argument("--repeats", type=int, default=200)
    arguments = parser.parse_args()
    commit = checked_out_commit()

    with tempfile.TemporaryDirectory() as folder:
        routers, _ = build_router(folder)
        router = routers[100]
        path = Path(folder) / "router-100.sklocus"
        sklocus.save(router, path)
        names = list(router.classes_[:N_CANDIDATES])
        plugin = LocusRoutingPlugin(
            path, model_names={f"openai/{name}": name for name in names}
        )
        found = asyncio.run(
            measure(router, plugin, names, Texts(seed=3), arguments.repeats)
        )

    p50 = {name: percentiles(seconds)[0] for name, seconds in found.items()}
    p99 = {name: percentiles(seconds)[1] for name, seconds in found.items()}
    added = p50["plugin"] - p50["predict"]
    lines = [
        "## Routing inside LiteLLM: what the plugin adds",
        "",
        f"Written by `python benchmarks/litellm_plugin.py` at commit {commit} on "
        f"{datetime.date.today()}, {platform.machine()}, "
        f"{torch.get_num_threads()} torch threads, torch {torch.__version__}. A "
        "router over 100 models (default architecture, all-MiniLM-L6-v2 "
        f"queries); the plugin, loaded from its model file, ranks {N_CANDIDATES} "
        "candidate models for each new text (12 to 40 words) on the router "
        "thread; LiteLLM's `Router` answers with mock responses. Each text is "
        f"timed on both sides of a comparison, each call after "
        f"{1000 * SETTLE_S:.0f} ms idle ({arguments.repeats} each):",
        "",
        "| path | p50 | p99 |",
        "|---|---|---|",
        *[
            f"| {label} | {p50[name]:.1f} ms | {p99[name]:.1f} ms |"
            for name, label in [
                ("predict", "`router.predict`, one query"),
                ("plugin", "`LocusRoutingPlugin.run`, one request"),
                ("LiteLLM alone", "LiteLLM `acompletion`, mock answer, no plugin"),
                ("LiteLLM + plugin", "LiteLLM `acompletion` with the plugin"),
            ]
        ],
        "",
        f"- The plugin adds at most 1.5 ms at p50 over `router.predict` for one "
        f"query: {added:.2f} ms ({'met' if added <= 1.5 else '**not met**'}).",
    ]
    text = "\n".join(lines)
    print(text)
    write_section(arguments.out, "litellm-plugin", text)


if __name__ == "__main__":
    main()
