"""The tensor-parallel SwiGLU on 2 gloo ranks against the unsharded FFN in float64, with the bytes
of its all-reduces and the FLOPs of its matmuls counted and compared with costs.py."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.utils.flop_counter import FlopCounterMode

from cs336_systems.distributed.launch import Worker, spawn
from cs336_systems.model.layers import SwiGLU
from cs336_systems.parallelism import costs
from cs336_systems.parallelism.tp_ffn import TensorParallelSwiGLU, shard_swiglu

TOKENS, D_MODEL = 12, 16
# float64; each output element is a sum over d_ff products, split into 2 partial sums that are
# added by the all-reduce: a reordering of <= 51 terms of size O(1) moves it by <= 51 * 2^-52 * O(1)
# ~ 1e-14. Gradients likewise (sums over tokens and d_model). 1e-12 leaves room and still catches
# any wrong slice, whose error is O(1).
TOL = dict(rtol=1e-12, atol=1e-12)


def _case(worker: Worker, d_ff: int) -> dict:
    torch.manual_seed(0)  # the same full FFN and data on every rank (drawn on the CPU, then moved)
    ffn = SwiGLU(D_MODEL, d_ff, dtype=torch.float64)
    x = torch.randn(TOKENS, D_MODEL, dtype=torch.float64)
    dy = torch.randn(TOKENS, D_MODEL, dtype=torch.float64)
    ffn, x, dy = ffn.to(worker.device), x.to(worker.device), dy.to(worker.device)
    tp = TensorParallelSwiGLU(ffn)

    calls: list[int] = []
    all_reduce = dist.all_reduce

    def counting_all_reduce(tensor, *args, **kwargs):
        calls.append(tensor.numel() * tensor.element_size())
        return all_reduce(tensor, *args, **kwargs)

    dist.all_reduce = counting_all_reduce
    try:
        x_tp = x.clone().requires_grad_()
        with FlopCounterMode(display=False) as fwd_flops:
            y = tp(x_tp)
        forward_calls = list(calls)
        with FlopCounterMode(display=False) as bwd_flops:
            y.backward(dy)
    finally:
        dist.all_reduce = all_reduce
    return {"y": y.detach().cpu(), "dx": x_tp.grad.cpu(),
            "grads": {n: p.grad.cpu() for n, p in tp.named_parameters()},
            "forward_calls": forward_calls, "backward_calls": calls[len(forward_calls):],
            "flops": (fwd_flops.get_total_flops(), bwd_flops.get_total_flops()),
            "d_ff_r": tp.w1.shape[0]}


def _tp_cases(worker: Worker) -> dict:
    return {d_ff: _case(worker, d_ff) for d_ff in (48, 51)}  # 51: uneven slices (26 + 25)


def _reference(d_ff: int):
    torch.manual_seed(0)
    ffn = SwiGLU(D_MODEL, d_ff, dtype=torch.float64)
    x = torch.randn(TOKENS, D_MODEL, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(TOKENS, D_MODEL, dtype=torch.float64)
    y = ffn(x)
    y.backward(dy)
    return ffn, y.detach(), x.grad


TWO_GPUS = pytest.mark.skipif(torch.cuda.device_count() < 2,
                              reason="needs 2 CUDA GPUs: the same check over NCCL")


@pytest.mark.distributed
@pytest.mark.parametrize("backend", ["gloo", pytest.param("nccl", marks=[pytest.mark.gpu, TWO_GPUS])])
def test_tensor_parallel_ffn_matches_unsharded_and_counts(backend):
    N = 2
    results = spawn(_tp_cases, N, backend=backend)
    for d_ff in (48, 51):
        ffn, y_ref, dx_ref = _reference(d_ff)
        for rank, res in enumerate(r[d_ff] for r in results):
            torch.testing.assert_close(res["y"], y_ref, **TOL)
            torch.testing.assert_close(res["dx"], dx_ref, **TOL)
            ref = {"w1": ffn.w1.weight.grad.tensor_split(N, 0)[rank],
                   "w3": ffn.w3.weight.grad.tensor_split(N, 0)[rank],
                   "w2": ffn.w2.weight.grad.tensor_split(N, 1)[rank]}
            for name, grad in res["grads"].items():
                torch.testing.assert_close(grad, ref[name], **TOL, msg=f"{name} rank {rank}")
            # one all-reduce of the (tokens, d_model) output forward, one of dx backward
            per_pass = TOKENS * D_MODEL * 8
            assert res["forward_calls"] == [per_pass] and res["backward_calls"] == [per_pass]
            assert costs.ring_collective_time(per_pass, N, 1e9, "all_reduce") == pytest.approx(
                costs.tp_comm_time(TOKENS, D_MODEL, N, 1e9, b=8))
            # this rank's matmuls: 6 B D f_r forward, 12 B D f_r backward (f_r its slice of d_ff)
            f_r = res["d_ff_r"]
            assert res["flops"] == (6 * TOKENS * D_MODEL * f_r, 12 * TOKENS * D_MODEL * f_r)
            if d_ff % N == 0:
                assert res["flops"] == (costs.ffn_flops(TOKENS, D_MODEL, d_ff, N, "forward"),
                                        costs.ffn_flops(TOKENS, D_MODEL, d_ff, N, "backward"))


def test_shard_swiglu_slices_and_validates():
    ffn = SwiGLU(4, 10)
    shards = [shard_swiglu(ffn, r, 3) for r in range(3)]
    assert [s["w1"].shape for s in shards] == [(4, 4), (3, 4), (3, 4)]
    assert [s["w2"].shape for s in shards] == [(4, 4), (4, 3), (4, 3)]
    assert torch.equal(torch.cat([s["w3"] for s in shards]), ffn.w3.weight)
    assert torch.equal(torch.cat([s["w2"] for s in shards], dim=1), ffn.w2.weight)
    with pytest.raises(ValueError, match="rank"):
        shard_swiglu(ffn, 3, 3)
    with pytest.raises(ValueError, match="world_size"):
        shard_swiglu(ffn, 0, 11)


def test_needs_a_process_group():
    with pytest.raises(RuntimeError, match="process group"):
        TensorParallelSwiGLU(SwiGLU(4, 8))


# -- the benchmark CLI -------------------------------------------------------------------------------

@pytest.mark.distributed
def test_tp_bench_writes_every_variant_on_cpu(tmp_path):
    from cs336_systems.bench.store import ResultStore
    from cs336_systems.parallelism import tp_bench

    argv = ["--d-model", "16", "--d-ff", "32", "--tokens", "8", "--warmup", "0", "--iters", "2",
            "--backend", "gloo", "--results-dir", str(tmp_path)]
    assert tp_bench.main(argv) == 0
    rows = ResultStore(tp_bench.BENCH, tp_bench.KEY, device="cpu", root=tmp_path).rows()
    assert {(r["variant"], r["mode"]) for r in rows} == {
        (v, m) for v in tp_bench.VARIANTS for m in tp_bench.MODES}
    assert all(r["status"] == "ok" and r["median_ms"] > 0 for r in rows)
    by = {(r["variant"], r["mode"]): r for r in rows}
    # fp32, sums of 32 terms split in two: far below 1e-5 relative
    assert by["tp", "forward"]["max_rel_err_vs_unsharded"] < 1e-5
    assert by["tp", "forward-backward"]["all_reduces"] == 2
    assert by["tp", "forward"]["all_reduce_bytes"] == 8 * 16 * 4
    assert by["unsharded", "forward"]["flops_per_rank"] == 2 * by["tp_compute", "forward"]["flops_per_rank"]
    assert tp_bench.main([*argv, "--resume"]) == 0  # that run is complete: nothing measured again
    assert len(ResultStore(tp_bench.BENCH, tp_bench.KEY, device="cpu", root=tmp_path).rows()) == len(rows)


@pytest.mark.parametrize("argv, flag", [
    (["--tokens", "0"], "--tokens"),
    (["--world-size", "1"], "--world-size"),
    (["--d-ff", "1", "--backend", "gloo"], "--d-ff"),
    (["--modes", "sideways"], "--modes"),
    (["--backend", "nccl", "--world-size", "64"], "--backend"),
])
def test_tp_bench_bad_arguments_exit_2(argv, flag, capsys, tmp_path):
    from cs336_systems.parallelism import tp_bench

    with pytest.raises(SystemExit) as info:
        tp_bench.main([*argv, "--results-dir", str(tmp_path)])
    assert info.value.code == 2
    assert flag in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # refused before anything was written
