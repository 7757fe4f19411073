"""Why LOCUS routes as it does on the Open LLM data: a diagnosis for docs/tuning.md.

Fits the onboarding embedder of one seed (as ``benchmarks/openllm.py`` does, with
``--set`` overrides) and the MF baseline, then, over several draws of the n
evaluations of the pool's models, prints for both:

- correctness and routing accuracy;
- routing when each model's deviations from its own mean logit over the test
  queries are scaled by ``lam`` (1 is plain routing; above 1 trusts the
  per-query differences between models more than the model predicts);
- the spread of each model's logits over the test queries around its mean (how
  much the prediction says that model's strength varies from query to query).

    python benchmarks/openllm_routing.py DATA_FOLDER [--seed 0]
        [--draws 4] [--set name=value ...]
"""

from __future__ import annotations

import argparse

import numpy as np
import openllm
import openllm_baselines as baselines
from overrides import parse_overrides

from sklocus.evaluations import subsample, to_matrix
from sklocus.metrics import correctness_accuracy, routing_accuracy

SIZES = (64, 128, 256, 512)
SCALES = (0.5, 1.0, 1.5)


def logit(p):
    p = np.clip(p, 1e-6, 1 - 1e-6)
    return np.log(p / (1 - p))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--draws", type=int, default=4)
    parser.add_argument("--set", nargs="*", default=[], metavar="NAME=VALUE")
    arguments = parser.parse_args()
    overrides = parse_overrides(arguments.set)
    seed = arguments.seed
    data = openllm.OpenLLM(arguments.data, "all-mpnet-base-v2")
    pool = data.draw_pool(seed)
    training = np.setdiff1d(np.arange(len(data.names)), pool)
    embedder, seconds = openllm.fit_embedder(data, training, seed, overrides)
    mf, _ = baselines.tuned_factor_model(
        "mf", data.train_matrix[training], data.train_vectors, seed
    )
    best = min(embedder.history_, key=lambda row: row["valid_loss"])["epoch"]
    print(
        f"overrides {overrides}: fit {seconds:.0f} s, MF item penalty "
        f"{mf.item_decay}, "
        f"{len(embedder.history_)} epochs (best {best})"
    )
    truth = data.test_matrix[pool]
    results = {}
    for n in SIZES:
        for state in openllm.draw_states(seed, arguments.draws):
            drawn = subsample(data.sets(pool), n, random_state=state)
            observed, _ = to_matrix(drawn, queries=data.train_ids)
            predicted = {
                "LOCUS": embedder.predict_correctness(
                    embedder.transform(drawn), data.test_ids
                ),
                "MF (dim 16)": mf.predict(
                    observed, data.train_vectors, data.test_vectors
                ),
            }
            for method, p in predicted.items():
                logits = logit(p)
                mean = logits.mean(axis=1, keepdims=True)
                figures = {
                    "correctness": correctness_accuracy(truth, p),
                    "profile spread": (logits - mean).std(axis=1).mean(),
                    **{
                        f"routing, lam {lam}": routing_accuracy(
                            truth, mean + lam * (logits - mean)
                        )
                        for lam in SCALES
                    },
                }
                for name, value in figures.items():
                    results.setdefault((method, name, n), []).append(value)
    print(f"mean over {arguments.draws} draws, n = {' / '.join(map(str, SIZES))}")
    for method, name in dict.fromkeys(key[:2] for key in results):
        cells = " / ".join(f"{np.mean(results[method, name, n]):.3f}" for n in SIZES)
        print(f"{method:12s} {name:18s} {cells}")


if __name__ == "__main__":
    main()
