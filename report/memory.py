"""The memory chapter: peaks of the 2.7B model by context, the snapshot's largest allocations, and the
residual-stream check, from results/memory/; the hand counts from the model's config.
"""

from __future__ import annotations

import dataclasses
import functools

import pandas as pd

from cs336_systems.model import count_parameters, get_config
from cs336_systems.profiling.memory import residual_stream_bytes, thin_max
from cs336_systems.profiling.residuals import block_parameter_bytes, block_residuals
from cs336_systems.sharding.accounting import transformer_activation_bytes
from report.facts import register
from report.figures import new_figure
from report.results import load_results, markdown_table, newest, ok, with_source

MiB = 2**20
SIZE, BATCH = "2.7B", 4  # the configuration the memory sweep measures
KEY = ["context", "mode", "dtype"]


# ---- the measured peaks ---------------------------------------------------------------------------

def cells() -> pd.DataFrame:
    """Newest row per (context, mode, dtype), whatever its status (an OOM included)."""
    return newest(load_results("memory/peaks"), KEY).set_index(KEY).sort_index()


def peaks() -> pd.DataFrame:
    """The cells that fit (newest row each), with the peak above the start."""
    m = cells()
    m = m[m.status == "ok"]
    return m.assign(extra_mib=m.peak_mib - m.before_mib)


def peak(context: int, mode: str, dtype: str, column: str = "peak_mib") -> float:
    return float(peaks().loc[(context, mode, dtype), column])


def oom(context: int, mode: str, dtype: str) -> pd.Series:
    """An out-of-memory cell's row: what the allocator held when the request failed, and the request."""
    r = cells().loc[(context, mode, dtype)]
    if r.status != "oom":
        raise ValueError(f"memory/peaks: {context}/{mode}/{dtype} is {r.status}, not an OOM")
    return r


def _peak_text(r: pd.Series) -> str:
    return f"{r.peak_mib:,.0f}" if r.status == "ok" else r.status.upper()


def resident_mib(context: int) -> float:
    """What the model holds before a forward at this context (weights and buffers), measured."""
    return peak(context, "forward", "fp32", "before_mib")


def activations_mib(context: int) -> float:
    """What a whole fp32 forward saves for the backward, counted from the code (sharding.accounting)."""
    return transformer_activation_bytes(get_config(SIZE, context), BATCH, context) / MiB


def blocks_saved_at_oom(context: int = 2048) -> float:
    """How many blocks' residuals the failed fp32 training step had saved when its request failed:
    the high-water mark above the resident model, in blocks (the steps start without gradients)."""
    return (oom(context, "train", "fp32").peak_mib_at_oom - resident_mib(context)) / (block_saved(context)["bytes"].sum() / MiB)


def peaks_table() -> str:
    """(b): two numbers per context (forward, full step), in fp32 and bf16; OOM where it did not fit."""
    m = cells()
    rows = [{"context": ctx, **{f"{label}, {dt} (MiB)": _peak_text(m.loc[(ctx, mode, dt)])
                                for mode, label in (("forward", "forward only"), ("train", "full step"))
                                for dt in ("fp32", "bf16")}}
            for ctx in sorted(m.index.get_level_values("context").unique())]
    return with_source(pd.DataFrame(rows), "memory/peaks", used=m, formats={"context": ","})


def start_table() -> str:
    """What was allocated before the step, the peak above it, and the allocator's reserved peak."""
    m = peaks().reset_index().sort_values(["mode", "dtype", "context"], ascending=[True, False, True])
    shown = m[["mode", "dtype", "context", "before_mib", "peak_mib", "extra_mib", "peak_reserved_mib"]].rename(
        columns={"before_mib": "allocated before (MiB)", "peak_mib": "peak (MiB)",
                 "extra_mib": "peak - before (MiB)", "peak_reserved_mib": "reserved peak (MiB)"})
    return with_source(shown, "memory/peaks", used=m, floatfmt=",.0f")


# ---- the hand counts --------------------------------------------------------------------------------

def weights_mib() -> float:
    return count_parameters(get_config(SIZE))["total"] * 4 / MiB


def ffn_weight_mib() -> float:
    cfg = get_config(SIZE)
    return cfg.d_model * cfg.d_ff * 4 / MiB


def autocast_cache_mib() -> float:
    """bf16 copies of the weights autocast casts: everything but the embedding and the norms' gains."""
    cfg = get_config(SIZE)
    n = count_parameters(cfg)["total"]
    linear = n - cfg.vocab_size * cfg.d_model - (2 * cfg.num_layers + 1) * cfg.d_model
    return 2 * linear / MiB


def tensor_sizes_mib(context: int = 512) -> dict[str, float]:
    """The model's large tensors at this context, fp32: score matrix, SwiGLU hidden, logits, weights."""
    cfg = get_config(SIZE)
    return {"score": BATCH * cfg.num_heads * context * context * 4 / MiB,
            "ffn_hidden": BATCH * context * cfg.d_ff * 4 / MiB,
            "logits": BATCH * context * cfg.vocab_size * 4 / MiB,
            "ffn_weight": ffn_weight_mib(), "embedding": cfg.vocab_size * cfg.d_model * 4 / MiB}


# ---- the snapshot: the timeline, the largest allocations and the residual stream -------------------

PHASE_COLORS = {"forward": "#dd8452", "backward": "#55a868", "optimizer": "#c44e52"}
DRAWN_POINTS = 500  # enough for a 9-inch figure; the stored series keeps up to 2,000


def timeline_row(context: int, mode: str, dtype: str = "fp32") -> pd.Series:
    """The stored active-memory series of one snapshot cell (the newest)."""
    t = newest(ok("memory/timeline"), KEY)
    hit = t[(t.context == context) & (t["mode"] == mode) & (t.dtype == dtype)]
    if hit.empty:
        raise KeyError(f"memory/timeline: no timeline of {context}/{mode}/{dtype}; `just bench memory "
                       f"--contexts {context} --modes {mode} --dtypes {dtype} --snapshot-cells "
                       f"{context}/{mode}/{dtype} --remeasure` records one")
    return hit.iloc[-1]


def timeline_figure(context: int, mode: str, dtype: str = "fp32"):
    """Active memory (GiB) against allocator event, phases shaded, the peak labelled."""
    r = timeline_row(context, mode, dtype)
    starts, gib = thin_max(r.gib, DRAWN_POINTS)  # a page-sized path: the highest of each run
    event = [r.event[i] for i in starts]
    fig, ax = new_figure(9, 3.6)
    ax.fill_between(event, gib, step="post", color="#4c72b0", alpha=0.8, linewidth=0)
    bounds = [*map(tuple, r.phases), ("end", r.events)]
    for (name, start), (_, stop) in zip(bounds, bounds[1:]):
        ax.axvspan(start, stop, color=PHASE_COLORS.get(name, "#999999"), alpha=0.15, label=name)
    i = max(range(len(gib)), key=gib.__getitem__)
    left = event[i] < r.events / 2  # the label on the side with room, inside the axes
    ax.annotate(f"peak {gib[i]:.1f} GiB", (event[i], gib[i]), textcoords="offset points",
                xytext=(10 if left else -10, -14), ha="left" if left else "right", fontsize=8)
    ax.set_xlabel("allocator event (alloc or free)")
    ax.set_ylabel("active memory (GiB)")
    ax.set_ylim(0, r.peak_gib * 1.12)
    ax.set_xlim(0, r.events)
    what = "forward only (inference)" if mode == "forward" else "full training step"
    ax.set_title(f"{SIZE}, context {context:,}, {dtype}, {what}; git {r.git}", fontsize=10)
    if len(r.phases):
        ax.legend(loc="lower right", fontsize=8, ncols=3)
    fig.tight_layout()
    return fig



SNAPSHOT_CONTEXT = 512  # the snapshot cells the chapter reads (fp32)


def largest(mode: str, context: int = SNAPSHOT_CONTEXT) -> pd.DataFrame:
    df = newest(ok("memory/largest"), [*KEY, "rank"])
    return df[(df["mode"] == mode) & (df.context == context)].sort_values("rank").reset_index(drop=True)


def largest_table(mode: str, n: int = 10) -> str:
    df = largest(mode).head(n)
    shown = pd.DataFrame({"size (MiB)": df.size_mib, "times allocated": df["count"],
                          "allocated at": df["site"].map(lambda s: f"`{s}`"), "phase": df.phases})
    return with_source(shown, "memory/largest", used=df)


def residual(mode: str = "forward", context: int = SNAPSHOT_CONTEXT):
    r = newest(ok("memory/residual"), KEY)
    return r[(r["mode"] == mode) & (r.context == context)].iloc[-1]


def residual_sites_table(mode: str = "forward") -> str:
    r = residual(mode)
    shown = pd.DataFrame([{"allocated at": f"`{site}`", "allocations": n} for site, n in r.sites])
    return with_source(shown, "memory/residual", used=pd.DataFrame([r]))


def residual_adds(mode: str = "forward") -> int:
    """Allocations of one residual-stream size made by the transformer block (its residual adds)."""
    return sum(n for site, n in residual(mode).sites if "transformer.py" in site)


def residual_derivation() -> str:
    """(d): the hand count per context, as a Markdown list of equations."""
    d = get_config(SIZE).d_model
    return "\n".join(f"- context {ctx}: $4 \\times {ctx} \\times {d} \\times 4 = {residual_stream_bytes(BATCH, ctx, d, 4):,}$ "
                     f"bytes $= {residual_stream_bytes(BATCH, ctx, d, 4) / MiB:g}$ MiB" for ctx in (128, 256, 512))


# ---- facts ---------------------------------------------------------------------------------------------

# ---- (f): one block's residuals and gradients ----------------------------------------------------

@functools.lru_cache
def block_saved(context: int) -> pd.DataFrame:
    """What one 2.7B ("xl") block saves for its backward at batch 4, by saving line (counted by
    autograd's hooks on the meta device: no GPU, no data)."""
    df = pd.DataFrame(block_residuals(get_config(SIZE, context), BATCH, context))
    return df.assign(share=df["bytes"] / df["bytes"].sum())


def block_saved_table(context: int = 2048) -> str:
    df = block_saved(context)
    shown = pd.DataFrame({"saved at": df.site.map(lambda s: f"`{s.removeprefix('cs336_systems/')}`"),
                          "code": df.code.map(lambda c: f"`{c.split('  #')[0]}`"),
                          "tensors": df.tensors, "MiB": df["bytes"] / MiB, "share": df.share})
    return markdown_table(shown, formats={"MiB": ",.0f", "share": ".1%"})


def block_gradient_mib() -> float:
    return block_parameter_bytes(get_config(SIZE)) / MiB


def backward_fall_gib(context: int = SNAPSHOT_CONTEXT) -> float:
    """How far active memory falls over the measured backward phase: the exact level where it
    starts minus the level where the optimizer step starts (the stored timeline keeps both)."""
    r = timeline_row(context, "train")
    level = dict(zip((name for name, _ in r.phases), r.phase_gib))
    return level["backward"] - level["optimizer"]


def outside_blocks_mib(context: int = SNAPSHOT_CONTEXT) -> tuple[float, float]:
    """(saved for the backward, gradients) outside the blocks, counted from the code: the loss's
    logits and log-sum-exp, the final norm and the token ids; the embedding, output layer and final
    norm gain."""
    cfg = get_config(SIZE, context)
    one = dataclasses.replace(cfg, num_layers=1)  # the count for one layer, less that layer
    saved = transformer_activation_bytes(one, BATCH, context) - block_saved(context)["bytes"].sum()
    grads = 4 * count_parameters(cfg)["total"] - cfg.num_layers * block_parameter_bytes(cfg)
    return saved / MiB, grads / MiB


def block_gradient_measured_mib(context: int = SNAPSHOT_CONTEXT) -> float:
    """One block's gradients as the measured backward says. The backward frees everything saved
    (L blocks' residuals A, and the outside terms) and allocates every gradient (L blocks' G, and
    the outside ones): fall = L A + saved_out - L G - grads_out, solved for G."""
    L = get_config(SIZE).num_layers
    A = block_saved(context)["bytes"].sum() / MiB
    saved_out, grads_out = outside_blocks_mib(context)
    return (L * A + saved_out - grads_out - backward_fall_gib(context) * 1024) / L


def _mib(x: float) -> str:
    return f"{x:,.0f}"


FACTS = {
    "memory.params_b": lambda: f"{count_parameters(get_config(SIZE))['total'] / 1e9:.2f}",
    "memory.weights_mib": lambda: _mib(weights_mib()),
    "memory.four_copies_mib": lambda: _mib(4 * weights_mib()),
    "memory.train_before_mib": lambda: _mib(peak(512, "train", "fp32", "before_mib")),
    "memory.train_peak_512_mib": lambda: _mib(peak(512, "train", "fp32")),
    "memory.train_peak_512_bf16_mib": lambda: _mib(peak(512, "train", "bf16")),
    "memory.train_extra_512_mib": lambda: _mib(peak(512, "train", "fp32", "extra_mib")),
    "memory.train_extra_128_mib": lambda: _mib(peak(128, "train", "fp32", "extra_mib")),
    "memory.train_extra_256_mib": lambda: _mib(peak(256, "train", "fp32", "extra_mib")),
    "memory.train_extra_256_bf16_mib": lambda: _mib(peak(256, "train", "bf16", "extra_mib")),
    "memory.fwd_before_mib": lambda: _mib(peak(512, "forward", "fp32", "before_mib")),
    "memory.fwd_other_mib": lambda: _mib(peak(512, "forward", "fp32", "before_mib") - weights_mib()),
    "memory.fwd_peak_512_mib": lambda: _mib(peak(512, "forward", "fp32")),
    "memory.fwd_peak_512_bf16_mib": lambda: _mib(peak(512, "forward", "bf16")),
    "memory.fwd_extra_mib": lambda: ", ".join(_mib(peak(c, "forward", "fp32", "extra_mib")) for c in (128, 256))
    + " and " + _mib(peak(512, "forward", "fp32", "extra_mib")),
    "memory.fwd_extra_128_bf16_mib": lambda: _mib(peak(128, "forward", "bf16", "extra_mib")),
    "memory.fwd_extra_128_mib": lambda: _mib(peak(128, "forward", "fp32", "extra_mib")),
    "memory.fwd_peak_2048_mib": lambda: _mib(peak(2048, "forward", "fp32")),
    "memory.fwd_peak_128_mib": lambda: _mib(peak(128, "forward", "fp32")),
    "memory.block_saved_2048_gib": lambda: f"{block_saved(2048)['bytes'].sum() / 2**30:.2f}",
    "memory.block_top3_share": lambda: f"{block_saved(2048).share.head(3).sum():.0%}",
    "memory.block_tie_mib": lambda: _mib(block_saved(2048)["bytes"].iloc[3] / MiB),
    "memory.block_softmax_share": lambda: f"{block_saved(2048).share.iloc[0]:.0%}",
    "memory.block_saved_512_mib": lambda: _mib(block_saved(512)["bytes"].sum() / MiB),
    "memory.block_grad_mib": lambda: _mib(block_gradient_mib()),
    "memory.backward_fall_gib": lambda: f"{backward_fall_gib():.2f}",
    "memory.outside_saved_mib": lambda: _mib(outside_blocks_mib()[0]),
    "memory.outside_grads_mib": lambda: _mib(outside_blocks_mib()[1]),
    "memory.block_grad_measured_mib": lambda: _mib(block_gradient_measured_mib()),
    "memory.train_peak_128_mib": lambda: _mib(peak(128, "train", "fp32")),
    "memory.fwd_extra_2048_mib": lambda: _mib(peak(2048, "forward", "fp32", "extra_mib")),
    "memory.fwd_peak_2048_bf16_mib": lambda: _mib(peak(2048, "forward", "bf16")),
    "memory.train_2048_peak_at_oom_mib": lambda: _mib(oom(2048, "train", "fp32").peak_mib_at_oom),
    "memory.train_2048_blocks_at_oom": lambda: f"{int(blocks_saved_at_oom())}",
    "memory.resident_2048_mib": lambda: _mib(resident_mib(2048)),
    "memory.activations_2048_mib": lambda: _mib(activations_mib(2048)),
    "memory.first_step_2048_need_mib": lambda: _mib(resident_mib(2048) + activations_mib(2048)),
    "memory.steady_step_2048_need_mib": lambda: _mib(resident_mib(2048) + 3 * weights_mib() + activations_mib(2048)),
    "memory.bf16_extra_128_train_gap_mib": lambda: f"{peak(128, 'train', 'bf16', 'extra_mib') - peak(128, 'train', 'fp32', 'extra_mib'):.1f}",
    "memory.train_2048_tried_mib": lambda: _mib(oom(2048, "train", "fp32").tried_mib),
    "memory.capacity_mib": lambda: _mib(oom(2048, "train", "fp32").capacity_mib),
    "memory.score_2048_layers_gib": lambda: f"{tensor_sizes_mib(2048)['score'] * get_config(SIZE).num_layers / 1024:g}",
    "memory.timeline_offset_mib": lambda: _mib(peak(512, "train", "fp32", "before_mib")
                                               - peak(512, "train", "fp32", "timeline_start_gib") * 1024),
    "memory.ffn_weight_mib": lambda: f"{ffn_weight_mib():g}",
    "memory.autocast_cache_mib": lambda: _mib(autocast_cache_mib()),
    "memory.residual_512_allocations": lambda: str(int(residual().allocations_of_that_size)),
    "memory.residual_adds": lambda: str(residual_adds()),
    "memory.residual_adds_per_layer": lambda: str(residual_adds() // get_config(SIZE).num_layers),
    "memory.residual_128_bytes": lambda: f"{residual_stream_bytes(BATCH, 128, get_config(SIZE).d_model, 4):,}",
    "memory.residual_128_mib": lambda: f"{residual_stream_bytes(BATCH, 128, get_config(SIZE).d_model, 4) / MiB:g}",
    "memory.residual_512_mib": lambda: f"{residual_stream_bytes(BATCH, 512, get_config(SIZE).d_model, 4) / MiB:g}",
    "memory.score_mib": lambda: f"{tensor_sizes_mib()['score']:g}",
    "memory.ffn_hidden_mib": lambda: f"{tensor_sizes_mib()['ffn_hidden']:g}",
    "memory.logits_mib": lambda: f"{tensor_sizes_mib()['logits']:.1f}",
    "memory.embedding_mib": lambda: f"{tensor_sizes_mib()['embedding']:.1f}",
}
register(FACTS)
