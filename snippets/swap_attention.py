"""Swap the attention of every layer with one line, and check the swap took effect.

Run: python snippets/swap_attention.py
"""

import torch

from cs336_systems.model import TransformerLM, get_config, naive_attention, use_attention

model = TransformerLM.from_config(get_config("tiny"))
tokens = torch.randint(0, model.config.vocab_size, (2, 32))
calls = []


def counting_attention(Q, K, V, mask=None):
    calls.append(tuple(Q.shape))  # (batch, heads, seq, d_head)
    return naive_attention(Q, K, V, mask)


with use_attention(counting_attention):
    logits = model(tokens)

print(f"attention ran {len(calls)} times (one per layer) on Q of shape {calls[0]}")
print(f"logits: {tuple(logits.shape)}")
assert len(calls) == model.config.num_layers
