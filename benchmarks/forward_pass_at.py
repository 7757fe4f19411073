"""The default embedder of another commit, on the pools of ``openllm_pools.py``.

For bisecting a change in held-out quality: check the commit out beside this
one, then run this script with that checkout's sklocus and benchmarks::

    git worktree add --detach ../at COMMIT
    PYTHONPATH=../at python benchmarks/forward_pass_at.py ../at DATA_FOLDER
        [--seed 0] [--draws 2] [--out FILE.json]

It draws the 8 pools of 112 unseen fully observed dense models as
``openllm_pools.py --seed S`` does, fits ``LocusEmbedder(random_state=S)`` (that
commit's defaults) on the train-query evaluations of every other model, and
measures that commit's forward pass (``transform`` then ``predict_correctness``)
on each pool at n = 64, 128, 256 and 512 evaluations per model, over the first
``--draws`` draws, on the 269 test queries. It uses only what every commit
since 02b3824 has: the checkout's ``benchmarks/openllm.py`` (``OpenLLM``,
``draw_states``) and sklocus's public API.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

POOLS, POOL_SIZE, SIZES = 8, 112, (64, 128, 256, 512)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkout", type=Path, help="the other commit's checkout")
    parser.add_argument("data", help="the Open LLM data folder")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--draws", type=int, default=2)
    parser.add_argument("--out", type=Path)
    arguments = parser.parse_args()
    sys.path.insert(0, str(arguments.checkout / "benchmarks"))
    import openllm  # the checkout's

    import sklocus
    from sklocus import LocusEmbedder
    from sklocus.evaluations import subsample
    from sklocus.metrics import correctness_accuracy, routing_accuracy

    if Path(sklocus.__file__).resolve().parents[1] != arguments.checkout.resolve():
        raise SystemExit(f"sklocus comes from {sklocus.__file__}; set PYTHONPATH")
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
        truth, sets = data.test_matrix[pool], data.sets(pool)
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
