"""Data sets: synthetic evaluations with known ground truth; loaders of real ones."""

from sklocus.datasets._embedllm import fetch_embedllm
from sklocus.datasets._load import load_evaluations, load_llmrouter
from sklocus.datasets._synthetic import make_evaluations

__all__ = ["fetch_embedllm", "load_evaluations", "load_llmrouter", "make_evaluations"]
