#!/usr/bin/env bash
# The command line end to end: from a long table of evaluations to a trained
# model file, embeddings, routes, substitutes, near-duplicates and a portfolio.
#
# Run it in an empty folder: bash command_line.sh
set -euo pipefail

# 1. A long table, one row per (model, query, score), as evaluation harnesses log
#    them. Here it comes from the synthetic generator, with each model's size in
#    billions of parameters as a cost column, and the queries' vectors (stand-ins
#    for sentence encodings) in a .npy file with their ids, one per line.
python - <<'PY'
import numpy as np
import pandas as pd

from sklocus.datasets import make_evaluations

data = make_evaluations(n_models=60, n_queries=400, query_dim=32, random_state=0)
rows = [
    (name, query, score, data.params_b[i])
    for i, (name, evaluations) in enumerate(zip(data.model_names, data.evaluation_sets))
    for query, score in evaluations.items()
]
pd.DataFrame(rows, columns=["model", "query", "score", "params_b"]).to_csv(
    "evals.csv", index=False
)
np.save("query_vectors.npy", data.query_vectors)
with open("query_ids.txt", "w") as ids:
    ids.write("\n".join(data.query_ids) + "\n")
pd.DataFrame({"query": data.query_ids[:20]}).to_csv("queries.csv", index=False)
PY

# 2. Train an embedder and save it as a model file that loads without running
#    code. --set changes any LocusEmbedder parameter; small ones keep this quick.
#    With query texts instead of vectors, leave out --query-vectors and
#    --query-ids (and name the texts' column with --text-column if it is not the
#    query column): the default sentence encoder encodes them.
sklocus fit evals.csv -o model.sklocus \
    --query-vectors query_vectors.npy --query-ids query_ids.txt \
    --set embedding_dim=32 --set n_latents=8 --set max_epochs=2 \
    --set epoch_size=512 --random-state 0

# 3. One row per model: its name, number of evaluations, cost and vector.
sklocus embed model.sklocus evals.csv -o embeddings.parquet --cost-column params_b

# 4. Route each query to the best available model, listing the top 3 with their
#    probability of a correct answer; model-0001 is down, and size costs a little.
sklocus route model.sklocus evals.csv queries.csv -o routes.csv -k 3 \
    --exclude model-0001 --cost-column params_b --cost-weight 0.05
head -n 4 routes.csv

# 5. The geometry of the pool: substitutes for a model, pairs that behave
#    alike, families, and a portfolio of 8 models, then one within 100B
#    parameters in all.
sklocus neighbors embeddings.parquet -k 3 --model model-0001
sklocus duplicates embeddings.parquet -o duplicates.csv
sklocus clusters embeddings.parquet --n-clusters 8 -o families.csv
sklocus select embeddings.parquet --method k-center --n-selected 8
sklocus select embeddings.parquet --method coverage --max-total-cost 100 \
    --cost-column params_b -o portfolio.csv
cat portfolio.csv
