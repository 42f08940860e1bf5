"""The memory chapter (docs/memory.md, docs/memory/checkpointing.md): the 2.7B model's peaks, snapshots and
one block's residuals, and gradient checkpointing, modelled and measured. Hand counts come from the model's code.
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
# bf16 copies of the weights autocast casts: everything but the embedding and the norms' gains
AUTOCAST_CACHE_MIB = 2 * (count_parameters(CFG)["total"] - CFG.vocab_size * CFG.d_model
                          - (2 * LAYERS + 1) * CFG.d_model) / MiB
CONTEXT = 2048  # the training step that does not fit; the checkpointing problem's setting (xl, our 2.7B)
CKPT = get_config(SIZE, CONTEXT)
ACTIVATIONS = transformer_activation_bytes(CKPT, BATCH, CONTEXT)  # what a whole fp32 forward saves, by count


# ---- the measured peaks ---------------------------------------------------------------------------

def cells() -> pd.DataFrame:
    """Newest row per (context, mode, dtype), whatever its status (an OOM included)."""
    return newest(load_results("memory/peaks"), KEY).set_index(KEY).sort_index()


def peaks() -> pd.DataFrame:
    m = cells().query("status == 'ok'")
    return m.assign(extra_mib=m.peak_mib - m.before_mib)


def peak(context: int, mode: str, dtype: str = "fp32", column: str = "peak_mib") -> float:
    return float(peaks().loc[(context, mode, dtype), column])


def extra(context: int, mode: str, dtype: str = "fp32") -> float:
    return peak(context, mode, dtype, "extra_mib")


def oom_2048(dtype: str = "fp32") -> pd.Series:
    """The training step at context 2,048, out of memory: what was held, the request, the capacity."""
    return cells().loc[(2048, "train", dtype)]


def peaks_table() -> str:
    """(b): every cell's peak (OOM where it did not fit), what was allocated before it and the reserved peak."""
    m = cells().reset_index().sort_values(["mode", "dtype", "context"], ascending=[True, False, True])
    shown = pd.DataFrame({"mode": m["mode"], "dtype": m.dtype, "context": m.context, "allocated before (MiB)": m.before_mib,
                          "peak (MiB)": m.peak_mib.map("{:,.0f}".format).where(m.status == "ok", m.status.str.upper()),
                          "peak - before (MiB)": m.peak_mib - m.before_mib, "reserved peak (MiB)": m.peak_reserved_mib})
    return with_source(shown, "memory/peaks", used=m, floatfmt=",.0f")


# ---- the hand counts --------------------------------------------------------------------------------

def tensor_sizes_mib(context: int = 512) -> dict[str, float]:
    return {"score": BATCH * CFG.num_heads * context * context * 4 / MiB,
            "ffn_hidden": BATCH * context * CFG.d_ff * 4 / MiB, "logits": BATCH * context * CFG.vocab_size * 4 / MiB}


def residual_mib(context: int) -> float:
    return residual_stream_bytes(BATCH, context, CFG.d_model, 4) / MiB


# ---- the snapshot: the timeline, the largest allocations and the residual stream -------------------

PHASE_COLORS = {"forward": "#dd8452", "backward": "#55a868", "optimizer": "#c44e52"}


def snapshot(bench: str, mode: str, context: int = SNAPSHOT_CONTEXT, dtype: str = "fp32") -> pd.DataFrame:
    """The newest rows of one snapshot cell in one of the snapshot's benches (timeline, largest, residual)."""
    return where(newest(ok(bench), [*KEY, "rank"] if bench == "memory/largest" else KEY),
                 context=context, mode=mode, dtype=dtype)


def timeline_figure(context: int, mode: str, dtype: str = "fp32"):
    """Active memory (GiB) against allocator event, phases shaded, the peak labelled."""
    r = snapshot("memory/timeline", mode, context, dtype).iloc[-1]
    starts, gib = thin_max(r.gib, 500)  # enough for a 9-inch figure (of up to 2,000 stored): each run's highest
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


def residual_sites_table() -> str:
    r = snapshot("memory/residual", "forward").iloc[-1]
    shown = pd.DataFrame([{"allocated at": f"`{site}`", "allocations": n} for site, n in r.sites])
    return with_source(shown, "memory/residual", used=pd.DataFrame([r]))


def _residual_adds_allocate_the_stream() -> bool:
    """The block's two residual adds per layer allocate the stream's size (the transformer.py sites), among others."""
    r = snapshot("memory/residual", "forward").iloc[-1]
    adds = sum(n for site, n in r.sites if "transformer.py" in site)
    return r.expected_mib == residual_mib(512) and adds == 2 * LAYERS and r.allocations_of_that_size > adds


def residual_derivation() -> str:
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
    """softmax, SwiGLU's three tensors, the linear layers' four inputs: over 80%; softmax and mask grow as T^2."""
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
    """One block's gradients G from the backward's fall = L A + saved_out - L G - grads_out, solved for G."""
    A = block_saved(SNAPSHOT_CONTEXT)["bytes"].sum() / MiB
    saved_out, grads_out = outside_blocks_mib()
    return (LAYERS * A + saved_out - grads_out - backward_fall_gib() * 1024) / LAYERS


# ---- gradient checkpointing: the model (A, c) and the H200 sweep over block sizes k ----------------

CHECKPOINT_BYTES = 4 * BATCH * CONTEXT * CKPT.d_model  # c: one segment input, the fp32 residual stream
# A: bytes autograd saves for one block (the count for 2 layers less that for 1)
BLOCK_BYTES = (transformer_activation_bytes(dataclasses.replace(CKPT, num_layers=2), BATCH, CONTEXT)
               - transformer_activation_bytes(dataclasses.replace(CKPT, num_layers=1), BATCH, CONTEXT))
NO_CHECKPOINTING_GIB = (8 * count_parameters(CKPT)["total"] + ACTIVATIONS) / GiB  # k = 0: weights, gradients, activations


def capacity_gib() -> float:
    """The GPU's capacity as its own out-of-memory message states it (the attention chapter's run)."""
    return float(load_results("attention/oom_checks")["capacity_mib"].dropna().iloc[0]) / 1024


def strategy_table() -> str:
    df = pd.DataFrame(theory.strategy_table(LAYERS, BLOCK_BYTES, CHECKPOINT_BYTES)).eval("peak_bytes = peak_bytes / @GiB")
    return markdown_table(df.rename(columns={"memory": "peak memory", "forwards": "block forwards",
                                             "peak_bytes": "peak (GiB, modelled)",
                                             "block_forwards": f"block forwards, L = {LAYERS}"}), floatfmt=".2f")


def _strategies_ordered() -> bool:
    """Peak memory falls and block forwards grow from none to peel-one (c + A); the tests hold the closed forms."""
    t = theory.strategy_table(LAYERS, BLOCK_BYTES, CHECKPOINT_BYTES)
    peaks, forwards = [r["peak_bytes"] for r in t], [r["block_forwards"] for r in t]
    return (peaks == sorted(peaks, reverse=True) and forwards == sorted(forwards)
            and peaks[-1] == CHECKPOINT_BYTES + BLOCK_BYTES)


# ---- finer than a block: the attention or feed-forward branch alone, or each (k = 1/2) ----------

HALF, ONE, ATTN, FFN = "each branch (k = 1/2)", "k = 1 (a block)", "attention branch", "feed-forward branch"
PEAKS = ["residual_peak_bytes", "backward_peak_bytes"]  # the two counted peaks: residuals, walked backward
SUBLAYERS = (SUBLAYER_BENCH, "sublayers")  # rows() of the sub-block cells
BRANCH_BYTES = block_sublayer_bytes(CKPT, BATCH, CONTEXT)  # A_attn, A_ffn: each branch's saved bytes, its norm included


def granularity() -> pd.DataFrame:
    flops = theory.branch_flops(CKPT.d_model, CKPT.d_ff, CONTEXT, BATCH * CONTEXT)
    return pd.DataFrame(theory.granularity_table(LAYERS, BRANCH_BYTES["attn"], BRANCH_BYTES["ffn"], CHECKPOINT_BYTES,
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
        f"\n\n*Activations only (parameters, gradients and what lies outside the blocks come on top), by formula "
        f"(`checkpoint_theory`, `accounting`), for our `{SIZE}` at batch {BATCH}, context {CONTEXT:,}, fp32.*")


def rows(bench: str = "memory/checkpointing", by: str = "checkpoint_every") -> pd.DataFrame:
    """The newest row per block size (or, in SUBLAYER_BENCH, sub-block granularity) at the handout's setting."""
    df = where(load_results(bench), size=SIZE, batch=BATCH, context=CONTEXT)
    return newest(df, [by, "dtype", "attention", "mode"]).sort_values(by).reset_index(drop=True)


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

def measured_granularity() -> pd.DataFrame:
    """k = 0, 1, 2 (the block-size sweep) and the three sub-block cells, with the share each recomputes."""
    blocks, sub = rows().set_index("checkpoint_every"), rows(*SUBLAYERS).set_index("sublayers")
    picked = [(name, blocks.loc[k]) for k, name in ((0, "none"), (1, ONE), (2, "k = 2"))]
    picked += [(name, sub.loc[g]) for g, name in (("attn", ATTN), ("ffn", FFN), ("attn+ffn", HALF))]
    recomputed = {**granularity()["recomputed"], "k = 2": 1.0}
    return pd.DataFrame([{"checkpointed": name, "status": {"ok": "ran", "oom": "out of memory"}[r.status],
                          "peak (GiB)": r.peak_mem_gib, "saved after forward (GiB)": r.saved_after_forward_gib,
                          "step (s)": r.median_ms / 1e3, "forward recomputed": f"{recomputed[name]:.0%}"}
                         for name, r in picked]).set_index("checkpointed", drop=False)


def measured_granularity_table() -> str:
    blocks = rows()
    return (markdown_table(measured_granularity(), floatfmt=".2f") + "\n\n"
            + provenance_line(blocks[blocks["checkpoint_every"] <= 2], source("memory/checkpointing")) + "\n\n"
            + provenance_line(rows(*SUBLAYERS), source(SUBLAYER_BENCH)))


def _g(name: str, column: str) -> float:
    """One measured cell's peak, saved or step column (the table's headers without their unit)."""
    return float(measured_granularity().loc[name, {"peak": "peak (GiB)", "saved": "saved after forward (GiB)",
                                                   "step": "step (s)"}[column]])


def _half_block_ties_one_block() -> bool:
    """k = 1/2 saves more yet peaks (in the last attention backward, gradients outweighing inputs) as k = 1 does."""
    A, W = BRANCH_BYTES, branch_backward_bytes(CKPT, BATCH, CONTEXT)
    at_end = (8 * count_parameters(CKPT)["total"] + A["attn"] + W["attn"] + CHECKPOINT_BYTES) / GiB
    return (_g(HALF, "saved") > _g(ONE, "saved") and abs(_g(HALF, "peak") - _g(ONE, "peak")) < 0.01
            and near(_g(HALF, "step"), _g(ONE, "step"), 0.02) and block_parameter_bytes(CKPT) > 2 * CHECKPOINT_BYTES
            and A["attn"] + W["attn"] > A["attn"] + A["ffn"] + W["ffn"]
            and all(near(_g(g, "peak"), at_end, 0.10) for g in (HALF, ONE)))


_mib = lambda x: f"{x:,.0f}"
_gib = lambda x: f"{x / GiB:.2f}"

register("memory", facts={
    "four_copies_mib": lambda: _mib(4 * WEIGHTS_MIB),
    "train_peak_512_mib": lambda: _mib(peak(512, "train")),
    "train_peak_512_bf16_mib": lambda: _mib(peak(512, "train", "bf16")),
    "train_peak_128_mib": lambda: _mib(peak(128, "train")),
    "fwd_peak_mib": lambda: span(peaks().xs(("forward", "fp32"), level=("mode", "dtype")).peak_mib, ",.0f"),
    "fwd_peak_512_mib": lambda: _mib(peak(512, "forward")),
    "fwd_peak_512_bf16_mib": lambda: _mib(peak(512, "forward", "bf16")),
    "block_saved_2048_gib": lambda: _gib(block_saved(2048)["bytes"].sum()),
    "block_top3_share": lambda: f"{block_saved(2048).share.head(3).sum():.0%}",
    "block_softmax_share": lambda: f"{block_saved(2048).share.iloc[0]:.0%}",
    "block_saved_512_mib": lambda: _mib(block_saved(512)["bytes"].sum() / MiB),
    "block_grad_mib": lambda: _mib(BLOCK_GRADIENT_MIB),
    "backward_fall_gib": lambda: f"{backward_fall_gib():.2f}",
    "outside_saved_mib": lambda: _mib(outside_blocks_mib()[0]),
    "outside_grads_mib": lambda: _mib(outside_blocks_mib()[1]),
    "block_grad_measured_mib": lambda: _mib(block_gradient_measured_mib()),
    "capacity_mib": lambda: _mib(oom_2048().capacity_mib),
    "activations_2048_mib": lambda: _mib(ACTIVATIONS / MiB),
    "ffn_weight_mib": lambda: f"{FFN_WEIGHT_MIB:g}",
    "autocast_cache_mib": lambda: _mib(AUTOCAST_CACHE_MIB),
    "timeline_offset_mib": lambda: _mib(peak(512, "train", "fp32", "before_mib")  # the timeline's start lies this far
                                        - peak(512, "train", "fp32", "timeline_start_gib") * 1024),  # below the counter
    "residual_128_mib": lambda: f"{residual_mib(128):g}",
    "residual_128_bytes": lambda: f"{residual_stream_bytes(BATCH, 128, CFG.d_model, 4):,}",
    "residual_512_mib": lambda: f"{residual_mib(512):g}",
    "score_mib": lambda: f"{tensor_sizes_mib()['score']:g}",
    "ffn_hidden_mib": lambda: f"{tensor_sizes_mib()['ffn_hidden']:g}",
    "logits_mib": lambda: f"{tensor_sizes_mib()['logits']:.1f}",
    # checkpointing.md
    "ckpt_layers": lambda: LAYERS, "ckpt_capacity_gib": lambda: f"{capacity_gib():.1f}",
    "ckpt_none_need_gib": lambda: f"{NO_CHECKPOINTING_GIB:.0f}",
    "ckpt_a_count_gib": lambda: _gib(BLOCK_BYTES),
    "ckpt_c_mib": lambda: f"{CHECKPOINT_BYTES / MiB:.0f}",
    "ckpt_k_star_count": lambda: f"{math.sqrt(LAYERS * CHECKPOINT_BYTES / BLOCK_BYTES):.2f}",  # of ceil(L/k) c + k A
    "ckpt_binary_forwards": lambda: theory.nested_forwards(LAYERS, "binary"),
    "ckpt_peel_forwards": lambda: theory.nested_forwards(LAYERS, "peel"),
    "ckpt_k_best": lambda: int(best()["checkpoint_every"]),
    "ckpt_peak_best_gib": lambda: f"{best()['peak_mem_gib']:.1f}",
    "ckpt_a_measured_gib": lambda: f"{measured_block_gib():.2f}",
    "ckpt_attn_branch_gib": lambda: _gib(BRANCH_BYTES["attn"]),
    "ckpt_ffn_branch_gib": lambda: _gib(BRANCH_BYTES["ffn"]),
    "ckpt_all_inputs_gib": lambda: _gib(LAYERS * CHECKPOINT_BYTES),
    "ckpt_branch_faster_pct": lambda: f"{100 * (1 - max(_g(ATTN, 'step'), _g(FFN, 'step')) / _g(ONE, 'step')):.0f}",
}, tables={
    "peaks": peaks_table, "residual_derivation": residual_derivation,
    "residual_sites": residual_sites_table, "largest_forward": lambda: largest_table("forward", 8),
    "largest_train": lambda: largest_table("train"), "block_saved": block_saved_table,
    "ckpt_strategies": strategy_table, "ckpt_block_sizes": block_size_table,
    "ckpt_granularity": granularity_table_md, "ckpt_granularity_measured": measured_granularity_table,
}, figures={
    **{f"timeline_{context}_{mode}": functools.partial(timeline_figure, context, mode)
       for context, mode in ((128, "train"), (128, "forward"), (512, "train"), (512, "forward"), (2048, "forward"))},
    "ckpt_peaks": peak_figure,
}, claims={
    # (a): weights, gradients and two moments; the rest is small buffers (under 2%)
    "training_starts_from_four_copies": lambda: all(
        near(peak(512, "train", dt, "before_mib"), 4 * WEIGHTS_MIB, 0.02) for dt in ("fp32", "bf16")),
    "inference_adds_little": lambda: near(peak(512, "forward", column="before_mib"), WEIGHTS_MIB, 0.02)
    and extra(128, "forward") < extra(256, "forward") < extra(512, "forward") < 0.05 * WEIGHTS_MIB,
    "short_contexts_peak_at_the_optimizer_temporary": lambda: all(
        near(extra(c, "train"), FFN_WEIGHT_MIB, 0.02) for c in (128, 256)),
    "activations_set_the_512_peak": lambda: extra(512, "train") > 10 * FFN_WEIGHT_MIB,
    "inference_extra_at_2048_is_the_scores": lambda: extra(2048, "forward") > 10 * extra(512, "forward")
    and extra(2048, "forward") > tensor_sizes_mib(2048)["score"],
    "forward_fits_at_2048_training_does_not": lambda: all(
        peak(2048, "forward", dt) < oom_2048().capacity_mib and oom_2048(dt).status == "oom" for dt in ("fp32", "bf16")),
    # activations alone nearly fill the GPU, with the resident model not even a first step fits; then one score matrix
    "first_step_cannot_fit": lambda: 0.9 < ACTIVATIONS / MiB / oom_2048().capacity_mib < 1
    and peak(2048, "forward", column="before_mib") + ACTIVATIONS / MiB > oom_2048().capacity_mib and CFG.num_heads == CFG.num_layers == 32
    and all(oom_2048(dt).tried_mib == tensor_sizes_mib(2048)["score"] for dt in ("fp32", "bf16")),
    "bf16_raises_every_peak": lambda: all(
        r.extra_mib > extra(c, m) for (c, m, dt), r in peaks().iterrows() if dt == "bf16")
    and all(peak(c, "forward", "bf16") > peak(c, "forward") for c in (128, 256, 512, 2048)),
    "bf16_training_peak_like_fp32": lambda: all(near(peak(c, "train", "bf16"), peak(c, "train"), 0.05) for c in (128, 256, 512)),
    "bf16_extra_is_the_weight_cache": lambda: near(extra(128, "forward", "bf16"), AUTOCAST_CACHE_MIB, 0.02),
    "residual_adds_allocate_the_stream": _residual_adds_allocate_the_stream,
    "largest_forward_are_scores_swiglu_logits": _largest_forward_as_answered,
    "training_adds_weight_sized_buffers": _weight_sized_training_buffers,
    "three_lines_hold_most_of_a_block": _three_lines_hold_most,
    # to 0.1 MiB a block: all the count leaves out is the loss scalar and its gradient (bytes to KiB)
    "measured_backward_gives_the_gradients": lambda: abs(block_gradient_measured_mib() - BLOCK_GRADIENT_MIB) < 0.1,
    "block_count_is_checkpointings_a": lambda: block_saved(2048)["bytes"].sum() == BLOCK_BYTES,
    # checkpointing.md
    "the_2026_xl_is_our_2_7b": lambda: (CKPT.d_model, CKPT.d_ff, CKPT.num_layers, CKPT.num_heads) == (2560, 10240, 32, 32)
    and tuple(getattr(get_config("xl"), f) for f in ("d_model", "d_ff", "num_layers", "num_heads")) == (1600, 6400, 48, 25),
    "peel_is_least_memory_most_forwards": _strategies_ordered,
    # k* = sqrt(L c / A) < 1: A > L c, counted and measured
    "k_star_below_one": lambda: min(BLOCK_BYTES, measured_block_gib() * GiB) > LAYERS * CHECKPOINT_BYTES
    and theory.best_block_size(LAYERS, BLOCK_BYTES, CHECKPOINT_BYTES)["k_best"] == 1 == int(best()["checkpoint_every"]),
    "best_and_its_neighbours": lambda: where(rows(), checkpoint_every=0)["status"].tolist() == ["oom"]
    and best()["peak_mem_gib"] < where(ok_rows(), checkpoint_every=2)["peak_mem_gib"].iloc[0]
    and NO_CHECKPOINTING_GIB > capacity_gib(),
    # agreement within 15% (either value puts k* below 1)
    "measured_a_matches_the_count": lambda: near(measured_block_gib(), BLOCK_BYTES / GiB, 0.15),
    "saved_shrinks_peak_grows": lambda: ok_rows()["saved_after_forward_gib"].is_monotonic_decreasing
    and ok_rows()["peak_mem_gib"].is_monotonic_increasing
    and rows().iloc[-1][["checkpoint_every", "status"]].tolist() == [LAYERS, "oom"],
    "step_time_ignores_k": lambda: ok_rows()["median_ms"].max() / ok_rows()["median_ms"].min() - 1 < 0.10,
    "branches_add_to_a_block": lambda: sum(BRANCH_BYTES.values()) == BLOCK_BYTES,
    "half_block_peaks_above_one_block": lambda: min(BRANCH_BYTES.values()) < LAYERS * CHECKPOINT_BYTES
    and (granularity().loc[HALF, PEAKS] > granularity().loc[ONE, PEAKS]).all()
    and (granularity().loc[[ATTN, FFN], PEAKS] > 5 * granularity().loc[ONE, PEAKS]).all(axis=None),
    "half_block_ties_one_block": _half_block_ties_one_block,
    "one_branch_is_faster_at_twice_the_memory": lambda: all(
        2 * _g(ONE, "peak") < _g(b, "peak") < capacity_gib() and _g(b, "step") < 0.95 * _g(ONE, "step")
        for b in (ATTN, FFN)) and near(_g(ATTN, "step"), _g(FFN, "step"), 0.01),
})
