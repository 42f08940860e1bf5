"""The FSDP chapter's numbers (docs/fsdp.md): what the shard arithmetic expects, computed at build
time. Nothing here reads results/fsdp/ (the two-GPU run has not written it yet). The tables come
from package functions at the benchmark's own setting (cs336_systems/distributed/fsdp_measure.py: our
preset `xl`, the DDP chapter's global batch of 4 sequences over 2 ranks, the preset's context).

The all-gather prediction (`gather_windows`) combines the model's shapes with three committed
H200 measurements: the matmul ceilings (results/ceilings), NCCL's whole-model all-gather on two
H200s (results/sharding/collectives) and the fixed cost per call fitted to NCCL's all-reduces
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


# fsdp_accounting (a) for the 2026 xl: preset_accounting's numbers, the distributed chapters' one
# account of that model (a claim checks they are this module's arithmetic at the benchmark's setting)
xl2026 = lambda: pa.fsdp_saving(XL_2026)


def _xl2026_saving_is_the_formula() -> bool:
    """preset_accounting and this module's arithmetic agree for both models, to the byte; (1 - 1/N)
    of 8 bytes per parameter below the sharded optimizer, (1 - 1/N) of 16 below DDP; a larger share
    of the sharded peak than the 2025 xl's (activations weigh less against 3.4B parameters' state
    than against 2.0B's)."""
    one_account = all(got["saved_vs_sharded"] == saved("zero3", "sharded", size) and got["saved_vs_ddp"] == saved("zero3", "ddp", size)
                      and got["fsdp_peak"] == expected_memory("zero3", size).total
                      for got, size in ((pa.fsdp_saving(pa.XL_2025), SIZE), (xl2026(), XL_2026.size)))
    n, got = XL_2026.n_params, xl2026()
    return (one_account and got["saved_vs_sharded"] == 8 * n * (1 - 1 / WORLD) and got["saved_vs_ddp"] == 16 * n * (1 - 1 / WORLD)
            and got["saved_share_vs_sharded"] > saved("zero3", "sharded") / expected_memory("sharded").total)


def _xl2026_adamw_state_stays_the_largest() -> bool:
    m = expected_memory("zero3", XL_2026.size)
    return m.optimizer_state > m.activations > max(m.params, m.grads) and m.activations == xl2026()["activations"]


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


def gather_and_window_us(dtype: str, fixed: bool = False) -> tuple[pd.Series, pd.Series]:
    """Each use's all-gather time (with or without the fixed cost per call) and its window."""
    w = gather_windows()
    return w[f"all-gather {dtype} (µs)"] + (fixed_cost_s() * 1e6 if fixed else 0.0), w[f"window {dtype} (µs)"]


def window_over_gather(dtype: str, fixed: bool = False) -> pd.Series:
    gather, window = gather_and_window_us(dtype, fixed)
    return window / gather


def forward_stall_s(dtype: str, fixed: bool = False) -> float:
    """Predicted wait per forward: every block's late gathers (gather time beyond the window),
    over the model's layers. The first uses of a forward (prefetched at its start) are left out."""
    gather, window = gather_and_window_us(dtype, fixed)
    return float((gather - window).clip(lower=0.0).sum()) * 1e-6 * CFG.num_layers


# -- communication per step ------------------------------------------------------------------------

def communication() -> pd.DataFrame:
    """Bytes each rank receives per step and their time alone at the measured whole-model rates
    (the collectives' bandwidth terms; FSDP's per-weight calls add their fixed costs on top)."""
    n, ms = N_PARAMS, sharding.collectives(GPU)["ms"]
    fp32 = n * 4  # the bytes those collectives were timed on
    received = lambda stage, b=4: acc.communication_bytes_per_rank(stage, n, WORLD, grad_bytes=b, param_bytes=b) / 1e9
    rows = [("DDP", "all-reduce gradients", received("ddp"), ms["all_reduce"]),
            ("ZeRO-1", "reduce-scatter gradients, all-gather parameters", received("zero1"), ms["reduce_scatter"] + ms["all_gather"])]
    for dtype, b in BYTES.items():
        rows.append((f"FSDP {dtype}", "all-gather parameters twice, reduce-scatter gradients", received("zero3", b),
                     (2 * ms["all_gather"] + ms["reduce_scatter"]) * b * n / fp32))
    return pd.DataFrame(rows, columns=["method", "collectives", "GB received per rank", "ms alone"])


_comm = lambda method, column: float(communication().set_index("method").loc[method, column])
fp32_bytes_over_ddp = lambda: _comm("FSDP fp32", "GB received per rank") / _comm("DDP", "GB received per rank")
_gib = lambda x: f"{x / GiB:.2f}"


def _runs_the_ddp_setting() -> bool:
    """Our preset xl (1,600 wide, 48 layers, context 512) and the DDP chapter's 4 sequences, 2 per
    rank, as fsdp_bench's defaults on cuda; the 2026 xl is our 2.7B (2,560 wide, 32 layers)."""
    from cs336_systems.distributed import fsdp_bench

    args = fsdp_bench.build_parser().parse_args(["--device", "cuda"])
    gpu = ddp.steps(GPU)
    return ((CFG.d_model, CFG.num_layers, CFG.context_length) == (1600, 48, 512) and args.size is None
            and args.batch_size == 4 and args.context_length is None and BATCH_PER_RANK == 2
            and set(gpu["size"]) == {"xl"} and set(gpu["batch_size"]) == {4} and set(gpu["context_length"]) == {512}
            and set(gpu["world_size"]) == {2} and (get_config("2.7B").d_model, get_config("2.7B").num_layers) == (2560, 32))


def _what_gets_sharded() -> bool:
    """The embedding, the LM head (the largest two) and seven per layer; the 2L + 1 norm gains stay
    replicated, under 0.1% of the parameters."""
    w = weights()
    sharded, replicated = w.query("sharded"), w.query("not sharded")
    L = CFG.num_layers
    per_layer = {n.split(".", 2)[2] for n in sharded["name"] if n.startswith("layers.")}
    top = sharded[sharded["numel"] == sharded["numel"].max()]
    return (len(sharded) == 7 * L + 2 and per_layer == {"attn.q_proj.weight", "attn.k_proj.weight", "attn.v_proj.weight",
                                                        "attn.output_proj.weight", "ffn.w1.weight", "ffn.w2.weight", "ffn.w3.weight"}
            and {"token_embeddings.weight", "lm_head.weight"} <= set(sharded["name"])
            and len(replicated) == 2 * L + 1 and all(".ln" in f".{n}" for n in replicated["name"])
            and replicated["numel"].sum() / w["numel"].sum() < 1e-3 and set(top["name"]) == {"token_embeddings.weight", "lm_head.weight"})


register("fsdp", facts={
    "course_suite_2026_cpu": lambda: COURSE_SUITE_2026_CPU,
    "xl2026_params_b": lambda: f"{XL_2026.n_params / 1e9:.2f}",
    **{f"xl2026_{name}_gib": (lambda k=k: _gib(xl2026()[k])) for name, k in (
        ("saved_vs_sharded", "saved_vs_sharded"), ("saved_vs_ddp", "saved_vs_ddp"), ("activations", "activations"),
        ("sharded", "sharded_peak"), ("fsdp", "fsdp_peak"), ("ddp", "ddp_peak"))},
    "xl2026_saved_share": lambda: f"{xl2026()['saved_share_vs_sharded']:.0%}",
    "xl2026_state_gib": lambda: _gib(expected_memory("zero3", XL_2026.size).optimizer_state),
    "n_params_b": lambda: f"{N_PARAMS / 1e9:.2f}",
    "tokens_per_rank": lambda: f"{TOKENS:,}",
    "sharded_weights": lambda: f"{int(weights()['sharded'].sum())}",
    "replicated_params": lambda: f"{int((~weights()['sharded']).sum())}",
    "replicated_share": lambda: f"{100 * weights().query('not sharded')['numel'].sum() / weights()['numel'].sum():.3f}%",
    "largest_weight_mib": lambda: f"{largest_weight_bytes() / MiB:.1f}",
    "two_gathered_mib": lambda: f"{2 * largest_weight_bytes() / MiB:.0f}",
    "reduce_scatters_in_flight": lambda: f"{REDUCE_SCATTERS_IN_FLIGHT}",
    **{f"{name}_gib": (lambda s=s: _gib(expected_memory(s).total)) for name, s in (("ddp", "ddp"), ("sharded", "sharded"), ("fsdp", "zero3"))},
    "activations_gib": lambda: _gib(expected_memory("zero3").activations),
    "saved_vs_sharded_gib": lambda: _gib(saved("zero3", "sharded")),
    "saved_vs_sharded_share": lambda: f"{saved('zero3', 'sharded') / expected_memory('sharded').total:.0%}",
    "saved_vs_ddp_gib": lambda: _gib(saved("zero3", "ddp")),
    "bf16_speedup": lambda: f"{bf16_speedup():.0f}",
    "fixed_cost_us": lambda: f"{fixed_cost_s() * 1e6:.0f}",
    "fp32_min_margin": lambda: f"{window_over_gather('fp32').min():.1f}",
    "fp32_min_margin_fixed": lambda: f"{window_over_gather('fp32', fixed=True).min():.1f}",
    "bf16_max_margin_fixed": lambda: f"{window_over_gather('bf16', fixed=True).max():.2f}",
    "bf16_stall_ms": lambda: f"{forward_stall_s('bf16') * 1e3:.1f}",
    "bf16_stall_ms_fixed": lambda: f"{forward_stall_s('bf16', fixed=True) * 1e3:.0f}",
    **{f"comm_{name}_ms": (lambda m=m: f"{_comm(m, 'ms alone'):.0f}") for name, m in (("fp32", "FSDP fp32"), ("bf16", "FSDP bf16"), ("ddp", "DDP"))},
    "bytes_vs_ddp_fp32": lambda: f"{fp32_bytes_over_ddp():.2g}",
    "collective_calls": lambda: f"{3 * int(weights()['sharded'].sum()) - 1:,}",
}, tables={"expected_memory": expected_memory_table, "gather_windows": lambda: markdown_table(gather_windows(), floatfmt=".0f"),
           "communication": lambda: markdown_table(communication(), floatfmt=".3g")}, claims={
    "benchmark_runs_the_ddp_chapters_xl_and_batch": _runs_the_ddp_setting,
    "two_gpu_steps_not_yet_measured": lambda: _steps_not_yet_measured(shared=False)
    and rows_if_any(TRACE_BENCH, GPU).empty,
    "shared_gpu_not_yet_measured": lambda: _steps_not_yet_measured(shared=True),
    "xl2026_saves_the_parameters_and_gradients_share": _xl2026_saving_is_the_formula,
    "xl2026_adamw_state_stays_the_largest": _xl2026_adamw_state_stays_the_largest,
    "what_gets_sharded": _what_gets_sharded,
    "saves_the_parameters_and_gradients_share": lambda: abs(saved("zero3", "sharded") / (8 * N_PARAMS * (1 - 1 / WORLD)) - 1) < 1e-9
    and abs(saved("zero3", "ddp") / (16 * N_PARAMS * (1 - 1 / WORLD)) - 1) < 1e-9,
    "activations_become_the_largest_item": lambda: (lambda m: m.activations == expected_memory("ddp").activations
                                                    and m.activations > max(m.params, m.grads, m.optimizer_state))(expected_memory("zero3")),
    "fp32_gathers_fit_their_windows": lambda: window_over_gather("fp32").min() > 1 and window_over_gather("fp32", fixed=True).min() > 1
    and forward_stall_s("fp32", fixed=True) == 0,
    "bf16_ceiling_more_than_doubles": lambda: bf16_speedup() > 2,
    "bf16_gathers_wait": lambda: window_over_gather("bf16", fixed=True).max() < 1
    and 0 < forward_stall_s("bf16") < forward_stall_s("bf16", fixed=True),
    "fixed_cost_is_an_upper_bound": lambda: ddp.naive_excess_per_call_ms() / 1e3 < fixed_cost_s(),
    # (N-1)/N (G + 2P) against 2 (N-1)/N G, with G = P
    "fsdp_moves_one_and_a_half_ddps_bytes": lambda: abs(fp32_bytes_over_ddp() - 1.5) < 1e-9,
    # small: under 15% of the compute-only step
    "communication_small_next_to_compute": lambda: communication()["ms alone"].max() < 0.15 * ddp.value(GPU, "compute-only", "step_ms"),
})
