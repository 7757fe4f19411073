"""The default embedder of another commit, on the pools of ``research/pools.py``.

For bisecting a change in held-out quality: check the commit out beside this
one, then run this script with that checkout's sklocus and benchmarks::

    git worktree add --detach ../at COMMIT
    PYTHONPATH=../at python -m research.forward_pass_at ../at DATA_FOLDER
        [--seed 0] [--draws 2] [--out FILE.json]

It draws the 8 pools of 112 unseen fully observed dense models as
``research/pools.py --seed S`` does, fits ``LocusEmbedder(random_state=S)`` (that
commit's defaults) on the train-query evaluations of every other model, and
measures that commit's forward pass (``transform`` then ``predict_correctness``)
on each pool at n = 64, 128, 256 and 512 evaluations per model, over the first
``--draws`` draws, on the 269 test queries. It uses only what every commit
since 02b3824 has: the checkout's Open LLM data module (``OpenLLM``,
``draw_states``; ``research/openllm_data.py``, or ``benchmarks/openllm.py``
before the research scripts left ``benchmarks/``) and sklocus's public API. Its
scores and predictions are oriented as that commit's are: a row per model before
sklocus made ``(n_queries, n_models)`` its one convention, a row per query since.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

import numpy as np

POOLS, POOL_SIZE, SIZES = 8, 112, (64, 128, 256, 512)


def pool_truth(data, pool):
    """The pool's test scores, oriented as the checkout's ``test_matrix`` is.

    ``(n_test_queries, n_models)`` since sklocus has a row per query everywhere,
    as that commit's ``predict_correctness`` and metrics have them;
    ``(n_models, n_test_queries)`` before, as theirs had.
    """
    if data.test_matrix.shape[0] == len(data.test_ids):
        return data.test_matrix[:, pool]
    return data.test_matrix[pool]


def _data_module(checkout):
    """The checkout's Open LLM data module, wherever that commit keeps it."""
    for relative in ("research/openllm_data.py", "benchmarks/openllm.py"):
        path = checkout / relative
        if path.is_file():
            # The older module imports its sibling scripts by their bare names.
            sys.path.insert(0, str(path.parent))
            spec = importlib.util.spec_from_file_location("openllm_at_commit", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
    raise SystemExit(f"{checkout} has no Open LLM data module")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkout", type=Path, help="the other commit's checkout")
    parser.add_argument("data", help="the Open LLM data folder")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--draws", type=int, default=2)
    parser.add_argument("--out", type=Path)
    arguments = parser.parse_args()

    import sklocus
    from sklocus import LocusEmbedder
    from sklocus.evaluations import subsample
    from sklocus.metrics import correctness_accuracy, routing_accuracy

    if Path(sklocus.__file__).resolve().parents[1] != arguments.checkout.resolve():
        raise SystemExit(f"sklocus comes from {sklocus.__file__}; set PYTHONPATH")
    openllm = _data_module(arguments.checkout)
    seed = arguments.seed
    data = openllm.OpenLLM(arguments.data, "all-mpnet-base-v2")
    candidates = np.flatnonzero(data.fully_observed & data.dense)
    order = np.random.default_rng(seed).permutation(candidates)
    pools = [np.sort(order[i * POOL_SIZE : (i + 1) * POOL_SIZE]) for i in range(POOLS)]
    training = np.setdiff1d(np.arange(len(data.names)), np.concatenate(pools))
    start = time.perf_counter()
    embedder = LocusEmbedder(query_encoder=data.encoder, random_state=seed)
    embedder.fit(data.sets(training))
    seconds = time.perf_counter() - start
    rows = []
    for pool in pools:
        truth, sets = pool_truth(data, pool), data.sets(pool)
        row = {"correctness": [], "routing": []}
        for n in SIZES:
            correctness, routing = [], []
            for state in openllm.draw_states(seed, arguments.draws):
                drawn = subsample(sets, n, random_state=state)
                p = embedder.predict_correctness(
                    embedder.transform(drawn), data.test_ids
                )
                correctness.append(correctness_accuracy(truth, p))
                routing.append(routing_accuracy(truth, p))
            row["correctness"].append(float(np.mean(correctness)))
            row["routing"].append(float(np.mean(routing)))
        rows.append(row)
        print(row, flush=True)
    history = embedder.net_.history
    result = {
        "seed": seed,
        "draws": arguments.draws,
        "sizes": SIZES,
        "fit_seconds": round(seconds, 1),
        "valid_loss": [epoch.get("valid_loss") for epoch in history],
        "pools": rows,
    }
    for metric in ("correctness", "routing"):
        values = np.array([row[metric] for row in rows])
        print(metric, np.round(values.mean(axis=0), 3).tolist())
    if arguments.out:
        arguments.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
