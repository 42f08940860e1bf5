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


@pytest.mark.parametrize("argv, flag", [
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
