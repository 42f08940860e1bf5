"""The FSDP chapter's numbers, with no results/fsdp/ rows yet: the shard arithmetic at the benchmark's setting
(our `xl`, 4 sequences over 2 ranks), and all-gathers predicted from the H200 ceilings and collectives."""

from __future__ import annotations

import functools

import pandas as pd

from cs336_systems.distributed.fsdp import is_sharded_layer
from cs336_systems.distributed.fsdp.fsdp import REDUCE_SCATTERS_IN_FLIGHT
from cs336_systems.distributed.fsdp_measure import BENCH as STEPS_BENCH
from cs336_systems.distributed.fsdp_measure import GLOBAL_BATCH, STAGE, TRACE_BENCH
from cs336_systems.model import TransformerLM, count_parameters, get_config
from cs336_systems.sharding import preset_accounting as pa
from report import collectives, ddp, reproducing, sharding
from report.registry import register
from report.results import GPU, markdown_table, rows_if_any
from report.units import GiB, MiB

SIZE, WORLD = "xl", 2                      # fsdp_bench's default size on cuda, and its 2 GPUs
BATCH_PER_RANK = GLOBAL_BATCH // WORLD     # the DDP chapter's 2 sequences per rank
CFG = get_config(SIZE)                     # the preset's context: 512
N_PARAMS = count_parameters(CFG)["total"]
TOKENS = BATCH_PER_RANK * CFG.context_length  # tokens one rank's forward sees
BYTES = {"fp32": 4, "bf16": 2}


# -- (a) memory ----------------------------------------------------------------------------------

expected_memory = sharding.computed_memory  # bytes per rank by kind: the same 2 ranks of 2 sequences of 512
# bytes per rank that `stage` keeps less than `than` (activations cancel: no stage shards them)
saved = lambda stage, than, size=SIZE: expected_memory(than, size).total - expected_memory(stage, size).total
saved_share = lambda size: saved("zero3", "sharded", size) / expected_memory("sharded", size).total


def expected_memory_table() -> str:
    rows = []
    for size, model in ((SIZE, "2025 xl (`xl`)"), (pa.XL_2026.size, "2026 xl (`2.7B`)")):
        for stage, name in (("ddp", "DDP"), ("sharded", "sharded optimizer or ZeRO-1"), (STAGE["fsdp"], "FSDP")):
            rows.append({"model": model, "what each rank keeps": name,
                         **sharding.gib_columns(expected_memory(stage, size).as_dict(), "sum"),
                         "below DDP (GiB)": saved(stage, "ddp", size) / GiB})
    return markdown_table(pd.DataFrame(rows), floatfmt=".2f")


def largest_items(size: str) -> list[str]:
    """The kinds of what one FSDP rank keeps, largest first."""
    m = expected_memory("zero3", size)
    return sorted(("params", "grads", "optimizer_state", "activations"), key=lambda kind: -getattr(m, kind))


@functools.cache
def weights(size: str = SIZE) -> pd.DataFrame:
    """Every parameter of the preset (meta device: shapes only), and whether FSDP shards it."""
    model = TransformerLM.from_config(get_config(size), device="meta")
    sharded = {id(m.weight) for m in model.modules() if is_sharded_layer(m)}
    return pd.DataFrame([{"name": n, "numel": p.numel(), "sharded": id(p) in sharded}
                         for n, p in model.named_parameters()])


# -- (b) will each all-gather finish in time? ------------------------------------------------------

def _block_ops() -> list[tuple[str, tuple[int, int] | None, float]]:
    """One block's forward: (name, weight shape (d_out, d_in) or None, FLOPs on one rank), matmuls only."""
    d, f, s = CFG.d_model, CFG.d_ff, CFG.context_length
    linear = lambda name, d_out, d_in: (name, (d_out, d_in), 2.0 * TOKENS * d_in * d_out)
    attention = 4.0 * BATCH_PER_RANK * s * s * d  # Q K^T and P V, the full (s, s) score matrix
    return [linear("q_proj", d, d), linear("k_proj", d, d), linear("v_proj", d, d),
            ("attention (QKᵀ, PV)", None, attention), linear("output_proj", d, d),
            linear("ffn.w1", f, d), linear("ffn.w3", f, d), linear("ffn.w2", d, f)]


# o of t = o + bytes/w, NCCL's all-reduces on 2 H200s timed one at a time: above a call's cost back to back
fixed_cost_s = lambda: collectives.fit(GPU, "nccl+cuda", WORLD)[0]


def gather_windows() -> pd.DataFrame:
    """Per use of a sharded weight in a middle block: its window (the matmuls since the use two
    before ended, at the measured ceiling) and its all-gather (bytes at the whole-model rate, no fixed cost)."""
    ops, whole = _block_ops(), sharding.collectives(GPU).loc["all_gather"]
    uses = [i for i, (_, shape, _) in enumerate(ops) if shape is not None]
    rate, rows = whole["ms"] / 1e3 / whole["bytes"], []  # seconds per byte of all-gather output
    for k, i in enumerate(uses):
        before = uses[k - 2] - (len(ops) if k < 2 else 0)  # the previous block's, for q and k
        between = [ops[j % len(ops)] for j in range(before + 1, i)]
        numel = ops[i][1][0] * ops[i][1][1]
        row = {"use": ops[i][0], "weight": f"{ops[i][1][0]} × {ops[i][1][1]}",
               "its window": " + ".join(name for name, _, _ in between)}
        flops = sum(fl for _, _, fl in between)
        for dtype, nbytes in BYTES.items():
            row[f"window {dtype} (µs)"] = flops / (reproducing.matmul_ceiling_tflops(dtype) * 1e12) * 1e6
            row[f"all-gather {dtype} (µs)"] = numel * nbytes * rate * 1e6
        rows.append(row)
    return pd.DataFrame(rows)


# the measured bf16 matmul ceiling over the fp32 one: how much shorter bf16's windows are
bf16_speedup = lambda: reproducing.matmul_ceiling_tflops("bf16") / reproducing.matmul_ceiling_tflops("fp32")


def gather_us(dtype: str, fixed: bool = False) -> pd.Series:
    """Each use's all-gather time, with or without NCCL's fixed cost per call."""
    return gather_windows()[f"all-gather {dtype} (µs)"] + (fixed_cost_s() * 1e6 if fixed else 0.0)


window_over_gather = lambda dtype, fixed=False: gather_windows()[f"window {dtype} (µs)"] / gather_us(dtype, fixed)


def forward_stall_s(dtype: str, fixed: bool = False) -> float:
    """Predicted wait per forward: late gathers' time beyond their windows, every layer (not a forward's first two)."""
    late = gather_us(dtype, fixed) - gather_windows()[f"window {dtype} (µs)"]
    return float(late.clip(lower=0.0).sum()) * 1e-6 * CFG.num_layers


# -- communication per step ------------------------------------------------------------------------

def communication() -> pd.DataFrame:
    """Bytes each rank receives per step and their time alone at the measured whole-model rates
    (the collectives' bandwidth terms; FSDP's per-weight calls add their fixed costs on top)."""
    ms, received = sharding.collectives(GPU)["ms"], sharding.received_gb  # both of the 2025 xl, our SIZE
    rows = [("DDP", "all-reduce gradients", received("ddp", WORLD), ms["all_reduce"]),
            ("ZeRO-1", "reduce-scatter gradients, all-gather parameters", received("zero1", WORLD),
             ms["reduce_scatter"] + ms["all_gather"])]
    for dtype, b in BYTES.items():  # the collectives were timed on fp32 sizes
        rows.append((f"FSDP {dtype}", "all-gather parameters twice, reduce-scatter gradients",
                     received("zero3", WORLD, b), (2 * ms["all_gather"] + ms["reduce_scatter"]) * b / 4))
    return pd.DataFrame(rows, columns=["method", "collectives", "GB received per rank", "ms alone"])


def _runs_the_ddp_setting() -> bool:
    """Our xl and the DDP chapter's batch as fsdp_bench's defaults on cuda; the 2026 xl is our 2.7B."""
    from cs336_systems.distributed import fsdp_bench

    args = fsdp_bench.build_parser().parse_args(["--device", "cuda"])
    ddp_setting = ddp.steps(GPU)[["size", "batch_size", "context_length", "world_size"]].drop_duplicates()
    return ((CFG.d_model, CFG.num_layers, CFG.context_length, BATCH_PER_RANK) == (1600, 48, 512, 2)
            and (args.size, args.batch_size, args.context_length) == (None, 4, None)
            and ddp_setting.values.tolist() == [["xl", 4, 512, 2]]
            and (get_config("2.7B").d_model, get_config("2.7B").num_layers) == (2560, 32))


def _what_gets_sharded() -> bool:
    """The embedding, the LM head (the largest two), seven per layer; 2L + 1 norm gains, under 0.1%, stay whole."""
    w = weights()
    sharded, replicated = w.query("sharded"), w.query("not sharded")
    top = sharded[sharded["numel"] == sharded["numel"].max()]
    return (len(sharded) == 7 * CFG.num_layers + 2 and set(top["name"]) == {"token_embeddings.weight", "lm_head.weight"}
            and len(replicated) == 2 * CFG.num_layers + 1 and all(".ln" in f".{n}" for n in replicated["name"])
            and replicated["numel"].sum() / w["numel"].sum() < 1e-3)


register("fsdp", facts={
    # the course's 2026 tests next to tests/adapters.py, on a CPU (issue 27): not committed, so no build re-runs them
    "course_suite_2026_cpu": lambda: "9 passed, 1 failed and 4 skipped",
    "xl2026_params_b": lambda: f"{pa.XL_2026.n_params / 1e9:.2f}",
    "xl2026_saved_vs_sharded_gib": lambda: f"{saved('zero3', 'sharded', pa.XL_2026.size) / GiB:.2f}",
    "xl2026_saved_share": lambda: f"{saved_share(pa.XL_2026.size):.0%}",
    "n_params_b": lambda: f"{N_PARAMS / 1e9:.2f}",
    "saved_vs_sharded_gib": lambda: f"{saved('zero3', 'sharded') / GiB:.2f}",
    "tokens_per_rank": lambda: f"{TOKENS:,}",
    "sharded_weights": lambda: f"{int(weights()['sharded'].sum())}",
    "replicated_params": lambda: f"{int((~weights()['sharded']).sum())}",
    "replicated_share": lambda: f"{weights().query('not sharded')['numel'].sum() / weights()['numel'].sum():.3%}",
    "largest_weight_mib": lambda: f"{weights().query('sharded')['numel'].max() * BYTES['fp32'] / MiB:.1f}",
    "reduce_scatters_in_flight": lambda: f"{REDUCE_SCATTERS_IN_FLIGHT}",
    "bf16_speedup": lambda: f"{bf16_speedup():.0f}",
    "fixed_cost_us": lambda: f"{fixed_cost_s() * 1e6:.0f}",
    "fp32_min_margin_fixed": lambda: f"{window_over_gather('fp32', fixed=True).min():.1f}",
    "bf16_stall_ms": lambda: f"{forward_stall_s('bf16') * 1e3:.1f}",
    "bf16_stall_ms_fixed": lambda: f"{forward_stall_s('bf16', fixed=True) * 1e3:.0f}",
    "bytes_vs_ddp_fp32": lambda: f"{sharding.received_gb('zero3', WORLD) / sharding.received_gb('ddp', WORLD):.2g}",
    "collective_calls": lambda: f"{3 * int(weights()['sharded'].sum()) - 1:,}",
}, tables={
    "expected_memory": expected_memory_table,
    "gather_windows": lambda: markdown_table(gather_windows(), floatfmt=".0f"),
    "communication": lambda: markdown_table(communication(), floatfmt=".3g"),
}, claims={
    "benchmark_runs_the_ddp_chapters_xl_and_batch": _runs_the_ddp_setting,
    "no_h200_rows_yet": lambda: rows_if_any(STEPS_BENCH, GPU).empty and rows_if_any(TRACE_BENCH, GPU).empty,
    "what_gets_sharded": _what_gets_sharded,
    # (1 - 1/N) of 8 bytes per parameter below the sharded optimizer, for both editions' xl
    "saves_the_parameters_and_gradients_share": lambda: all(
        saved("zero3", "sharded", size) == 8 * n * (1 - 1 / WORLD)
        for size, n in ((SIZE, N_PARAMS), (pa.XL_2026.size, pa.XL_2026.n_params))),
    "largest_items": lambda: largest_items(pa.XL_2026.size)[:2] == ["optimizer_state", "activations"]
    and largest_items(SIZE)[0] == "activations",
    # every fp32 window covers its gather even with NCCL's fixed cost per call
    "fp32_gathers_fit_their_windows": lambda: window_over_gather("fp32", fixed=True).min() > 1,
    # bf16's ceiling over twice fp32's; no bf16 window covers its gather plus the fixed cost, a longer wait with it
    "bf16_gathers_wait": lambda: bf16_speedup() > 2 and window_over_gather("bf16", fixed=True).max() < 1
    and 0 < forward_stall_s("bf16") < forward_stall_s("bf16", fixed=True),
    "fixed_cost_is_an_upper_bound": lambda: ddp.naive_excess_per_call_ms() / 1e3 < fixed_cost_s(),
    # small: under 15% of the compute-only step
    "communication_small_next_to_compute": lambda: communication()["ms alone"].max()
    < 0.15 * ddp.value(GPU, "compute-only", "step_ms"),
})
