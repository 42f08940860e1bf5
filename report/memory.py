"""The memory chapter's numbers (docs/memory.md, docs/memory/checkpointing.md): the 2.7B model's
peaks by context, its snapshots (timeline, largest allocations, residual stream), one block's
residuals, and gradient checkpointing (the strategies modelled, the H200 sweeps over block sizes
and inside a block). Rows: results/memory/; hand counts from the model's code (sharding.accounting).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
import pandas as pd

from cs336_systems.model import count_parameters, get_config
from cs336_systems.profiling import checkpoint_theory as theory
from cs336_systems.profiling.checkpoint_bench import SUBLAYER_BENCH
from cs336_systems.profiling.memory import residual_stream_bytes, thin_max
from cs336_systems.profiling.residuals import block_parameter_bytes, block_residuals
from cs336_systems.sharding.accounting import (
    block_sublayer_bytes,
    branch_backward_bytes,
    transformer_activation_bytes,
)
from report.figures import new_figure
from report.registry import register
from report.results import load_results, markdown_table, newest, ok, provenance_line, source, where, with_source
from report.units import GiB, MiB, near, span

SIZE, BATCH = "2.7B", 4  # the configuration the memory sweep measures: the 2026 handout's xl
KEY = ["context", "mode", "dtype"]
SNAPSHOT_CONTEXT = 512  # the snapshot cells the chapter reads (fp32)
CFG, LAYERS = get_config(SIZE), get_config(SIZE).num_layers
WEIGHTS_MIB = count_parameters(CFG)["total"] * 4 / MiB  # fp32
FFN_WEIGHT_MIB = CFG.d_model * CFG.d_ff * 4 / MiB
BLOCK_GRADIENT_MIB = block_parameter_bytes(CFG) / MiB


# ---- the measured peaks ---------------------------------------------------------------------------

def cells() -> pd.DataFrame:
    """Newest row per (context, mode, dtype), whatever its status (an OOM included)."""
    return newest(load_results("memory/peaks"), KEY).set_index(KEY).sort_index()


def peaks() -> pd.DataFrame:
    """The cells that fit, with the peak above the start."""
    m = cells().query("status == 'ok'")
    return m.assign(extra_mib=m.peak_mib - m.before_mib)


def peak(context: int, mode: str, dtype: str = "fp32", column: str = "peak_mib") -> float:
    return float(peaks().loc[(context, mode, dtype), column])


def extra(context: int, mode: str, dtype: str = "fp32") -> float:
    return peak(context, mode, dtype, "extra_mib")


def oom_2048(dtype: str = "fp32") -> pd.Series:
    """The training step at context 2,048, out of memory: what was held, the request, the capacity."""
    return cells().loc[(2048, "train", dtype)]


def resident_mib(context: int) -> float:
    """What the model holds before a forward at this context (weights and buffers), measured."""
    return peak(context, "forward", "fp32", "before_mib")


def activations_mib(context: int) -> float:
    """What a whole fp32 forward saves for the backward, counted from the code (sharding.accounting)."""
    return transformer_activation_bytes(get_config(SIZE, context), BATCH, context) / MiB


def blocks_saved_at_oom() -> float:
    """Blocks' residuals the failed fp32 step held above the resident model when its request failed."""
    return (oom_2048().peak_mib_at_oom - resident_mib(2048)) / (block_saved(2048)["bytes"].sum() / MiB)


def peaks_table() -> str:
    """(b): two numbers per context (forward, full step), in fp32 and bf16; OOM where it did not fit."""
    m = cells()
    text = lambda r: f"{r.peak_mib:,.0f}" if r.status == "ok" else r.status.upper()
    rows = [{"context": ctx, **{f"{label}, {dt} (MiB)": text(m.loc[(ctx, mode, dt)])
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

def autocast_cache_mib() -> float:
    """bf16 copies of the weights autocast casts: everything but the embedding and the norms' gains."""
    linear = count_parameters(CFG)["total"] - CFG.vocab_size * CFG.d_model - (2 * LAYERS + 1) * CFG.d_model
    return 2 * linear / MiB


def tensor_sizes_mib(context: int = 512) -> dict[str, float]:
    """The model's large tensors at this context, fp32: score matrix, SwiGLU hidden, logits."""
    return {"score": BATCH * CFG.num_heads * context * context * 4 / MiB,
            "ffn_hidden": BATCH * context * CFG.d_ff * 4 / MiB, "logits": BATCH * context * CFG.vocab_size * 4 / MiB}


def residual_mib(context: int) -> float:
    return residual_stream_bytes(BATCH, context, CFG.d_model, 4) / MiB


# ---- the snapshot: the timeline, the largest allocations and the residual stream -------------------

PHASE_COLORS = {"forward": "#dd8452", "backward": "#55a868", "optimizer": "#c44e52"}
DRAWN_POINTS = 500  # enough for a 9-inch figure; the stored series keeps up to 2,000
SNAPSHOT_CELLS = {(128, "forward"), (128, "train"), (512, "forward"), (512, "train"), (2048, "forward")}


def snapshot(bench: str, mode: str, context: int = SNAPSHOT_CONTEXT, dtype: str = "fp32") -> pd.DataFrame:
    """The newest rows of one snapshot cell in one of the snapshot's benches (timeline, largest, residual)."""
    return where(newest(ok(bench), [*KEY, "rank"] if bench == "memory/largest" else KEY),
                 context=context, mode=mode, dtype=dtype)


def timeline_figure(context: int, mode: str, dtype: str = "fp32"):
    """Active memory (GiB) against allocator event, phases shaded, the peak labelled."""
    r = snapshot("memory/timeline", mode, context, dtype).iloc[-1]
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
    ax.set(xlabel="allocator event (alloc or free)", ylabel="active memory (GiB)", ylim=(0, r.peak_gib * 1.12),
           xlim=(0, r.events))
    what = "forward only (inference)" if mode == "forward" else "full training step"
    ax.set_title(f"{SIZE}, context {context:,}, {dtype}, {what}; git {r.git}", fontsize=10)
    if len(r.phases):
        ax.legend(loc="lower right", fontsize=8, ncols=3)
    fig.tight_layout()
    return fig


def largest(mode: str) -> pd.DataFrame:
    return snapshot("memory/largest", mode).sort_values("rank").reset_index(drop=True)


def largest_table(mode: str, n: int = 10) -> str:
    df = largest(mode).head(n)
    shown = pd.DataFrame({"size (MiB)": df.size_mib, "times allocated": df["count"],
                          "allocated at": df["site"].map(lambda s: f"`{s}`"), "phase": df.phases})
    return with_source(shown, "memory/largest", used=df)


def residual(mode: str = "forward"):
    return snapshot("memory/residual", mode).iloc[-1]


def residual_sites_table() -> str:
    r = residual()
    shown = pd.DataFrame([{"allocated at": f"`{site}`", "allocations": n} for site, n in r.sites])
    return with_source(shown, "memory/residual", used=pd.DataFrame([r]))


def residual_adds() -> int:
    """Allocations of one residual-stream size made by the transformer block (its residual adds)."""
    return sum(n for site, n in residual().sites if "transformer.py" in site)


def residual_derivation() -> str:
    """(d): the hand count per context, as a Markdown list of equations."""
    d = CFG.d_model
    return "\n".join(f"- context {ctx}: $4 \\times {ctx} \\times {d} \\times 4 = {residual_stream_bytes(BATCH, ctx, d, 4):,}$ "
                     f"bytes $= {residual_mib(ctx):g}$ MiB" for ctx in (128, 256, 512))


def _largest_forward_as_answered() -> bool:
    """The score matrices first (naive_attention, four per layer), then the SwiGLU hidden, then the logits."""
    sizes, top = tensor_sizes_mib(512), largest("forward")
    first, second, third = list(dict.fromkeys(top.size_mib))[:3]
    score = where(top, size_mib=sizes["score"])
    return (first == sizes["score"] and second == sizes["ffn_hidden"] and abs(third - sizes["logits"]) <= 0.05
            and score["site"].str.contains("naive_attention").all() and score["count"].sum() == 4 * LAYERS)


def _weight_sized_training_buffers() -> bool:
    """Three feed-forward-weight-sized buffers per layer: gradients (backward), AdamW's sqrt(v) (optim.py)."""
    ffn = where(largest("train"), size_mib=FFN_WEIGHT_MIB)
    return (set(ffn.phases) == {"backward", "optimizer"} and (ffn["count"] == 3 * LAYERS).all()
            and where(ffn, phases="optimizer")["site"].str.contains("optim.py").all())


# ---- (f): one block's residuals and gradients ----------------------------------------------------

@functools.cache
def block_saved(context: int) -> pd.DataFrame:
    """What one block saves for its backward, by saving line (autograd's hooks on the meta device)."""
    df = pd.DataFrame(block_residuals(get_config(SIZE, context), BATCH, context))
    return df.assign(share=df["bytes"] / df["bytes"].sum())


def block_saved_table() -> str:
    df = block_saved(2048)
    shown = pd.DataFrame({"saved at": df.site.map(lambda s: f"`{s.removeprefix('cs336_systems/')}`"),
                          "code": df.code.map(lambda c: f"`{c.split('  #')[0]}`"),
                          "tensors": df.tensors, "MiB": df["bytes"] / MiB, "share": df.share})
    return markdown_table(shown, formats={"MiB": ",.0f", "share": ".1%"})


def _three_lines_hold_most() -> bool:
    """softmax, then SwiGLU's three tensors, then the linear layers' four inputs save over 80%; the
    softmax output and the mask grow as T^2 (16x from 512 to 2,048), the rest as T (4x)."""
    df = block_saved(2048)
    ratio = (df.set_index("site")["bytes"] / block_saved(512).set_index("site")["bytes"]).round(3)
    quadratic = [df.site.iloc[0], df[df.code.str.contains("masked_fill")].site.iloc[0]]
    return (list(df.code.head(3).str.extract("(softmax|silu|linear)")[0]) == ["softmax", "silu", "linear"]
            and list(df.tensors.iloc[1:3]) == [3, 4] and df.share.head(3).sum() > 0.8
            and (ratio[quadratic] == 16).all() and (ratio.drop(quadratic) == 4).all())


def backward_fall_gib() -> float:
    """How far active memory falls over the snapshot's backward phase (exact levels the timeline keeps)."""
    r = snapshot("memory/timeline", "train").iloc[-1]
    level = dict(zip((name for name, _ in r.phases), r.phase_gib))
    return level["backward"] - level["optimizer"]


def outside_blocks_mib(context: int = SNAPSHOT_CONTEXT) -> tuple[float, float]:
    """(saved for the backward, gradients) outside the blocks, counted from the code (loss, final norm, embedding)."""
    cfg = get_config(SIZE, context)
    one = dataclasses.replace(cfg, num_layers=1)  # the count for one layer, less that layer
    saved = transformer_activation_bytes(one, BATCH, context) - block_saved(context)["bytes"].sum()
    grads = 4 * count_parameters(cfg)["total"] - cfg.num_layers * block_parameter_bytes(cfg)
    return saved / MiB, grads / MiB


def block_gradient_measured_mib() -> float:
    """One block's gradients G as the measured backward says: it frees everything saved and allocates
    every gradient, so its fall = L A + saved_out - L G - grads_out, solved for G."""
    A = block_saved(SNAPSHOT_CONTEXT)["bytes"].sum() / MiB
    saved_out, grads_out = outside_blocks_mib()
    return (LAYERS * A + saved_out - grads_out - backward_fall_gib() * 1024) / LAYERS


# ---- gradient checkpointing: the model (A, c) and the H200 sweep over block sizes k ----------------

CONTEXT = 2048  # the checkpointing problem's setting: xl (our 2.7B), batch 4, context 2048, fp32
CKPT = get_config(SIZE, CONTEXT)
CHECKPOINT_BYTES = 4 * BATCH * CONTEXT * CKPT.d_model  # c: one segment input, the fp32 residual stream


def block_bytes() -> float:
    """A: bytes autograd saves for one block (the count's difference between 2 layers and 1)."""
    one, two = (dataclasses.replace(CKPT, num_layers=n) for n in (1, 2))
    return transformer_activation_bytes(two, BATCH, CONTEXT) - transformer_activation_bytes(one, BATCH, CONTEXT)


def k_star(A_gib: float) -> float:
    """The continuous optimum sqrt(L c / A) of ceil(L/k) c + k A."""
    return math.sqrt(LAYERS * CHECKPOINT_BYTES / GiB / A_gib)


def no_checkpointing_need_gib() -> float:
    """Parameters and gradients (fp32) plus every saved activation: what k = 0 would hold."""
    return (8 * count_parameters(CKPT)["total"] + transformer_activation_bytes(CKPT, BATCH, CONTEXT)) / GiB


def capacity_gib() -> float:
    """The GPU's capacity as its own out-of-memory message states it (the attention chapter's run)."""
    return float(load_results("attention/oom_checks")["capacity_mib"].dropna().iloc[0]) / 1024


def strategy_table() -> str:
    """Problem (a)'s strategies at the 2026 xl's L, A and c: modelled peak and block forwards."""
    df = pd.DataFrame(theory.strategy_table(LAYERS, block_bytes(), CHECKPOINT_BYTES))
    df["peak_bytes"] = df["peak_bytes"] / GiB
    return markdown_table(df.rename(columns={"memory": "peak memory", "forwards": "block forwards",
                                             "peak_bytes": "peak (GiB, modelled)",
                                             "block_forwards": f"block forwards, L = {LAYERS}"}), floatfmt=".2f")


def _strategies_ordered() -> bool:
    """At our L, A and c, peak memory falls and block forwards grow from none to peel-one (c + A);
    tests/test_checkpointing.py holds the closed forms (N + N(N-1)/2 forwards, binary's N log N)."""
    t = theory.strategy_table(LAYERS, block_bytes(), CHECKPOINT_BYTES)
    peaks, forwards = [r["peak_bytes"] for r in t], [r["block_forwards"] for r in t]
    return (peaks == sorted(peaks, reverse=True) and forwards == sorted(forwards)
            and peaks[-1] == CHECKPOINT_BYTES + block_bytes())


# ---- finer than a block: the attention or feed-forward branch alone, or each (k = 1/2) ----------

HALF, ONE, ATTN, FFN = "each branch (k = 1/2)", "k = 1 (a block)", "attention branch", "feed-forward branch"
PEAKS = ["residual_peak_bytes", "backward_peak_bytes"]  # the two counted peaks: residuals, walked backward


def branch_bytes() -> dict[str, int]:
    """A_attn, A_ffn: what each residual branch of one block saves (its norm included)."""
    return block_sublayer_bytes(CKPT, BATCH, CONTEXT)


def granularity() -> pd.DataFrame:
    """checkpoint_theory.granularity_table at the problem's setting, one row per granularity."""
    A = branch_bytes()
    flops = theory.branch_flops(CKPT.d_model, CKPT.d_ff, CONTEXT, BATCH * CONTEXT)
    return pd.DataFrame(theory.granularity_table(LAYERS, A["attn"], A["ffn"], CHECKPOINT_BYTES,
                                                 working_set=branch_backward_bytes(CKPT, BATCH, CONTEXT),
                                                 flops=flops)).set_index("granularity", drop=False)


def granularity_table_md() -> str:
    df = granularity()
    table = pd.DataFrame({
        "granularity": df["granularity"],
        "peak of the residuals (GiB)": df["residual_peak_bytes"] / GiB,
        "peak of the backward, walked (GiB)": df["backward_peak_bytes"] / GiB,
        "forward recomputed": df["recomputed"].map(lambda x: f"{x:.0%}")})
    return markdown_table(table, floatfmt=".2f") + (
        f"\n\n*Activations only (the parameters, gradients and what lies outside the blocks come on "
        f"top), by formula: `checkpoint_theory.granularity_table` with `accounting.block_sublayer_bytes` "
        f"and `branch_backward_bytes`, for our `{SIZE}` at batch {BATCH}, context {CONTEXT:,}, fp32.*")


def rows() -> pd.DataFrame:
    """The newest row per block size at the handout's setting, in order of k."""
    df = where(load_results("memory/checkpointing"), size=SIZE, batch=BATCH, context=CONTEXT)
    df = newest(df, ["checkpoint_every", "dtype", "attention", "mode"])
    return df.sort_values("checkpoint_every").reset_index(drop=True)


def ok_rows() -> pd.DataFrame:
    return where(rows(), status="ok").reset_index(drop=True)


def block_size_table() -> str:
    df = rows()
    table = pd.DataFrame({
        "k (blocks per segment)": df["checkpoint_every"].map(lambda k: "none" if k == 0 else str(k)),
        "segments": df["checkpoint_every"].map(lambda k: math.ceil(LAYERS / k) if k else 0),
        "status": df["status"], "peak (GiB)": df["peak_mem_gib"], "allocated at the cell's start (GiB)": df["params_gib"],
        "saved after forward (GiB)": df["saved_after_forward_gib"], "step (s)": df["median_ms"] / 1e3})
    return with_source(table, "memory/checkpointing", used=df, floatfmt=".2f")


def measured_block_gib() -> float:
    """A from the measurements: the slope, in k, of the peak minus ceil(L/k) c."""
    df = ok_rows()
    k = df["checkpoint_every"].to_numpy(float)
    return float(np.polyfit(k, df["peak_mem_gib"] - np.ceil(LAYERS / k) * CHECKPOINT_BYTES / GiB, 1)[0])


def best() -> pd.Series:
    return ok_rows().loc[ok_rows()["peak_mem_gib"].idxmin()]


def peak_figure():
    """Measured peak per block size, the capacity, and the cells that ran out of memory."""
    df, cap = rows(), capacity_gib()
    good, bad = where(df, status="ok"), where(df, status="oom")
    fig, ax = new_figure(7.0, 3.6)
    ax.plot(good["checkpoint_every"], good["peak_mem_gib"], "o-", label="allocator peak, forward + backward")
    ax.axhline(cap, color="grey", linestyle=":", linewidth=1, label="the H200's capacity")
    ax.plot(bad["checkpoint_every"], [cap] * len(bad), "x", color="C3", markersize=10, label="out of memory")
    ax.set_xscale("symlog", base=2, linthresh=1)
    ks = sorted(df["checkpoint_every"].unique())
    ax.set_xticks(ks, ["none" if k == 0 else str(k) for k in ks])
    ax.set(xlabel="k: blocks per checkpointed segment", ylabel="peak memory (GiB)", ylim=(0, cap * 1.1))
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(0.02, 0.62))
    return fig


# ---- finer than a block, measured: the sub-block cells beside k = 0, 1, 2 ---------------------------

def sublayer_rows() -> pd.DataFrame:
    """The newest row per sub-block granularity at the handout's setting, indexed by it."""
    df = where(load_results(SUBLAYER_BENCH), size=SIZE, batch=BATCH, context=CONTEXT)
    return newest(df, ["sublayers", "dtype", "attention", "mode"]).set_index("sublayers")


def measured_granularity() -> pd.DataFrame:
    """k = 0, 1, 2 (the block-size sweep) and the three sub-block cells, with the share each recomputes."""
    blocks = rows().set_index("checkpoint_every")
    picked = [(name, blocks.loc[k]) for k, name in ((0, "none"), (1, ONE), (2, "k = 2"))]
    picked += [({"attn": ATTN, "ffn": FFN, "attn+ffn": HALF}[g], r) for g, r in sublayer_rows().iterrows()]
    recomputed = {**granularity()["recomputed"], "k = 2": 1.0}
    return pd.DataFrame([{"checkpointed": name, "status": {"ok": "ran", "oom": "out of memory"}[r.status],
                          "peak (GiB)": r.peak_mem_gib, "saved after forward (GiB)": r.saved_after_forward_gib,
                          "step (s)": r.median_ms / 1e3, "forward recomputed": f"{recomputed[name]:.0%}"}
                         for name, r in picked]).set_index("checkpointed", drop=False)


def measured_granularity_table() -> str:
    blocks = rows()
    return (markdown_table(measured_granularity(), floatfmt=".2f") + "\n\n"
            + provenance_line(blocks[blocks["checkpoint_every"] <= 2], source("memory/checkpointing")) + "\n\n"
            + provenance_line(sublayer_rows(), source(SUBLAYER_BENCH)))


def _g(name: str, column: str) -> float:
    """One measured cell's peak, saved or step column (the table's headers without their unit)."""
    return float(measured_granularity().loc[name, {"peak": "peak (GiB)", "saved": "saved after forward (GiB)",
                                                   "step": "step (s)"}[column]])


def _half_block_ties_one_block() -> bool:
    """k = 1/2 saves more yet peaks where k = 1 does (to 0.01 GiB), in its time (2%): a block's gradients
    outweigh its inputs, so both peak in the last attention backward (weights, gradients, its residuals
    and working set, one input: within 10%)."""
    A, W = branch_bytes(), branch_backward_bytes(CKPT, BATCH, CONTEXT)
    at_end = (8 * count_parameters(CKPT)["total"] + A["attn"] + W["attn"] + CHECKPOINT_BYTES) / GiB
    return (_g(HALF, "saved") > _g(ONE, "saved") and abs(_g(HALF, "peak") - _g(ONE, "peak")) < 0.01
            and near(_g(HALF, "step"), _g(ONE, "step"), 0.02) and block_parameter_bytes(CKPT) > 2 * CHECKPOINT_BYTES
            and A["attn"] + W["attn"] > A["attn"] + A["ffn"] + W["ffn"]
            and all(near(_g(g, "peak"), at_end, 0.10) for g in (HALF, ONE)))


_mib = lambda x: f"{x:,.0f}"
_gib = lambda x: f"{x / GiB:.2f}"

register(
    "memory",
    facts={
        "params_b": lambda: f"{count_parameters(CFG)['total'] / 1e9:.2f}",
        "weights_mib": lambda: _mib(WEIGHTS_MIB), "four_copies_mib": lambda: _mib(4 * WEIGHTS_MIB),
        "train_peak_512_mib": lambda: _mib(peak(512, "train")),
        "train_peak_512_bf16_mib": lambda: _mib(peak(512, "train", "bf16")),
        "train_peak_128_mib": lambda: _mib(peak(128, "train")),
        "fwd_peak_mib": lambda: span(peaks().xs(("forward", "fp32"), level=("mode", "dtype")).peak_mib, ",.0f"),
        "fwd_peak_512_mib": lambda: _mib(peak(512, "forward")),
        "fwd_peak_512_bf16_mib": lambda: _mib(peak(512, "forward", "bf16")),
        "fwd_extra_128_bf16_mib": lambda: _mib(extra(128, "forward", "bf16")),
        "block_saved_2048_gib": lambda: _gib(block_saved(2048)["bytes"].sum()),
        "block_top3_share": lambda: f"{block_saved(2048).share.head(3).sum():.0%}",
        "block_softmax_share": lambda: f"{block_saved(2048).share.iloc[0]:.0%}",
        "block_saved_512_mib": lambda: _mib(block_saved(512)["bytes"].sum() / MiB),
        "block_grad_mib": lambda: _mib(BLOCK_GRADIENT_MIB),
        "backward_fall_gib": lambda: f"{backward_fall_gib():.2f}",
        "outside_saved_mib": lambda: _mib(outside_blocks_mib()[0]),
        "outside_grads_mib": lambda: _mib(outside_blocks_mib()[1]),
        "block_grad_measured_mib": lambda: _mib(block_gradient_measured_mib()),
        "train_2048_blocks_at_oom": lambda: int(blocks_saved_at_oom()),
        "train_2048_tried_mib": lambda: _mib(oom_2048().tried_mib),
        "capacity_mib": lambda: _mib(oom_2048().capacity_mib),
        "resident_2048_mib": lambda: _mib(resident_mib(2048)),
        "activations_2048_mib": lambda: _mib(activations_mib(2048)),
        "first_step_2048_need_mib": lambda: _mib(resident_mib(2048) + activations_mib(2048)),
        "score_2048_layers_gib": lambda: f"{tensor_sizes_mib(2048)['score'] * LAYERS / 1024:g}",
        # how far the context-512 training timeline starts below the allocator's counter
        "timeline_offset_mib": lambda: _mib(peak(512, "train", "fp32", "before_mib")
                                            - peak(512, "train", "fp32", "timeline_start_gib") * 1024),
        "ffn_weight_mib": lambda: f"{FFN_WEIGHT_MIB:g}",
        "autocast_cache_mib": lambda: _mib(autocast_cache_mib()),
        "residual_512_allocations": lambda: int(residual().allocations_of_that_size),
        "residual_adds": residual_adds, "residual_128_mib": lambda: f"{residual_mib(128):g}",
        "residual_128_bytes": lambda: f"{residual_stream_bytes(BATCH, 128, CFG.d_model, 4):,}",
        "residual_512_mib": lambda: f"{residual_mib(512):g}",
        "score_mib": lambda: f"{tensor_sizes_mib()['score']:g}",
        "ffn_hidden_mib": lambda: f"{tensor_sizes_mib()['ffn_hidden']:g}",
        "logits_mib": lambda: f"{tensor_sizes_mib()['logits']:.1f}",
        # checkpointing.md
        "ckpt_layers": lambda: LAYERS, "ckpt_capacity_gib": lambda: f"{capacity_gib():.1f}",
        "ckpt_none_need_gib": lambda: f"{no_checkpointing_need_gib():.0f}",
        "ckpt_a_count_gib": lambda: _gib(block_bytes()),
        "ckpt_c_mib": lambda: f"{CHECKPOINT_BYTES / MiB:.0f}",
        "ckpt_k_star_count": lambda: f"{k_star(block_bytes() / GiB):.2f}",
        "ckpt_binary_forwards": lambda: theory.nested_forwards(LAYERS, "binary"),
        "ckpt_peel_forwards": lambda: theory.nested_forwards(LAYERS, "peel"),
        "ckpt_k_best": lambda: int(best()["checkpoint_every"]),
        "ckpt_peak_best_gib": lambda: f"{best()['peak_mem_gib']:.1f}",
        "ckpt_warmup": lambda: int(ok_rows()["warmup"].iloc[0]), "ckpt_steps": lambda: int(ok_rows()["steps"].iloc[0]),
        "ckpt_a_measured_gib": lambda: f"{measured_block_gib():.2f}",
        "ckpt_step_spread_pct": lambda: f"{100 * (ok_rows()['median_ms'].max() / ok_rows()['median_ms'].min() - 1):.0f}",
        "ckpt_attn_branch_gib": lambda: _gib(branch_bytes()["attn"]),
        "ckpt_ffn_branch_gib": lambda: _gib(branch_bytes()["ffn"]),
        "ckpt_all_inputs_gib": lambda: _gib(LAYERS * CHECKPOINT_BYTES),
        "ckpt_attn_recomputed": lambda: f"{granularity().loc[ATTN, 'recomputed']:.0%}",
        "ckpt_ffn_recomputed": lambda: f"{granularity().loc[FFN, 'recomputed']:.0%}",
        "ckpt_branch_faster_pct": lambda: f"{100 * (1 - max(_g(ATTN, 'step'), _g(FFN, 'step')) / _g(ONE, 'step')):.0f}",
        "ckpt_grad_per_block_mib": lambda: _mib(block_parameter_bytes(CKPT) / MiB),
        "ckpt_two_inputs_mib": lambda: _mib(2 * CHECKPOINT_BYTES / MiB),
    },
    tables={
        "peaks": peaks_table, "start": start_table, "residual_derivation": residual_derivation,
        "residual_sites": residual_sites_table, "largest_forward": lambda: largest_table("forward", 8),
        "largest_train": lambda: largest_table("train"), "block_saved": block_saved_table,
        "ckpt_strategies": strategy_table, "ckpt_block_sizes": block_size_table,
        "ckpt_granularity": granularity_table_md, "ckpt_granularity_measured": measured_granularity_table,
    },
    figures={
        **{f"timeline_{context}_{mode}": functools.partial(timeline_figure, context, mode)
           for context, mode in ((128, "train"), (128, "forward"), (512, "train"), (512, "forward"), (2048, "forward"))},
        "ckpt_peaks": peak_figure,
    },
    claims={
        # (a): weights, gradients and two moments; the rest is small buffers (under 2%)
        "training_starts_from_four_copies": lambda: all(
            near(peak(512, "train", dt, "before_mib"), 4 * WEIGHTS_MIB, 0.02) for dt in ("fp32", "bf16")),
        # the (context, mode) cells with a stored fp32 timeline
        "snapshot_cells_as_listed": lambda: set(where(ok("memory/timeline"), dtype="fp32")[["context", "mode"]]
                                                .itertuples(index=False, name=None)) == SNAPSHOT_CELLS,
        # up to 512: the weights (within 2%) plus under 5% of them, growing with the context
        "inference_adds_little": lambda: near(resident_mib(512), WEIGHTS_MIB, 0.02)
        and extra(128, "forward") < extra(256, "forward") < extra(512, "forward") < 0.05 * WEIGHTS_MIB,
        "short_contexts_peak_at_the_optimizer_temporary": lambda: all(
            near(extra(c, "train"), FFN_WEIGHT_MIB, 0.02) for c in (128, 256)),
        "activations_set_the_512_peak": lambda: extra(512, "train") > 10 * FFN_WEIGHT_MIB,
        "inference_extra_at_2048_is_the_scores": lambda: extra(2048, "forward") > 10 * extra(512, "forward")
        and extra(2048, "forward") > tensor_sizes_mib(2048)["score"],
        "forward_fits_at_2048_training_does_not": lambda: all(
            peak(2048, "forward", dt) < oom_2048().capacity_mib and oom_2048(dt).status == "oom" for dt in ("fp32", "bf16")),
        "activations_nearly_fill_the_gpu": lambda: 0.9 < activations_mib(2048) / oom_2048().capacity_mib < 1,
        # 30.x blocks saved: the first forward (a steady-state step, 3 copies more, would fail before block 26)
        "first_step_cannot_fit": lambda: resident_mib(2048) + activations_mib(2048) > oom_2048().capacity_mib
        and 29 < blocks_saved_at_oom() < 32,
        "failed_request_was_one_score_matrix": lambda: CFG.num_heads == CFG.num_layers == 32 and all(
            oom_2048(dt).tried_mib == tensor_sizes_mib(2048)["score"] for dt in ("fp32", "bf16")),
        "bf16_raises_every_peak": lambda: all(
            r.extra_mib > extra(c, m) for (c, m, dt), r in peaks().iterrows() if dt == "bf16"),
        "bf16_training_peak_like_fp32": lambda: all(near(peak(c, "train", "bf16"), peak(c, "train"), 0.05) for c in (128, 256, 512)),
        "bf16_inference_peak_higher": lambda: all(
            peak(c, "forward", "bf16") > peak(c, "forward") for c in (128, 256, 512, 2048)),
        "bf16_extra_is_the_weight_cache": lambda: near(extra(128, "forward", "bf16"), autocast_cache_mib(), 0.02),
        "cache_lifts_the_256_training_peak": lambda: extra(256, "train", "bf16") > 2 * extra(256, "train"),
        "residual_adds_allocate_the_stream": lambda: residual().expected_mib == residual_mib(512)
        and residual_adds() == 2 * LAYERS and residual().allocations_of_that_size > residual_adds(),
        "largest_forward_are_scores_swiglu_logits": _largest_forward_as_answered,
        "training_adds_weight_sized_buffers": _weight_sized_training_buffers,
        "three_lines_hold_most_of_a_block": _three_lines_hold_most,
        # to 0.1 MiB a block: all the count leaves out is the loss scalar and its gradient (bytes to KiB)
        "measured_backward_gives_the_gradients": lambda: abs(block_gradient_measured_mib() - BLOCK_GRADIENT_MIB) < 0.1,
        "block_count_is_checkpointings_a": lambda: block_saved(2048)["bytes"].sum() == block_bytes(),
        # checkpointing.md
        "the_2026_xl_is_our_2_7b": lambda: (CKPT.d_model, CKPT.d_ff, CKPT.num_layers, CKPT.num_heads) == (2560, 10240, 32, 32)
        and tuple(getattr(get_config("xl"), f) for f in ("d_model", "d_ff", "num_layers", "num_heads")) == (1600, 6400, 48, 25),
        "peel_is_least_memory_most_forwards": _strategies_ordered,
        "k_star_below_one": lambda: block_bytes() > 10 * CHECKPOINT_BYTES and k_star(block_bytes() / GiB) < 1
        and k_star(measured_block_gib()) < 1
        and theory.best_block_size(LAYERS, block_bytes(), CHECKPOINT_BYTES)["k_best"] == 1 == int(best()["checkpoint_every"]),
        # the least peak of every k that ran, and no checkpointing (k = 0) ran out of memory
        "best_and_its_neighbours": lambda: where(rows(), checkpoint_every=0)["status"].tolist() == ["oom"]
        and best()["peak_mem_gib"] < where(ok_rows(), checkpoint_every=2)["peak_mem_gib"].iloc[0],
        "no_checkpointing_cannot_fit": lambda: no_checkpointing_need_gib() > capacity_gib(),
        # agreement within 15% (either value puts k* below 1)
        "measured_a_matches_the_count": lambda: near(measured_block_gib(), block_bytes() / GiB, 0.15),
        "saved_shrinks_peak_grows": lambda: ok_rows()["saved_after_forward_gib"].is_monotonic_decreasing
        and ok_rows()["peak_mem_gib"].is_monotonic_increasing,
        "one_segment_runs_out_of_memory": lambda: rows().iloc[-1][["checkpoint_every", "status"]].tolist()
        == [LAYERS, "oom"],
        "step_time_ignores_k": lambda: ok_rows()["median_ms"].max() / ok_rows()["median_ms"].min() - 1 < 0.10,
        "branches_add_to_a_block": lambda: sum(branch_bytes().values()) == block_bytes(),
        # min(A_attn, A_ffn) < L c, so half blocks peak above k = 1, by count and walked
        "half_block_peaks_above_one_block": lambda: min(branch_bytes().values()) < LAYERS * CHECKPOINT_BYTES
        and (granularity().loc[HALF, PEAKS] > granularity().loc[ONE, PEAKS]).all(),
        # each branch alone keeps the other's residuals: over five times k = 1's peak, by count and walked
        "one_branch_keeps_the_other": lambda: (granularity().loc[[ATTN, FFN], PEAKS]
                                               > 5 * granularity().loc[ONE, PEAKS]).all(axis=None),
        "half_block_ties_one_block": _half_block_ties_one_block,
        # each branch alone fits at over twice k = 1's peak, over 5% faster, the two within 1% of each other
        "one_branch_is_faster_at_twice_the_memory": lambda: all(
            2 * _g(ONE, "peak") < _g(b, "peak") < capacity_gib() and _g(b, "step") < 0.95 * _g(ONE, "step")
            for b in (ATTN, FFN)) and near(_g(ATTN, "step"), _g(FFN, "step"), 0.01),
        # within 0.1 GiB, far below one block's residuals (a leaked graph of a forward is GiBs)
        "every_cell_starts_alike": lambda: ok_rows()["params_gib"].max() - ok_rows()["params_gib"].min() < 0.1
        and ok_rows()["warmup"].nunique() == 1 and ok_rows()["steps"].nunique() == 1,
    },
)
