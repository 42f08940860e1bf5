"""Parameter counts of the five presets, by formula and by building the model on the meta device.

Run: python snippets/parameter_counts.py
"""

import torch

from cs336_systems.model import PRESETS, TransformerLM, count_parameters

for name, cfg in PRESETS.items():
    with torch.device("meta"):  # no memory: shapes only
        built = sum(p.numel() for p in TransformerLM.from_config(cfg).parameters())
    counts = count_parameters(cfg)
    assert built == counts["total"]
    print(f"{name:>6}: {counts['total']:>13,} total, {counts['non_embedding']:>13,} non-embedding")
