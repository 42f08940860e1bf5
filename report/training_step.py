"""The training-step page's tables and facts: the step's arithmetic and memory budget, computed by
the package's formulas (cs336_systems/training_step/arithmetic.py, memory_budget.py), and the two
fused pieces measured on one H200: the LM head + cross-entropy (`just bench fused-ce`,
results/training_step/fused_ce) and the AdamW step (`just bench fused-adamw`,
results/training_step/fused_adamw); and one GPU's share of the whole step (`just bench training-step
--batch 1 --world-size 1`, results/training-step). The two-GPU step has no rows yet.

The checkpoint plans (checkpoint_plan.py) are arithmetic here too: what one block keeps and
recomputes per mode (memory_budget.block_bytes_per_token, arithmetic.recompute_flops_per_token),
and the plans `--sweep` would try for one H200's memory (plan_search.sweep_plans, built the way
bench.py builds them). The plans' H200 rows and the profile are training_step_measured.py's."""

from __future__ import annotations

import functools
import math

import pandas as pd
import torch

from cs336_systems.model import get_config
from cs336_systems.training_step import adamw_bench, arithmetic, ce_bench
from cs336_systems.training_step.checkpoint_plan import parse_plan
from cs336_systems.training_step.memory_budget import GIB, Layout, block_bytes_per_token, budget
from cs336_systems.training_step.plan_search import LEVELS, Candidate, plan_recompute_flops, sweep_plans
from cs336_systems.training_step.train_step import StepOptions
from cs336_systems.training_step.variants import recipe_of, with_plan
from report.flash_grid import step
from report.registry import register
from report.reproducing import copy_ceiling_tbps, matmul_ceiling_tflops
from report.results import load_results, markdown_table, newest, provenance_line, source

CFG = get_config("8B")
BATCH, CONTEXT, GPUS = 2, 32_768, 2
GOAL_S, STRETCH_S = 4.5, 4.0  # the goal this project set itself for the step on two H200s

# (variant, layout) as the bench's variants build them at the leaderboard's size, one sequence per GPU
LAYOUTS = {
    "plain (naive attention, full logits, DDP)": Layout("naive", "full-logits", 0, "ddp", 2),
    "stock PyTorch (SDPA, checkpointed loss chunks, FSDP2, every block checkpointed)": Layout("fused", "chunked", 34, "fsdp2", 2),
    "ours (FlashAttention, fused loss, FSDP2, every block checkpointed)": Layout("fused", "fused", 34, "fsdp2", 2),
    "ours, no sharding (DDP), every block checkpointed": Layout("fused", "fused", 34, "ddp", 2),
    "ours, FSDP2, last 10 blocks kept": Layout("fused", "fused", 24, "fsdp2", 2),
}


def flops() -> int:
    return arithmetic.step_flops(CFG, BATCH, CONTEXT)


def seconds_at(mfu: float) -> float:
    """The step time two H200s need at this MFU (of the bf16 dense datasheet rate)."""
    return flops() / (mfu * GPUS * arithmetic.H200_BF16_DENSE_FLOPS)


def mfu_at(seconds: float) -> float:
    return arithmetic.mfu(flops(), seconds, GPUS)


def arithmetic_table() -> str:
    rows = [("parameters", f"{arithmetic.params(CFG):,}"),
            ("matmul parameters (every Linear, the LM head included)", f"{arithmetic.matmul_params(CFG):,}"),
            ("tokens per step (batch x context)", f"{BATCH * CONTEXT:,}"),
            ("model FLOPs, weights (6 x tokens x matmul parameters)", f"{arithmetic.weight_flops(CFG, BATCH, CONTEXT):.3e}"),
            ("model FLOPs, causal attention", f"{arithmetic.attention_flops(CFG, BATCH, CONTEXT):.3e}"),
            ("model FLOPs per step", f"{flops():.3e}"),
            ("step at 100% MFU on two H200s (989 TFLOP/s bf16 dense each)", f"{seconds_at(1.0):.2f} s"),
            (f"MFU of a {GOAL_S} s step (the goal)", f"{mfu_at(GOAL_S):.1%}"),
            (f"MFU of a {STRETCH_S} s step (the stretch)", f"{mfu_at(STRETCH_S):.1%}")]
    return markdown_table(pd.DataFrame(rows, columns=["quantity", "value"]))


def budget_of(layout: Layout):
    return budget(CFG, layout, world_size=GPUS, batch_per_rank=BATCH // GPUS, context=CONTEXT)


def budget_table() -> str:
    rows = []
    for name, layout in LAYOUTS.items():
        g = budget_of(layout).as_gib()
        rows.append({"variant": name, "weights, grads, AdamW (DDP: + buckets)": g["params"] + g["grads"] + g["optimizer_state"]
                     + g["ddp_buckets"], "saved activations": g["saved_activations"],
                     "largest transient": g["working_set"], "estimated peak": g["estimate"]})
    df = pd.DataFrame(rows)
    return (markdown_table(df, formats={c: ".1f" for c in df.columns if c != "variant"})
            + "\n\n*GiB per GPU, by formula (`training_step/memory_budget.py`), one sequence of 32,768 per "
              "GPU; an H200 has about 139 GiB. Not counted: the CUDA context, compile workspaces, NCCL "
              "buffers, fragmentation.*")


# The two pieces' benchmarks, at the step's own shapes (their CLI defaults)
CE_SHAPE = {"positions": BATCH * CONTEXT, "vocab": CFG.vocab_size, "d_model": CFG.d_model, "dtype": "bf16"}
ADAMW_SHAPE = {"size": "8B", "dtype": "bf16", "shard": GPUS}
CE_WORDS = {"fused": "ours: fused_linear_cross_entropy",
            "torch": "F.cross_entropy on the full logits",
            "torch-chunked": "PyTorch, checkpointed chunks"}
ADAMW_WORDS = {"ours": "ours: FusedAdamW (Triton)",
               "torch-fused": "torch AdamW(fused=True)",
               "torch-foreach": "torch AdamW(foreach=True)"}


def _piece_rows(bench: str, key: tuple[str, ...], shape: dict, order: dict, index: str = "impl") -> pd.DataFrame:
    """The newest ok row per `key` at the step's shape, indexed by `index` in `order`'s order."""
    df = load_results(bench, status="ok")
    for column, value in shape.items():
        df = df[df[column].map(lambda x, value=value: value(x) if callable(value) else x == value)]
    df = newest(df, key).set_index(index)
    missing = set(order) - set(df.index)
    if missing:
        where = {c: ("(a filter)" if callable(v) else v) for c, v in shape.items()}
        raise KeyError(f"{source(bench)} has no ok row at {where} for {sorted(missing)}")
    return df.loc[list(order)]


def ce_rows() -> pd.DataFrame:
    """The fused loss, F.cross_entropy on the full logits and the chunked PyTorch loss at the step's
    shape (N 65,536, V 151,936, d 4,096, bf16): ms, tflops, peak_gib (above the inputs), ..."""
    return _piece_rows(ce_bench.BENCH, ce_bench.KEY, CE_SHAPE, CE_WORDS)


def adamw_rows() -> pd.DataFrame:
    """One AdamW step over one rank's half of the 8B model's parameters, bf16: ms, gb_per_s, host_ms, ..."""
    return _piece_rows(adamw_bench.BENCH, adamw_bench.KEY, ADAMW_SHAPE, ADAMW_WORDS)


def _rows_table(df: pd.DataFrame, label: str, words: dict, columns: dict, bench: str, note: str) -> str:
    """A markdown table of measured rows (one per index entry, named by `words`), `columns` mapping
    a heading to (row column, format), then the rows' provenance and an italic note."""
    table = pd.DataFrame({label: [words[i] for i in df.index],
                          **{head: df[column].to_numpy() for head, (column, _) in columns.items()}})
    return (markdown_table(table, formats={head: fmt for head, (_, fmt) in columns.items()})
            + "\n\n" + provenance_line(df.reset_index(), source(bench)) + f" *{note}*")


def ce_table() -> str:
    df = ce_rows()
    columns = {"forward + backward (ms)": ("ms", ".0f"), "TFLOP/s": ("tflops", ".0f"),
               "peak memory above the inputs (GiB)": ("peak_gib", ".1f")}
    return _rows_table(df, "implementation", CE_WORDS, columns, ce_bench.BENCH,
                       f"N = {CE_SHAPE['positions']:,} positions, V = {CE_SHAPE['vocab']:,}, "
                       f"d = {CE_SHAPE['d_model']:,}, "
                       f"bf16, chunks of {int(df.chunk_size.iloc[0]):,}; the median of `do_bench` over forward + backward; "
                       "TFLOP/s counts the 6 N V d FLOPs of the three matmuls (the chunked loss recomputes its logits "
                       "and runs 8, counted as 6); the full logits alone are "
                       f"{df.full_logits_gib.iloc[0]:.1f} GiB.")


def adamw_table() -> str:
    df = adamw_rows()
    first = df.iloc[0]
    columns = {"step (ms)": ("ms", ".1f"), "GB/s": ("gb_per_s", ",.0f"), "host time (ms)": ("host_ms", ".1f")}
    return _rows_table(df, "implementation", ADAMW_WORDS, columns, adamw_bench.BENCH,
                       f"{int(first.numel) / 1e9:.2f} billion bf16 parameters in {int(first.tensors)} tensors "
                       "(one rank's "
                       f"half of the 8B model); GB/s counts the {first.bytes_moved / 1e9:.1f} GB a step must move (p, g, m, "
                       "v read, p, m, v written) over the step's GPU time; the host time is how long `opt.step()` "
                       "takes to return.")


# -- the whole step on one GPU (`just bench training-step --batch 1 --world-size 1`) ---------------

ONE_GPU = {"size": "8B", "batch": 1, "context": CONTEXT, "world_size": 1,  # one GPU's share: one sequence,
           # unsharded, every block fully checkpointed (rows before plans existed have no "checkpoint")
           "flags": lambda f: f["shard"] == "none" and f["keep_blocks"] == 0
           and f.get("checkpoint", f"full:{CFG.num_layers}") == f"full:{CFG.num_layers}"
           and not f.get("expandable_segments", False)}
STEP_BENCH = "training-step"
VARIANT_WORDS = {"stock": "stock PyTorch (SDPA, checkpointed loss chunks, torch fused AdamW)",
                 "ours": "ours (FlashAttention, fused loss, FusedAdamW)"}


def one_gpu_rows() -> pd.DataFrame:
    """The newest ok row per variant of the 8B step on one GPU at one sequence, unsharded, every
    block checkpointed: step_ms (do_bench's median), mfu, peak_allocated_gib, n_timed, ..."""
    return _piece_rows(STEP_BENCH, ("variant",), ONE_GPU, VARIANT_WORDS, index="variant")


def one_gpu_table() -> str:
    df = one_gpu_rows()
    columns = {"step (ms)": ("step_ms", ",.0f"),
               f"MFU (of {df.peak_tflops_datasheet.iloc[0]:g} TFLOP/s)": ("mfu", ".1%"),
               "peak memory (GiB)": ("peak_allocated_gib", ".1f"), "steps timed": ("n_timed", "d")}
    return _rows_table(df, "variant", VARIANT_WORDS, columns, STEP_BENCH,
                       f"The 8B model unsharded on one H200, one sequence of {CONTEXT:,} tokens, bf16, every block "
              f"checkpointed and compiled; `do_bench` with a {df.rep_ms.max():g} ms window, so a multi-second "
                       "step is timed once.")


def _one(variant: str, column: str) -> float:
    return float(one_gpu_rows().loc[variant, column])


def _one_estimate(part: str) -> float:
    """The bench's memory budget for the one-GPU layout (the same for both variants' rows), GiB."""
    values = {row[part] for row in one_gpu_rows().memory_estimate_gib}
    if len(values) != 1:
        raise ValueError(f"the one-GPU rows disagree on the budget's {part}: {sorted(values)}")
    return values.pop()


# The one-GPU rows ran our d = 128 Triton kernels, not the Gluon ones the table names: the model hands
# the attention strided (batch, heads, seq, d) views, which the Gluon kernels took only from the
# commit after these rows (as contiguous copies). The grid timed those Triton kernels last at this git.
STEP_ROWS_ATTENTION_GIT = "07cdfe8b4e59"


def attention_extra_ms(git: str | None = STEP_ROWS_ATTENTION_GIT) -> float:
    """What our attention costs a step more than cuDNN's, from the grid's step cell (1 x 32 x 32,768,
    d 128, causal) in the run of code `git`: per layer one forward, then (checkpointed) the forward
    again and the backward."""
    per_layer = {impl: step(impl, "fwd", git) + step(impl, "fwd_bwd", git) for impl in ("ours", "cudnn")}
    return CFG.num_layers * (per_layer["ours"] - per_layer["cudnn"])


def _ce(impl: str, column: str) -> float:
    return float(ce_rows().loc[impl, column])


def _count_words(x: float) -> str:
    """A small count as a word in a sentence ("three buffers"), larger ones as digits."""
    n = round(x)
    return ("zero", "one", "two", "three", "four", "five", "six")[n] if n <= 6 else f"{n:,}"


def _adamw(impl: str, column: str) -> float:
    return float(adamw_rows().loc[impl, column])


FACTS = {
    "one_gap_ms": lambda: f'{_one("ours", "step_ms") - _one("stock", "step_ms"):.0f}',
    "one_stock_mfu": lambda: f'{_one("stock", "mfu"):.1%}',
    "one_ours_mfu": lambda: f'{_one("ours", "mfu"):.1%}',
    "one_peak_gib": lambda: f"{one_gpu_rows().peak_allocated_gib.max():.1f}",
    "one_low_gib": lambda: f'{_one_estimate("lower_bound"):.1f}',
    "one_estimate_gib": lambda: f'{_one_estimate("estimate"):.1f}',
    "one_attention_extra_ms": lambda: f"{attention_extra_ms():.0f}",
    "one_attention_git": lambda: STEP_ROWS_ATTENTION_GIT,
    "one_layers": lambda: CFG.num_layers,
    "flops": lambda: f"{flops() / 1e15:.2f} x 10^15",
    "ideal_s": lambda: f"{seconds_at(1.0):.2f}",
    "goal_mfu": lambda: f"{mfu_at(GOAL_S):.0%}",
    "goal_s": lambda: f"{GOAL_S:.1f}",
    "plain_gib": lambda: f'{budget_of(LAYOUTS["plain (naive attention, full logits, DDP)"]).lower_bound / GIB:.0f}',
    "plain_probs_gib": lambda: f'{budget_of(LAYOUTS["plain (naive attention, full logits, DDP)"]).attention_probabilities / GIB:.0f}',
    "ours_fsdp_gib": lambda: f'{budget_of(LAYOUTS["ours (FlashAttention, fused loss, FSDP2, every block checkpointed)"]).estimate / GIB:.0f}',
    "ours_ddp_gib": lambda: f'{budget_of(LAYOUTS["ours, no sharding (DDP), every block checkpointed"]).estimate / GIB:.0f}',
    # the fused loss (results/training_step/fused_ce)
    "ce_fused_ms": lambda: f'{_ce("fused", "ms"):.0f}',
    "ce_torch_ms": lambda: f'{_ce("torch", "ms"):.0f}',
    "ce_chunked_ms": lambda: f'{_ce("torch-chunked", "ms"):.0f}',
    "ce_fused_gib": lambda: f'{_ce("fused", "peak_gib"):.1f}',
    "ce_torch_gib": lambda: f'{_ce("torch", "peak_gib"):.1f}',
    "ce_chunked_gib": lambda: f'{_ce("torch-chunked", "peak_gib"):.1f}',
    "ce_logits_gib": lambda: f'{_ce("torch", "full_logits_gib"):.1f}',
    "ce_torch_over_logits": lambda: _count_words(_ce("torch", "peak_gib") / _ce("torch", "full_logits_gib")),
    "ce_chunked_slowdown": lambda: f'{_ce("torch-chunked", "ms") / _ce("fused", "ms"):.1f}',
    "ce_fused_tflops": lambda: f'{_ce("fused", "tflops"):.0f}',
    "ce_fused_of_ceiling": lambda: f'{_ce("fused", "tflops") / matmul_ceiling_tflops("bf16"):.0%}',
    # the AdamW step (results/training_step/fused_adamw)
    "adamw_ours_ms": lambda: f'{_adamw("ours", "ms"):.1f}',
    "adamw_fused_ms": lambda: f'{_adamw("torch-fused", "ms"):.1f}',
    "adamw_speedup": lambda: f'{_adamw("torch-fused", "ms") / _adamw("ours", "ms"):.2f}',
    "adamw_saved_ms": lambda: f'{_adamw("torch-fused", "ms") - _adamw("ours", "ms"):.0f}',
    "adamw_params_b": lambda: f'{_adamw("ours", "numel") / 1e9:.2f}',
    "adamw_ours_tbps": lambda: f'{_adamw("ours", "gb_per_s") / 1e3:.1f}',
    "adamw_fused_tbps": lambda: f'{_adamw("torch-fused", "gb_per_s") / 1e3:.1f}',
    "adamw_ours_of_copy": lambda: f'{_adamw("ours", "gb_per_s") / 1e3 / copy_ceiling_tbps():.0%}',
    "adamw_ours_host_ms": lambda: f'{_adamw("ours", "host_ms"):.1f}',
    "adamw_fused_host_ms": lambda: f'{_adamw("torch-fused", "host_ms"):.1f}',
}


# -- checkpoint plans, by arithmetic: one GPU's share (one sequence, unsharded, bf16, compiled blocks) --

SWEEP_N = 3  # the plans a `--sweep 3` run tries per variant
MODES = ("full", "selective", "selective+qkv", "selective+out", "selective+w13", "selective+qkv+out+w13", "none")
MODE_WORDS = {"full": "the block's input", "selective": "the input, the attention's O and L",
              "selective+qkv": "… and the q, k, v projections", "selective+out": "… and the output projection",
              "selective+w13": "… and SwiGLU's W1 x and W3 x",
              "selective+qkv+out+w13": "… and every matmul output the backward reads",
              "none": "what the compiled block's partitioner keeps"}


def one_gpu_options() -> StepOptions:
    """What `just bench training-step --batch 1 --world-size 1` builds with on a GPU: bf16,
    compiled blocks, no sharding (bench.py's defaults)."""
    return StepOptions(dtype=torch.bfloat16, compile=True)


def one_gpu_recipe(variant: str):
    return recipe_of(variant, one_gpu_options(), CFG, 1, "cuda")


def mode_rows() -> pd.DataFrame:
    """Per checkpoint mode, one block of ours at one sequence: the bytes it keeps for its backward
    (certain and likely: they differ for a compiled kept block) and the FLOPs it recomputes."""
    layout = one_gpu_recipe("ours").layout(torch.bfloat16)
    rows = []
    for mode in MODES:
        certain, likely = block_bytes_per_token(CFG, layout, mode, CONTEXT)
        rows.append({"mode": mode, "kept": MODE_WORDS[mode], "certain": certain * CONTEXT, "likely": likely * CONTEXT,
                     "recomputed": arithmetic.recompute_flops_per_token(CFG, mode, CONTEXT, compiled=True) * CONTEXT})
    return pd.DataFrame(rows).set_index("mode", drop=False)


def mode_table() -> str:
    df = mode_rows()
    table = pd.DataFrame({
        "mode": [f"`{m}`" for m in df["mode"]], "kept for the backward": df["kept"],
        "GiB per block": [f"{c / GIB:.2f}" if c == li else f"{c / GIB:.2f} to {li / GIB:.2f}"
                          for c, li in zip(df["certain"], df["likely"])],
        "recomputed (TFLOP per block)": df["recomputed"] / 1e12})
    return markdown_table(table, floatfmt=".2f") + (
        f"\n\n*By formula (`memory_budget.block_bytes_per_token`, `arithmetic.recompute_flops_per_token`): one "
        f"block of the 8B model, one sequence of {CONTEXT:,} tokens, bf16, compiled; matmul and attention FLOPs "
        "only. A kept compiled block saves what Inductor's partitioner chooses: at least the first number, "
        "likely the second.*")


def sweep_capacity_gib() -> float:
    """One H200's memory as its own out-of-memory message states it (the memory chapter's reading)."""
    from report import memory

    return memory.capacity_gib()


@functools.cache
def sweep(variant: str) -> tuple[tuple[Candidate, ...], tuple[Candidate, ...]]:
    """The plans `--sweep 3 --batch 1 --world-size 1 --memory-per-rank-gib <capacity>` tries for
    `variant`, as bench._sweep chooses them, and those it skips."""
    base = one_gpu_recipe(variant)
    chosen, skipped = sweep_plans(CFG, lambda p: with_plan(base, p.text).layout(torch.bfloat16), 1, 1, CONTEXT,
                                  float(f"{sweep_capacity_gib():.1f}") * GIB, SWEEP_N)
    return tuple(chosen), tuple(skipped)


def full_plan_recompute_flops() -> int:
    """What every block fully checkpointed (the measured rows' plan, full:34) recomputes."""
    return plan_recompute_flops(CFG, parse_plan(f"full:{CFG.num_layers}", CFG.num_layers), CONTEXT, CONTEXT,
                                compiled=True)


def sweep_table() -> str:
    rows = []
    for variant in ("stock", "ours"):
        chosen, _ = sweep(variant)
        for i, c in enumerate(chosen):
            rows.append({"variant": variant, "order": i + 1, "plan": f"`{c.plan.text}`", "blocks kept": c.kept_blocks,
                         "estimated peak (GiB)": c.budget.estimate / GIB, "recomputed (TFLOP)": c.recompute_flops / 1e12})
    return markdown_table(pd.DataFrame(rows), floatfmt=".1f") + (
        f"\n\n*Predicted by formula (`plan_search.sweep_plans`, `memory_budget.budget`) for one sequence of "
        f"{CONTEXT:,} tokens on one GPU of {sweep_capacity_gib():.1f} GiB, bf16, compiled blocks; the first row of "
        "each variant is its predicted best, the others the neighbouring numbers of kept blocks.*")


def _attention_is_half_of_a_full_recompute() -> bool:
    df = mode_rows()
    attention = df.loc["full", "recomputed"] - df.loc["selective", "recomputed"]
    return (attention == 2 * CONTEXT * CFG.d_model * CONTEXT and 0.4 < attention / df.loc["full", "recomputed"] < 0.5
            and all(df.loc[m, "recomputed"] < df.loc["selective", "recomputed"] for m in MODES[2:])
            and df.loc["none", "recomputed"] == 0)


def _best_plans_never_fully_checkpoint() -> bool:
    """At one H200's memory, no plan the sweep tries for either variant checkpoints a block fully
    (so none recomputes an attention forward), every one is predicted to fit, and none is skipped
    for the first numbers of kept blocks."""
    cap = float(f"{sweep_capacity_gib():.1f}") * GIB
    return all(len(sweep(v)[0]) == SWEEP_N and all(c.plan.count("full") == 0 and c.budget.estimate <= cap for c in sweep(v)[0])
               for v in ("stock", "ours"))


def _best_recomputes_a_fraction_of_full() -> bool:
    """Both variants' best plans recompute the same FLOPs (the same modes, in other counts of kept
    blocks), under a fifth of what every block fully checkpointed recomputes."""
    stock, ours = (sweep(v)[0][0].recompute_flops for v in ("stock", "ours"))
    return stock == ours < full_plan_recompute_flops() / 5


def sweep_margin_gib() -> float:
    """The most memory a plan the sweep tries leaves unused, by its estimate."""
    cap = float(f"{sweep_capacity_gib():.1f}") * GIB
    return max(cap - c.budget.estimate for v in ("stock", "ours") for c in sweep(v)[0]) / GIB


H200_GIB = 139  # the usable memory the page states for one H200 (about 139 GiB of 141 GB)
_fits = lambda name: budget_of(LAYOUTS[name]).estimate < H200_GIB * GIB


def _pieces_at_the_steps_shapes() -> bool:
    ce, adamw = ce_rows(), adamw_rows()
    return ((ce.positions == BATCH * CONTEXT).all() and (ce.vocab == CFG.vocab_size).all() and (ce.d_model == CFG.d_model).all()
            and (ce.dtype == "bf16").all() and (adamw["size"] == "8B").all() and (adamw.shard == GPUS).all()
            and (adamw.dtype == "bf16").all() and abs(adamw.numel.iloc[0] / (arithmetic.params(CFG) / GPUS) - 1) <= 0.01)


def _fused_pieces_beat_pytorch() -> bool:
    return (_one("ours", "step_ms") > _one("stock", "step_ms") and _one("ours", "mfu") < _one("stock", "mfu")
            and _ce("fused", "ms") < min(_ce("torch", "ms"), _ce("torch-chunked", "ms")) and _adamw("ours", "ms") < _adamw("torch-fused", "ms"))


def _one_gpu_peaks_inside_the_budget() -> bool:
    peaks = one_gpu_rows().peak_allocated_gib
    return (len({f"{p:.1f}" for p in peaks}) == 1  # "both peaked at" one number, as the page prints it
            and _one_estimate("lower_bound") < peaks.min() and peaks.max() < _one_estimate("estimate"))


FACTS |= {
    "mode_full_tflop": lambda: f'{mode_rows().loc["full", "recomputed"] / 1e12:.1f}',
    "mode_selective_tflop": lambda: f'{mode_rows().loc["selective", "recomputed"] / 1e12:.1f}',
    "mode_attention_share": lambda: f'{1 - mode_rows().loc["selective", "recomputed"] / mode_rows().loc["full", "recomputed"]:.0%}',
    "sweep_capacity_gib": lambda: f"{sweep_capacity_gib():.1f}",
    "sweep_best_stock": lambda: f"`{sweep('stock')[0][0].plan.text}`",
    "sweep_best_ours": lambda: f"`{sweep('ours')[0][0].plan.text}`",
    "sweep_best_tflop": lambda: f"{sweep('ours')[0][0].recompute_flops / 1e12:.0f}",
    "full_plan_tflop": lambda: f"{full_plan_recompute_flops() / 1e12:.0f}",
    "sweep_plan_count": lambda: f"{math.comb(CFG.num_layers + len(LEVELS) - 1, len(LEVELS) - 1):,}",
    "sweep_margin_gib": lambda: f"{sweep_margin_gib():.1f}",
}

register("training_step", facts=FACTS, tables={
    "arithmetic": arithmetic_table, "budget": budget_table, "ce": ce_table, "adamw": adamw_table, "one_gpu": one_gpu_table,
    "checkpoint_modes": mode_table, "sweep": sweep_table,
}, claims={
    "attention_is_half_of_a_full_recompute": _attention_is_half_of_a_full_recompute,
    "best_plans_never_fully_checkpoint": _best_plans_never_fully_checkpoint,
    "best_recomputes_a_fraction_of_full": _best_recomputes_a_fraction_of_full,
    "goal_is_about_half_the_datasheet_rate": lambda: 4.7e15 < flops() < 4.8e15 and 2.3 < seconds_at(1.0) < 2.5
    and 0.5 < mfu_at(GOAL_S) < 0.55,
    "plain_model_does_not_fit": lambda: budget_of(LAYOUTS["plain (naive attention, full logits, DDP)"]).lower_bound / GIB > 10 * H200_GIB
    and (lambda b: b.attention_probabilities > 0.5 * b.end_of_forward)(budget_of(LAYOUTS["plain (naive attention, full logits, DDP)"])),
    "ours_fits_sharded_and_replicated": lambda: budget_of(LAYOUTS["ours (FlashAttention, fused loss, FSDP2, every block checkpointed)"]).estimate
    < budget_of(LAYOUTS["ours, no sharding (DDP), every block checkpointed"]).estimate < H200_GIB * GIB and _fits("ours, FSDP2, last 10 blocks kept"),
    "full_logits_are_18_5_gib": lambda: f"{BATCH * CONTEXT * CFG.vocab_size * 2 / GIB:.1f}" == "18.5" and BATCH * CONTEXT == 65_536,
    "pieces_timed_at_the_steps_shapes": _pieces_at_the_steps_shapes,
    "fused_loss_a_little_faster": lambda: 1.0 < _ce("torch", "ms") / _ce("fused", "ms") < 1.2,
    "fused_loss_needs_a_tenth_of_the_memory": lambda: 1 / 14 < _ce("fused", "peak_gib") / _ce("torch", "peak_gib") < 1 / 7,
    "chunked_loss_saves_memory_but_is_slower": lambda: _ce("fused", "peak_gib") < _ce("torch-chunked", "peak_gib") < _ce("torch", "peak_gib") / 5
    and _ce("torch-chunked", "ms") > max(1.4 * _ce("fused", "ms"), _ce("torch", "ms")),
    "cross_entropy_holds_three_logit_buffers": lambda: round(_ce("torch", "peak_gib") / _ce("torch", "full_logits_gib")) == 3
    and _ce("fused", "peak_gib") < _ce("torch", "full_logits_gib") / 2,
    "fused_loss_near_the_matmul_ceiling": lambda: _ce("fused", "tflops") > 0.85 * matmul_ceiling_tflops("bf16"),
    "fused_adamw_beats_torch_foreach_slowest": lambda: _adamw("ours", "ms") < _adamw("torch-fused", "ms") / 1.2
    and _adamw("torch-foreach", "ms") > 2 * _adamw("torch-fused", "ms"),
    "fused_adamw_near_the_copy_bandwidth": lambda: _adamw("ours", "gb_per_s") / 1e3 > 0.85 * copy_ceiling_tbps()
    and _adamw("torch-fused", "gb_per_s") < _adamw("ours", "gb_per_s"),
    "adamw_launches_hide_behind_the_gpu": lambda: _adamw("torch-fused", "host_ms") < _adamw("ours", "host_ms") < 0.5 * _adamw("ours", "ms"),
    "adamw_saving_is_small": lambda: 0 < (_adamw("torch-fused", "ms") - _adamw("ours", "ms")) / 1e3 < 0.01 * GOAL_S,
    "sdpa_has_the_faster_attention": lambda: step("ours", "fwd_bwd") > step("cudnn", "fwd_bwd"),
    "sdpa_flash_backend_is_slower_than_ours": lambda: step("flash", "fwd_bwd") > step("ours", "fwd_bwd") and step("flash", "fwd") > step("ours", "fwd"),
    "fused_pieces_win_the_step_loses": _fused_pieces_beat_pytorch,
    "attention_covers_the_gap": lambda: attention_extra_ms() > _one("ours", "step_ms") - _one("stock", "step_ms") > 0,
    "one_gpu_rows_single_steps_one_run": lambda: (one_gpu_rows().n_timed == 1).all() and one_gpu_rows().run_id.nunique() == 1
    and all(f["checkpointed_blocks"] == CFG.num_layers and f["compile"] for f in one_gpu_rows()["flags"]),
    "one_gpu_peaks_inside_the_budget": _one_gpu_peaks_inside_the_budget,
})
