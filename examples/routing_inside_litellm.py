"""
Routing inside LiteLLM
======================

Most teams already send their traffic through a gateway. LiteLLM's ``Router``
runs routing plugins before it picks a deployment;
:class:`~sklocus.integrations.litellm.LocusRoutingPlugin` keeps, among the
deployments a request may go to, the one a LOCUS router finds likeliest to
answer it. Here the deployments are LiteLLM's offline stand-ins (each answers
with a fixed text), so the example runs without keys or network.
"""

# %%
# A router, and a gateway over the same models
# --------------------------------------------
#
# A synthetic pool of 8 models; its queries are ids that the pool's encoder
# knows, where real traffic would bring question texts (and a
# ``SentenceEncoder``). Each model is a deployment of the model group
# ``"auto"``, named as LiteLLM names it (``"openai/model-0000"``); ``model_names``
# maps those names to the router's.
import asyncio
import collections
import os
import tempfile

import pandas as pd

from sklocus import LocusEmbedder, LocusRouter
from sklocus.datasets import make_evaluations
from sklocus.evaluations import to_matrix
from sklocus.integrations.litellm import LocusRoutingPlugin
from sklocus.serve import RouterService

# Offline, LiteLLM must not fetch its price list when imported.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
from litellm import Router  # noqa: E402

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
deployments = [
    {
        "model_name": "auto",
        "litellm_params": {
            "model": f"openai/{name}",
            "api_key": "unused",
            "mock_response": f"an answer from {name}",
        },
    }
    for name in data.model_names
]

# %%
# Route through the gateway
# -------------------------
#
# The router lives in the gateway's process, in a
# :class:`~sklocus.serve.RouterService` that keeps a feedback journal (below);
# a model file or the URL of ``sklocus serve`` would do as well. LiteLLM runs
# plugins on its async calls.
folder = tempfile.TemporaryDirectory()
service = RouterService(router, feedback_journal=os.path.join(folder.name, "j.db"))
plugin = LocusRoutingPlugin(
    service, model_names={f"openai/{name}": name for name in data.model_names}
)
gateway = Router(model_list=deployments, plugins=[plugin])


async def ask(question):
    answer = await gateway.acompletion(
        model="auto", messages=[{"role": "user", "content": question}]
    )
    return answer.choices[0].message.content.removeprefix("an answer from ")


async def ask_all(questions):
    return await asyncio.gather(*[ask(question) for question in questions])


answered = asyncio.run(ask_all(traffic[:40]))
# The router's choice for each question, asked alone as the gateway asks it.
expected = [router.predict([question])[0] for question in traffic[:40]]
agree = sum(a == e for a, e in zip(answered, expected))
print(f"answers from the model router.predict names: {agree} of {len(expected)}")
print("answers per model:", dict(collections.Counter(answered).most_common()))

# %%
# Learn from the answers
# ----------------------
#
# ``outcome_logger(grader)`` is a LiteLLM callback: after each answer of a
# model the router knows, the grader scores it and the plugin sends the score
# to the router's feedback. Here the grader looks the outcome up in the
# synthetic results; a real one would check the answer, or a user would send
# thumbs with ``plugin.feedback``. ``fold_all`` teaches the router the outcomes.
import litellm  # noqa: E402

outcome = {
    (query, name): score
    for name, evaluations in zip(data.model_names, data.evaluation_sets)
    for query, score in evaluations.items()
}


def grade(messages, response):
    model = response.choices[0].message.content.removeprefix("an answer from ")
    return outcome[messages[-1]["content"], model]


async def serve_and_grade(questions):
    for question in questions:
        await ask(question)
    while service.health()["pending_outcomes"] < len(questions):
        await asyncio.sleep(0.01)  # LiteLLM runs callbacks after each call


litellm.callbacks = [plugin.outcome_logger(grade)]
asyncio.run(serve_and_grade(traffic[40:100]))
print(f"outcomes folded into the router: {service.fold_all()}")
learnt = {model["name"]: model["n_outcomes"] for model in service.models()}
print("outcomes learnt per model:", {k: v for k, v in learnt.items() if v})
folder.cleanup()
