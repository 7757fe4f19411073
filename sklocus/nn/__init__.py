"""Torch modules of LOCUS and the glue that trains them with skorch."""

from sklocus.nn.attention import (
    AttentionBlock,
    AttentionPooling,
    LatentBottleneckLayer,
    MultiHeadAttention,
)
from sklocus.nn.network import LocusNetwork
from sklocus.nn.predictor import CorrectnessPredictor
from sklocus.nn.set_encoder import EvaluationTokenizer, SetEncoder

__all__ = [
    "AttentionBlock",
    "AttentionPooling",
    "CorrectnessPredictor",
    "EvaluationTokenizer",
    "LatentBottleneckLayer",
    "LocusNetwork",
    "MultiHeadAttention",
    "SetEncoder",
]
