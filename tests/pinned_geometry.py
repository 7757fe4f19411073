"""Write the trained embedder that test_geometry.py measures the geometry with.

    python tests/pinned_geometry.py

Trains a LocusEmbedder for 200 epochs on ``make_evaluations(random_state=0)``
(planted duplicates and families) and saves it as
``pinned/geometry-embedder.sklocus``. test_geometry.py checks that duplicates,
clusters, search by profile and distances recover what make_evaluations
planted; training is not what it tests (test_embedder.py does), and training
took it 20-40 s of every run. Run again if make_evaluations or the network
changes. Written at commit e009144 (2026-12-07), one thread.
"""

from __future__ import annotations

from pathlib import Path

import torch

import sklocus
from sklocus import LocusEmbedder
from sklocus.datasets import make_evaluations

EMBEDDER = Path(__file__).resolve().parent / "pinned" / "geometry-embedder.sklocus"
DATA = dict(random_state=0)
NETWORK = dict(
    embedding_dim=32,
    n_layers=0,
    n_heads=2,
    predictor_hidden=32,
    batch_size=8,
    lr=1e-3,
    predictor_lr=2e-3,
    validation_fraction=None,
    max_epochs=200,
    epoch_size=1,
    random_state=0,
)


def main():
    torch.set_num_threads(1)
    data = make_evaluations(**DATA)
    embedder = LocusEmbedder(query_encoder=data.encoder, **NETWORK)
    sklocus.save(embedder.fit(data.evaluation_sets), EMBEDDER)


if __name__ == "__main__":
    main()
