"""Claims of docs/fsdp.md, asserted over the same report functions the page prints from.

Until the two-GPU run exists, the page's claims are about the shard arithmetic, the model's shapes,
the adapters, and a prediction built from other chapters' committed H200 measurements. Each test
quotes the sentence it guards; when a test fails, rewrite the sentence (and the test).
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from cs336_systems.distributed import fsdp_bench
from cs336_systems.model import count_parameters, get_config
from report import ddp, fsdp
from report.ddp_facts import one_allreduce_ms
from tests import adapters

PAGE = Path(__file__).resolve().parents[2] / "docs" / "fsdp.md"
L = fsdp.CFG.num_layers


def test_the_benchmark_runs_the_ddp_chapters_xl_and_batch():
    # "The benchmark uses our preset `xl`: d_model = 1600, 48 layers ... It also uses the DDP
    # chapter's batch: 4 sequences of 512 tokens, 2 per rank."
    cfg = get_config("xl")
    assert (cfg.d_model, cfg.num_layers, cfg.context_length) == (1600, 48, 512)
    args = fsdp_bench.build_parser().parse_args(["--device", "cuda"])
    assert args.size is None and args.batch_size == 4 and args.context_length is None  # main: xl
    assert fsdp.BATCH_PER_RANK == 2 and fsdp.CFG == cfg
    gpu = ddp.steps("nvidia-h200")
    assert set(gpu["size"]) == {"xl"} and set(gpu["batch_size"]) == {4}
    assert set(gpu["context_length"]) == {512} and set(gpu["world_size"]) == {2}
    # "its "xl" (d_model = 2560, 32 layers) is the 2025 "2.7B", our preset `2.7B`"
    big = get_config("2.7B")
    assert (big.d_model, big.num_layers) == (2560, 32)


def test_adapters_table_names_what_each_adapter_returns():
    # the table under "The 2026 adapters": each adapter exists with the listed parameters, and
    # its body calls the class or function in the "ours" column
    section = PAGE.read_text().split("### The 2026 adapters")[1].split("###")[0]
    rows = re.findall(r"^\| `(\w+)\(([^)]*)\)` \| [^|]+ \| `([\w.]+)` \|$", section, re.MULTILINE)
    assert len(rows) == 5
    for name, params, ours in rows:
        fn = getattr(adapters, name)
        listed = [p.split("=")[0].strip() for p in params.split(",")]
        assert list(inspect.signature(fn).parameters) == listed, name
        assert ours.split(".")[-1] in inspect.getsource(fn), f"{name} does not use {ours}"


def test_what_gets_sharded_in_xl():
    # "{{ fsdp.sharded_weights }} weight matrices: the embedding, the LM head, and seven per layer
    # (four attention projections and three SwiGLU matrices). The {{ fsdp.replicated_params }}
    # RMSNorm gains stay replicated. They are {{ fsdp.replicated_share }} of the parameters"
    w = fsdp.weights()
    sharded = w.query("sharded")
    assert len(sharded) == 7 * L + 2
    per_layer = {n.split(".", 2)[2] for n in sharded["name"] if n.startswith("layers.")}
    assert per_layer == {"attn.q_proj.weight", "attn.k_proj.weight", "attn.v_proj.weight",
                         "attn.output_proj.weight", "ffn.w1.weight", "ffn.w2.weight", "ffn.w3.weight"}
    assert {"token_embeddings.weight", "lm_head.weight"} <= set(sharded["name"])
    replicated = w.query("not sharded")
    assert len(replicated) == 2 * L + 1 and all(".ln" in f".{n}" for n in replicated["name"])
    assert replicated["numel"].sum() / w["numel"].sum() < 1e-3  # "too small to be worth a collective"
    # "the largest weight (the embedding, or the LM head)"
    top = sharded[sharded["numel"] == sharded["numel"].max()]
    assert set(top["name"]) == {"token_embeddings.weight", "lm_head.weight"}


def test_a_the_saving_is_the_parameters_and_gradients_share():
    # (a): "FSDP also divides the parameters and the gradients, so it saves a further (1 - 1/N) of
    # their bytes: 4 + 4 = 8 bytes per parameter in fp32, times (1-1/N)"
    n, N = count_parameters(fsdp.CFG)["total"], fsdp.WORLD
    assert fsdp.saved("zero3", "sharded") == pytest.approx(8 * n * (1 - 1 / N))
    # "{{ fsdp.saved_vs_ddp_gib }} GiB below plain DDP's": all three kinds of state / N
    assert fsdp.saved("zero3", "ddp") == pytest.approx(16 * n * (1 - 1 / N))
    # "The activations ... are not sharded, and they become the largest item."
    m = fsdp.expected_memory("zero3")
    assert m.activations == fsdp.expected_memory("ddp").activations
    assert m.activations > max(m.params, m.grads, m.optimizer_state)


def test_b_fp32_gathers_fit_their_windows():
    # (b): "In fp32 every window is at least {{ fsdp.fp32_min_margin }} times its gather's transfer
    # time, and {{ fsdp.fp32_min_margin_fixed }} times its transfer plus NCCL's fixed cost per
    # call ... So the gathers should finish in time."
    assert fsdp.window_over_gather("fp32").min() > 1
    assert fsdp.window_over_gather("fp32", fixed=True).min() > 1
    assert fsdp.forward_stall_s("fp32", fixed=True) == 0


def test_b_bf16_gathers_do_not_fit_with_the_fixed_cost():
    # (b): "Under bf16 the matmul ceiling is {{ fsdp.bf16_speedup }} times the fp32 one, while the
    # bytes only halve."
    assert fsdp.bf16_speedup() > 2
    # "no window then covers its gather plus the fixed cost (at best {{ fsdp.bf16_max_margin_fixed }}
    # of it), so we expect bf16 forwards to wait up to about {{ fsdp.bf16_stall_ms_fixed }} ms"
    assert fsdp.window_over_gather("bf16", fixed=True).max() < 1
    # "Without the fixed cost, bf16's predicted wait is {{ fsdp.bf16_stall_ms }} ms per forward;
    # with it, {{ fsdp.bf16_stall_ms_fixed }} ms."
    assert 0 < fsdp.forward_stall_s("bf16") < fsdp.forward_stall_s("bf16", fixed=True)


def test_b_the_fixed_cost_is_an_upper_bound_for_back_to_back_calls():
    # "The DDP chapter found that calls issued back to back cost less, so the fixed-cost column is
    # an upper bound."
    gpu = "nvidia-h200"
    excess_ms, _ = ddp.flat_saved_added_ms(gpu, one_allreduce_ms())
    per_call_s = excess_ms / 1e3 / float(ddp.at(gpu, "naive")["allreduce_calls"])
    assert per_call_s < fsdp.fixed_cost_s()


def test_communication_is_small_next_to_the_compute():
    # "{{ fsdp.bytes_vs_ddp_fp32 }} times DDP's all-reduce in fp32": (N-1)/N (G + 2P) against
    # 2 (N-1)/N G, with G = P
    c = fsdp.communication().set_index("method")
    assert c.loc["FSDP fp32", "GB received per rank"] / c.loc["DDP", "GB received per rank"] == pytest.approx(1.5)
    # "All of them are small next to the {{ ddp.gpu_compute_only_ms }} ms compute-only step"
    # (small: under 15% of it)
    compute_only = float(ddp.at("nvidia-h200", "compute-only")["step_ms"])
    assert c["ms alone"].max() < 0.15 * compute_only
