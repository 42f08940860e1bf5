"""The FSDP benchmark end to end on CPU (2 gloo ranks, the tiny model, one timed step per variant)
and its argument checks. On two GPUs the same code runs xl (see the module's docstring)."""

from __future__ import annotations

import gzip
import json

import pytest

from cs336_systems.distributed import fsdp_bench

pytestmark = pytest.mark.distributed


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_variant_writes_a_row_and_fsdp_a_trace(tmp_path):
    traces = tmp_path / "traces"
    argv = ["--device", "cpu", "--size", "tiny", "--warmup", "1", "--steps", "1",
            "--results-dir", str(tmp_path), "--trace-dir", str(traces), "--trace-variants", "fsdp"]
    assert fsdp_bench.main(argv) == 0
    rows = {r["variant"]: r for r in _rows(tmp_path / "fsdp/steps/cpu.jsonl")}
    assert set(rows) == set(fsdp_bench.VARIANTS)
    for r in rows.values():
        assert r["status"] == "ok" and r["step_ms"] > 0 and r["git"]  # provenance rides along
        assert r["peak_allocated_gib"] is None  # no allocator to ask on CPU
        assert r["ranks_per_gpu"] == 1 and r["step_times"] == "measured"
        assert "gathered_memory" not in r  # the allocator's history is a CUDA one
    # the shard arithmetic: FSDP keeps 16/N bytes per parameter, DDP 16, ZeRO-1 8 + 8/N
    n = rows["ddp"]["n_params"] / 2**30
    assert rows["ddp"]["expected_state_gib"] == pytest.approx(16 * n)
    assert rows["zero1"]["expected_state_gib"] == pytest.approx(8 * n + 8 * n / 2)
    assert rows["fsdp-bf16"]["expected_state_gib"] == pytest.approx(16 * n / 2)
    assert rows["fsdp-bf16"]["compute_dtype"] == rows["fsdp2-bf16"]["reduce_dtype"] == "bf16"
    trace = _rows(tmp_path / "fsdp/trace/cpu.jsonl")
    assert [t["variant"] for t in trace] == ["fsdp"]
    uses = trace[0]["uses"]
    assert uses[0]["layer"] == "token_embeddings" and uses[-1]["layer"] == "lm_head"
    assert all(u["all_gather"] is not None for u in uses)
    assert len(trace[0]["reduce_scatters"]) == len(uses)  # one per weight (none tied here)
    with gzip.open(traces / "fsdp_fsdp.json.gz", "rt") as f:
        names = {e.get("name", "") for e in json.load(f)["traceEvents"]}
    assert "fsdp:all_gather:layers.0.ffn.w1" in names and "fsdp:reduce_scatter:lm_head.weight" in names
    assert fsdp_bench.main(argv) == 0  # a new run measures every variant again (readers keep the newest)
    assert len(_rows(tmp_path / "fsdp/steps/cpu.jsonl")) == 2 * len(rows)


def test_ranks_sharing_a_device_record_no_step_times_and_keep_their_own_rows(tmp_path):
    # --device cpu stands in for the one-GPU run: the same spawn path and rows (memory: no allocator)
    argv = ["--device", "cpu", "--size", "tiny", "--warmup", "1", "--steps", "1", "--variants",
            "fsdp", "--results-dir", str(tmp_path)]
    assert fsdp_bench.main(argv) == 0
    assert fsdp_bench.main(argv + ["--backend", "gloo", "--ranks-per-gpu", "2"]) == 0
    rows = {r["ranks_per_gpu"]: r for r in _rows(tmp_path / "fsdp/steps/cpu.jsonl")}
    assert set(rows) == {1, 2}, "a two-GPU row does not stand for the shared one, nor back"
    shared = rows[2]
    assert shared["status"] == "ok" and shared["variant"] == "fsdp"
    assert all(shared[k] is None for k in ("step_ms", "step_ms_mean", "step_ms_std", "step_ms_min"))
    assert shared["step_times"].startswith("not recorded: 2 ranks share one GPU")
    assert rows[1]["step_ms"] > 0


def _per_rank(peak: float, gathered: dict | None = None) -> dict:
    return {"peak": [peak, peak + 1, 0.5], "gathered_memory": gathered, "memory_cap_gib": 69.5,
            "threads": 16}


def _summary(fwd: int, bwd: int, left: int = 0) -> dict:
    phase = lambda n: {"gathers": 10, "max_alive": n, "max_unreleased": n, "max_alive_bytes": 0}  # noqa: E731
    return {"bound": 2, "gathers": 20, "phases": {"forward": phase(fwd), "backward": phase(bwd),
                                                  "step": phase(0)},
            "at_mark": {m: {"alive": left, "unreleased": left} for m in ("start", "forward", "backward", "step")},
            "within_bound": fwd <= 2 and bwd <= 2 and not left, "expected_gathers": 20}


def test_a_shared_gpu_row_holds_each_ranks_peak_and_the_gathered_counts():
    args = fsdp_bench.build_parser().parse_args(["--device", "cuda", "--backend", "gloo",
                                                 "--ranks-per-gpu", "2", "--size", "tiny"])
    got = {"steps": [1.0], "trace": None,
           "per_rank": [_per_rank(10.0, _summary(2, 2)), _per_rank(12.0, _summary(2, 3))]}
    r = fsdp_bench.row("fsdp", fsdp_bench.get_config("tiny"), args, 2, got)
    assert r["step_ms"] is None and "share one GPU" in r["step_times"]
    assert r["peak_allocated_gib_per_rank"] == [10.0, 12.0] and r["peak_allocated_gib"] == 12.0
    assert r["gpus"] == 1 and r["memory_cap_gib"] == 69.5
    assert r["gathered_max_alive_forward"] == 2 and r["gathered_max_alive_backward"] == 3
    assert r["gathered_within_bound"] is False  # one rank's backward held three
    assert len(r["gathered_memory"]) == 2


def test_a_rank_out_of_memory_ends_its_variant_with_an_oom_row(tmp_path, monkeypatch):
    from cs336_systems.distributed.launch import RankFailed

    def fake_spawn(fn, world, variant, *args, **kwargs):
        assert kwargs["ranks_per_gpu"] == 2
        if variant == "ddp":
            raise RankFailed(1, "Traceback ...\ntorch.OutOfMemoryError: CUDA out of memory. Tried to "
                                "allocate 12.00 GiB. GPU 0 has a total capacity of 139.81 GiB\n")
        if variant == "zero1":
            raise RankFailed(0, "Traceback ...\nRuntimeError: something else\n")
        return [{"steps": [1.0], "trace": None, "per_rank": [_per_rank(5.0), _per_rank(5.0)]}] * 2

    monkeypatch.setattr(fsdp_bench, "spawn", fake_spawn)
    args = fsdp_bench.build_parser().parse_args(
        ["--device", "cpu", "--ranks-per-gpu", "2", "--variants", "ddp", "fsdp2", "zero1",
         "--results-dir", str(tmp_path)])
    args.size = "tiny"
    with pytest.raises(RankFailed, match="something else"):  # not memory: the run fails
        fsdp_bench.spawn_each(args, "gloo", 2)
    rows = {r["variant"]: r for r in _rows(tmp_path / "fsdp/steps/cpu.jsonl")}
    assert rows["ddp"]["status"] == "oom" and rows["ddp"]["ranks_per_gpu"] == 2
    assert rows["ddp"]["error"].startswith("rank 1: torch.OutOfMemoryError: CUDA out of memory")
    assert rows["fsdp2"]["status"] == "ok"  # the variant after the OOM still ran
    assert "zero1" not in rows


@pytest.mark.parametrize("argv, flag", [
    (["--ranks-per-gpu", "0"], "--ranks-per-gpu"),
    (["--ranks-per-gpu", "3"], "--ranks-per-gpu"),  # 3 does not divide the 2 ranks
    (["--device", "cuda", "--backend", "nccl", "--ranks-per-gpu", "2"], "--ranks-per-gpu"),
    (["--backend", "nccl"], "--backend"),  # on cpu
    (["--ranks-per-gpu", "2", "--trace-dir", "t"], "--trace-dir"),
    (["--size", "huge"], "--size"),
    (["--world-size", "1"], "--world-size"),
    (["--batch-size", "3"], "--batch-size"),
    (["--warmup", "0"], "--warmup"),
    (["--bucket-size-mb", "0"], "--bucket-size-mb"),
    (["--variants", "fsdp3"], "--variants"),
])
def test_bad_arguments_exit_2_before_anything_starts(argv, flag, capsys, tmp_path):
    with pytest.raises(SystemExit) as info:
        fsdp_bench.main(argv + ["--results-dir", str(tmp_path)])
    assert info.value.code == 2 and flag in capsys.readouterr().err
    assert not any(tmp_path.iterdir()), "nothing written"


def test_trace_dir_must_be_a_directory(tmp_path, capsys):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    with pytest.raises(SystemExit) as info:
        fsdp_bench.main(["--trace-dir", str(not_a_dir)])
    assert info.value.code == 2 and "--trace-dir" in capsys.readouterr().err


@pytest.mark.skipif(__import__("torch").cuda.device_count() >= 2, reason="has 2 GPUs")
def test_cuda_without_two_gpus_is_refused(capsys):
    with pytest.raises(SystemExit) as info:
        fsdp_bench.main(["--device", "cuda"])
    assert info.value.code == 2 and "--device cuda" in capsys.readouterr().err


@pytest.mark.skipif(__import__("torch").cuda.device_count() >= 1, reason="has a GPU")
def test_sharing_still_needs_one_gpu(capsys):
    with pytest.raises(SystemExit) as info:
        fsdp_bench.main(["--device", "cuda", "--backend", "gloo", "--ranks-per-gpu", "2"])
    assert info.value.code == 2 and "needs 1 CUDA GPU(s), 0 visible" in capsys.readouterr().err


def test_one_gpu_for_two_gloo_ranks_points_at_sharing(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(fsdp_bench.torch.cuda, "device_count", lambda: 1)  # a one-GPU machine
    with pytest.raises(SystemExit) as info:
        fsdp_bench.main(["--device", "cuda", "--backend", "gloo", "--results-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "1 visible" in err and "--ranks-per-gpu 2" in err
    assert not any(tmp_path.iterdir())
