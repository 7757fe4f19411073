"""The evaluation folders that ship inside the package, by name.

Light on purpose: ``sklocus data`` prints a folder's path without importing
pandas or torch.
"""

from __future__ import annotations

from pathlib import Path

# Each shipped folder (in load_evaluations' layout) and what it holds.
SHIPPED = {
    "llmrouter": (
        "9 open models on 6,108 questions, every model on every question; "
        "queries.parquet's split column holds the source's 5,608 train and 500 "
        "test questions, models.parquet each model's params_b, input_price and "
        "output_price (US$ per million tokens). From LLMRouter "
        "(ulab-uiuc/LLMRouter), MIT licence."
    ),
}

# The packaged sentence encoders whose vectors of each shipped folder's question
# texts ship beside them, row by row as encoded_<name>.npy (float32).
SHIPPED_ENCODINGS = ("all-MiniLM-L6-v2",)


def shipped_folder(name):
    """Return the path of the shipped evaluation folder ``name``."""
    if name not in SHIPPED:
        raise ValueError(
            f"no shipped data set is called {name!r}; expected one of {sorted(SHIPPED)}"
        )
    return Path(__file__).resolve().parent / "datasets" / "data" / name
