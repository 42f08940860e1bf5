"""The Transformer LM the benchmarks run: presets, model, AdamW, cross-entropy, attention swap."""

from . import attention
from .attention import get_attention, naive_attention, use_attention
from .config import PRESETS, ModelConfig, count_parameters, flops_per_token, get_config
from .optim import AdamW, cross_entropy
from .transformer import TransformerLM

__all__ = ["PRESETS", "AdamW", "ModelConfig", "TransformerLM", "attention", "count_parameters",
           "cross_entropy", "flops_per_token", "get_attention", "get_config", "naive_attention",
           "use_attention"]
