"""The FSDP chapter's numbers (docs/fsdp.md): what the shard arithmetic expects at the benchmark's
own setting (fsdp_measure.py: our preset `xl`, the DDP chapter's 4 sequences over 2 ranks). No
results/fsdp/ rows exist yet. The all-gather prediction (`gather_windows`) combines the model's
shapes with committed H200 measurements: the matmul ceilings (results/ceilings), NCCL's whole-model
all-gather (results/sharding/collectives) and the fixed cost per call of its all-reduces
(results/collectives).
"""

from __future__ import annotations

import functools

import pandas as pd

from cs336_systems.distributed.fsdp import is_sharded_layer
from cs336_systems.distributed.fsdp.fsdp import REDUCE_SCATTERS_IN_FLIGHT
from cs336_systems.distributed.fsdp_measure import BENCH as STEPS_BENCH
from cs336_systems.distributed.fsdp_measure import GLOBAL_BATCH, STAGE, TRACE_BENCH
from cs336_systems.model import TransformerLM, count_parameters, get_config
from cs336_systems.sharding import accounting as acc
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
# The rows of the expected-memory table: what the benchmark's variants keep, by accounting stage.
MEMORY_ROWS = {"ddp": "DDP", "sharded": "sharded optimizer or ZeRO-1", STAGE["fsdp"]: "FSDP"}
XL_2026 = pa.XL_2026  # the 2026 handout's xl (our 2.7B) at the same setting: 2 ranks, 2 x 512 each
# The course's own 2026 test files, dropped next to tests/adapters.py and run on a CPU (the run
# reported in issue 27). The course's tests are not committed here, so no build can re-run them.
COURSE_SUITE_2026_CPU = "9 passed, 1 failed and 4 skipped"


# -- (a) memory ----------------------------------------------------------------------------------

def expected_memory(stage: str, size: str = SIZE) -> acc.MemoryBreakdown:
    """Bytes per rank of the fp32 AdamW state and the fp32 activations, at the benchmark's setting
    (its preset by default; `2.7B` for the 2026 xl, at the same batch, context and ranks)."""
    return acc.transformer_memory(get_config(size, CFG.context_length), BATCH_PER_RANK, WORLD, stage)


# bytes per rank that `stage` keeps less than `than` (activations cancel: no stage shards them)
saved = lambda stage, than, size=SIZE: expected_memory(than, size).total - expected_memory(stage, size).total
saved_share = lambda size: saved("zero3", "sharded", size) / expected_memory("sharded", size).total


def expected_memory_table() -> str:
    rows = []
    for size, model in ((SIZE, "2025 xl (`xl`)"), (XL_2026.size, "2026 xl (`2.7B`)")):
        for stage, name in MEMORY_ROWS.items():
            m = expected_memory(stage, size)
            rows.append({"model": model, "what each rank keeps": name, "parameters (GiB)": m.params / GiB,
                         "gradients (GiB)": m.grads / GiB, "AdamW state (GiB)": m.optimizer_state / GiB,
                         "activations (GiB)": m.activations / GiB, "sum (GiB)": m.total / GiB,
                         "below DDP (GiB)": saved(stage, "ddp", size) / GiB})
    return markdown_table(pd.DataFrame(rows), floatfmt=".2f")


def largest_items(size: str) -> list[str]:
    """The kinds of what one FSDP rank keeps, largest first."""
    m = expected_memory("zero3", size)
    return sorted(("params", "grads", "optimizer_state", "activations"), key=lambda kind: -getattr(m, kind))


def _steps_not_yet_measured(shared: bool) -> bool:
    """No H200 step rows of this kind yet: two-GPU rows (ranks_per_gpu 1) or shared-GPU ones (> 1)."""
    df = rows_if_any(STEPS_BENCH, GPU)
    per_gpu = df.get("ranks_per_gpu", pd.Series(1, index=df.index))
    return not ((per_gpu > 1) if shared else (per_gpu == 1)).any()


@functools.cache
def weights(size: str = SIZE) -> pd.DataFrame:
    """Every parameter of the preset (built on the meta device: shapes only), in registration
    order, with whether FSDP shards it (its module passes is_sharded_layer)."""
    model = TransformerLM.from_config(get_config(size), device="meta")
    sharded = {id(m.weight) for m in model.modules() if is_sharded_layer(m)}
    return pd.DataFrame([{"name": n, "shape": tuple(p.shape), "numel": p.numel(),
                          "sharded": id(p) in sharded} for n, p in model.named_parameters()])


largest_weight_bytes = lambda: int(weights().query("sharded")["numel"].max()) * BYTES["fp32"]


# -- (b) will each all-gather finish in time? ------------------------------------------------------

def _block_ops() -> list[tuple[str, tuple[int, int] | None, float]]:
    """One block's forward in call order: (name, weight shape (d_out, d_in) or None, FLOPs on one
    rank). Only the matmuls count: the norms, RoPE and the SwiGLU product are elementwise."""
    d, f, s = CFG.d_model, CFG.d_ff, CFG.context_length
    linear = lambda name, d_out, d_in: (name, (d_out, d_in), 2.0 * TOKENS * d_in * d_out)
    attention = 4.0 * BATCH_PER_RANK * s * s * d  # Q K^T and P V, the full (s, s) score matrix
    return [linear("q_proj", d, d), linear("k_proj", d, d), linear("v_proj", d, d),
            ("attention (QKᵀ, PV)", None, attention), linear("output_proj", d, d),
            linear("ffn.w1", f, d), linear("ffn.w3", f, d), linear("ffn.w2", d, f)]


def all_gather_rate_s_per_byte() -> float:
    """Seconds per byte of all-gather output: NCCL's all-gather of the whole xl model on 2 H200s."""
    row = sharding.collectives(GPU).loc["all_gather"]
    return row["ms"] / 1e3 / row["bytes"]


# o of t = o + bytes/w fitted to NCCL's all-reduces on 2 H200s, each timed alone (barrier to host
# synchronize): an upper bound on what one call among many back to back costs
fixed_cost_s = lambda: collectives.fit(GPU, "nccl+cuda", WORLD)[0]


def gather_windows() -> pd.DataFrame:
    """Per use of a sharded weight in a middle block: the window its all-gather has (the work
    between the end of the use two before and its own start, matmuls at the measured ceiling) and
    the all-gather's time (its bytes at the measured rate; the fixed cost is a separate term)."""
    ops = _block_ops()
    uses = [i for i, (_, shape, _) in enumerate(ops) if shape is not None]
    rate, rows = all_gather_rate_s_per_byte(), []
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
    """Predicted wait per forward: each late gather's time beyond its window, every layer; the first
    uses of a forward (prefetched at its start) are left out."""
    late = gather_us(dtype, fixed) - gather_windows()[f"window {dtype} (µs)"]
    return float(late.clip(lower=0.0).sum()) * 1e-6 * CFG.num_layers


# -- communication per step ------------------------------------------------------------------------

def communication() -> pd.DataFrame:
    """Bytes each rank receives per step and their time alone at the measured whole-model rates
    (the collectives' bandwidth terms; FSDP's per-weight calls add their fixed costs on top)."""
    n, ms = N_PARAMS, sharding.collectives(GPU)["ms"]
    fp32 = n * 4  # the bytes those collectives were timed on
    received = lambda stage, b=4: acc.communication_bytes_per_rank(stage, n, WORLD, grad_bytes=b, param_bytes=b) / 1e9
    rows = [("DDP", "all-reduce gradients", received("ddp"), ms["all_reduce"]),
            ("ZeRO-1", "reduce-scatter gradients, all-gather parameters", received("zero1"),
             ms["reduce_scatter"] + ms["all_gather"])]
    for dtype, b in BYTES.items():
        rows.append((f"FSDP {dtype}", "all-gather parameters twice, reduce-scatter gradients", received("zero3", b),
                     (2 * ms["all_gather"] + ms["reduce_scatter"]) * b * n / fp32))
    return pd.DataFrame(rows, columns=["method", "collectives", "GB received per rank", "ms alone"])


def fp32_bytes_over_ddp() -> float:
    received = communication().set_index("method")["GB received per rank"]
    return received["FSDP fp32"] / received["DDP"]


_gib = lambda x: f"{x / GiB:.2f}"


def _runs_the_ddp_setting() -> bool:
    """Our preset xl (1,600 wide, 48 layers, context 512) and the DDP chapter's 4 sequences, 2 per
    rank, as fsdp_bench's defaults on cuda; the 2026 xl is our 2.7B (2,560 wide, 32 layers)."""
    from cs336_systems.distributed import fsdp_bench

    args = fsdp_bench.build_parser().parse_args(["--device", "cuda"])
    gpu = ddp.steps(GPU)
    return ((CFG.d_model, CFG.num_layers, CFG.context_length) == (1600, 48, 512) and BATCH_PER_RANK == 2
            and (args.size, args.batch_size, args.context_length) == (None, 4, None)
            and gpu[["size", "batch_size", "context_length", "world_size"]].drop_duplicates().values.tolist()
            == [["xl", 4, 512, 2]]
            and (get_config("2.7B").d_model, get_config("2.7B").num_layers) == (2560, 32))


def _what_gets_sharded() -> bool:
    """The embedding, the LM head (the largest two) and seven per layer; the 2L + 1 norm gains stay
    replicated, under 0.1% of the parameters."""
    w = weights()
    sharded, replicated = w.query("sharded"), w.query("not sharded")
    top = sharded[sharded["numel"] == sharded["numel"].max()]
    return (len(sharded) == 7 * CFG.num_layers + 2 and set(top["name"]) == {"token_embeddings.weight", "lm_head.weight"}
            and len(replicated) == 2 * CFG.num_layers + 1 and all(".ln" in f".{n}" for n in replicated["name"])
            and replicated["numel"].sum() / w["numel"].sum() < 1e-3)


register("fsdp", facts={
    "course_suite_2026_cpu": lambda: COURSE_SUITE_2026_CPU,
    "xl2026_params_b": lambda: f"{XL_2026.n_params / 1e9:.2f}",
    "xl2026_saved_vs_sharded_gib": lambda: _gib(saved("zero3", "sharded", XL_2026.size)),
    "xl2026_saved_share": lambda: f"{saved_share(XL_2026.size):.0%}",
    "n_params_b": lambda: f"{N_PARAMS / 1e9:.2f}",
    "saved_vs_sharded_gib": lambda: _gib(saved("zero3", "sharded")),
    "tokens_per_rank": lambda: f"{TOKENS:,}",
    "sharded_weights": lambda: f"{int(weights()['sharded'].sum())}",
    "replicated_params": lambda: f"{int((~weights()['sharded']).sum())}",
    "replicated_share": lambda: f"{weights().query('not sharded')['numel'].sum() / weights()['numel'].sum():.3%}",
    "largest_weight_mib": lambda: f"{largest_weight_bytes() / MiB:.1f}",
    "reduce_scatters_in_flight": lambda: f"{REDUCE_SCATTERS_IN_FLIGHT}",
    "bf16_speedup": lambda: f"{bf16_speedup():.0f}",
    "fixed_cost_us": lambda: f"{fixed_cost_s() * 1e6:.0f}",
    "fp32_min_margin_fixed": lambda: f"{window_over_gather('fp32', fixed=True).min():.1f}",
    "bf16_stall_ms": lambda: f"{forward_stall_s('bf16') * 1e3:.1f}",
    "bf16_stall_ms_fixed": lambda: f"{forward_stall_s('bf16', fixed=True) * 1e3:.0f}",
    "bytes_vs_ddp_fp32": lambda: f"{fp32_bytes_over_ddp():.2g}",
    "collective_calls": lambda: f"{3 * int(weights()['sharded'].sum()) - 1:,}",
}, tables={
    "expected_memory": expected_memory_table,
    "gather_windows": lambda: markdown_table(gather_windows(), floatfmt=".0f"),
    "communication": lambda: markdown_table(communication(), floatfmt=".3g"),
}, claims={
    "benchmark_runs_the_ddp_chapters_xl_and_batch": _runs_the_ddp_setting,
    "two_gpu_steps_not_yet_measured": lambda: _steps_not_yet_measured(shared=False)
    and rows_if_any(TRACE_BENCH, GPU).empty,
    "shared_gpu_not_yet_measured": lambda: _steps_not_yet_measured(shared=True),
    "what_gets_sharded": _what_gets_sharded,
    # (1 - 1/N) of 8 bytes per parameter below the sharded optimizer, for both editions' xl
    "saves_the_parameters_and_gradients_share": lambda: all(
        saved("zero3", "sharded", size) == 8 * n * (1 - 1 / WORLD) for size, n in ((SIZE, N_PARAMS),
                                                                                (XL_2026.size, XL_2026.n_params))),
    "xl2026_adamw_state_stays_the_largest": lambda: largest_items(XL_2026.size)[:2]
    == ["optimizer_state", "activations"],
    "activations_become_the_largest_item": lambda: largest_items(SIZE)[0] == "activations",
    # every fp32 window covers its gather even with NCCL's fixed cost per call
    "fp32_gathers_fit_their_windows": lambda: window_over_gather("fp32", fixed=True).min() > 1,
    "bf16_ceiling_more_than_doubles": lambda: bf16_speedup() > 2,
    # no bf16 window covers its gather plus the fixed cost; the wait is longer with that cost than without
    "bf16_gathers_wait": lambda: window_over_gather("bf16", fixed=True).max() < 1
    and 0 < forward_stall_s("bf16") < forward_stall_s("bf16", fixed=True),
    "fixed_cost_is_an_upper_bound": lambda: ddp.naive_excess_per_call_ms() / 1e3 < fixed_cost_s(),
    # (N-1)/N (G + 2P) against 2 (N-1)/N G, with G = P
    "fsdp_moves_one_and_a_half_ddps_bytes": lambda: abs(fp32_bytes_over_ddp() - 1.5) < 1e-9,
    # small: under 15% of the compute-only step
    "communication_small_next_to_compute": lambda: communication()["ms alone"].max()
    < 0.15 * ddp.value(GPU, "compute-only", "step_ms"),
})
