"""Model hyperparameters and the size presets the benchmarks sweep (the course handouts' model-size
tables: vocab 10,000).

The 2025 table is small, medium, large, xl (1600 wide) and 2.7B: `PRESETS`, the five sizes every
2025 sweep runs. The 2026 table renames the 2025 "2.7B" to "xl" and adds "10B"; `EDITION_SIZES`
maps each edition's names to our presets (a 2026 "xl" is our `2.7B`), and `edition_presets("2026")`
is the list a 2026 sweep runs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace


@dataclass(frozen=True)
class ModelConfig:
    """Hyperparameters of the Transformer LM; field order matches TransformerLM's constructor."""

    vocab_size: int = 10_000
    context_length: int = 512
    d_model: int = 768
    num_layers: int = 12
    num_heads: int = 12
    d_ff: int = 3072
    rope_theta: float = 10_000.0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "context_length", "d_model", "num_layers", "num_heads", "d_ff"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by num_heads ({self.num_heads})")
        if (self.d_model // self.num_heads) % 2:
            raise ValueError(f"head dim d_model/num_heads = {self.d_model // self.num_heads} must be even for RoPE")

    @property
    def d_head(self) -> int:
        return self.d_model // self.num_heads

    def with_context(self, context_length: int) -> "ModelConfig":
        return replace(self, context_length=context_length)

    def as_dict(self) -> dict:
        return asdict(self)


# --8<-- [start:presets]
PRESETS: dict[str, ModelConfig] = {
    "small": ModelConfig(d_model=768, d_ff=3072, num_layers=12, num_heads=12),
    "medium": ModelConfig(d_model=1024, d_ff=4096, num_layers=24, num_heads=16),
    "large": ModelConfig(d_model=1280, d_ff=5120, num_layers=36, num_heads=20),
    "xl": ModelConfig(d_model=1600, d_ff=6400, num_layers=48, num_heads=25),
    "2.7B": ModelConfig(d_model=2560, d_ff=10240, num_layers=32, num_heads=32),
}
# --8<-- [end:presets]
# A config small enough for CPU tests and smoke runs of every benchmark.
PRESETS_EXTRA: dict[str, ModelConfig] = {
    "tiny": ModelConfig(vocab_size=512, context_length=64, d_model=64, num_layers=2, num_heads=4, d_ff=256),
    # The 2026 size table's largest (its "10B"; 12.83B parameters by count_parameters: the SwiGLU's
    # three d_ff matrices make it larger than its name). Kept out of PRESETS so the 2025 edition's
    # five-size sweeps and tables stay as they were; the 2026 sweeps take it from EDITION_SIZES.
    "10B": ModelConfig(d_model=4608, d_ff=12288, num_layers=50, num_heads=36),
    # The 2026 leaderboard's model (the course's Config): ~8.13B parameters, untied embedding and
    # LM head. Kept out of PRESETS so the five-size sweeps do not try to build it.
    "8B": ModelConfig(vocab_size=151_936, context_length=32_768, d_model=4_096, num_layers=34,
                      num_heads=32, d_ff=11_008),
}


# --8<-- [start:editions]
# Each edition's size table, in its order: the handout's name -> our preset's name.
EDITION_SIZES: dict[str, dict[str, str]] = {
    "2025": {"small": "small", "medium": "medium", "large": "large", "xl": "xl", "2.7B": "2.7B"},
    "2026": {"small": "small", "medium": "medium", "large": "large", "xl": "2.7B", "10B": "10B"},
}
# --8<-- [end:editions]


def edition_presets(edition: str) -> list[str]:
    """Our preset names for an edition's size table, in the table's order."""
    if edition not in EDITION_SIZES:
        raise ValueError(f"unknown edition {edition!r}; expected one of {', '.join(EDITION_SIZES)}")
    return list(EDITION_SIZES[edition].values())


def handout_name(preset: str, edition: str) -> str:
    """What an edition's handout calls our preset (`2.7B` is the 2026 "xl"); ValueError if its
    table has no such size (the 2025 table has no 10B, the 2026 one no 1600-wide xl)."""
    names = {ours: theirs for theirs, ours in EDITION_SIZES[edition].items()} if edition in EDITION_SIZES else None
    if names is None:
        raise ValueError(f"unknown edition {edition!r}; expected one of {', '.join(EDITION_SIZES)}")
    if preset not in names:
        raise ValueError(f"the {edition} size table has no preset {preset!r}; it has {', '.join(names)}")
    return names[preset]


def get_config(size: str, context_length: int | None = None) -> ModelConfig:
    """Look up a preset by name ('small' ... '2.7B', '10B', or 'tiny'), optionally at another context."""
    table = {**PRESETS, **PRESETS_EXTRA}
    if size not in table:
        raise ValueError(f"unknown model size {size!r}; expected one of {', '.join(table)}")
    cfg = table[size]
    return cfg.with_context(context_length) if context_length is not None else cfg


def count_parameters(cfg: ModelConfig) -> dict[str, int]:
    """Parameter counts by formula (no model built): total and non-embedding.

    'non-embedding' follows the course: total minus the output projection (vocab x d_model).
    """
    d, f, L, V = cfg.d_model, cfg.d_ff, cfg.num_layers, cfg.vocab_size
    per_layer = 4 * d * d + 3 * d * f + 2 * d  # attention q,k,v,o + SwiGLU w1,w2,w3 + two RMSNorms
    total = V * d + L * per_layer + d + V * d  # embedding, layers, final norm, lm_head
    return {"total": total, "non_embedding": total - V * d}


def flops_per_token(cfg: ModelConfig, context_length: int | None = None, training: bool = True) -> float:
    """Model FLOPs per token: 6N + 12·L·d·ctx for a training step (2N + 4·L·d·ctx forward only).

    N is the non-embedding count of the course (total minus lm_head); numerically it equals the
    parameters that do matmul work (layers + lm_head; the embedding is a lookup), because embedding
    and lm_head are both vocab x d_model. The second term is attention's QK^T and PV matmuls,
    causal masking not discounted (the PaLM / nanoGPT convention).
    """
    ctx = context_length or cfg.context_length
    n = count_parameters(cfg)["non_embedding"]
    fwd = 2 * n + 4 * cfg.num_layers * cfg.d_model * ctx
    return 3 * fwd if training else fwd
