"""The 2026 benchmarking_script (b) part: every phase timed on its own, every 2026 size attempted,
an out-of-memory cell stored as a measurement with the allocator's numbers and the arithmetic."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from cs336_systems.model import AdamW, count_parameters, get_config
from cs336_systems.model.config import edition_presets
from cs336_systems.profiling import phase_timing, sweeps

GIB = 2**30
# An H200's capacity as its allocator reports it ("total capacity of 139.81 GiB"), in bytes.
H200_BYTES = 139.81 * GIB
ARGV = ["--part", "phases", "--phase-sizes", "tiny", "--context", "16", "--warmup", "1", "--steps", "3",
        "--dtypes", "fp32", "--device", "cpu"]


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_each_phase_of_each_mode_gets_its_own_mean_and_std(tmp_path):
    assert sweeps.main([*ARGV, "--phase-modes", "forward,forward-backward,train",
                        "--results-dir", str(tmp_path)]) == 0
    stored = {r["mode"]: r for r in rows(tmp_path / "end-to-end" / "phases" / "cpu.jsonl")}
    assert set(stored) == {"forward", "forward-backward", "train"}
    for mode, row in stored.items():
        assert row["status"] == "ok" and row["phases"] == list(phase_timing.MODE_PHASES[mode])
        for phase in row["phases"]:
            times = row[f"{phase}_times_ms"]
            assert len(times) == 3 and all(t > 0 for t in times)
            assert row[f"{phase}_mean_ms"] == pytest.approx(sum(times) / 3)
            assert row[f"{phase}_std_ms"] >= 0
        # the step is its phases' sum, step by step
        assert row["step_mean_ms"] == pytest.approx(sum(row[f"{p}_mean_ms"] for p in row["phases"]))
        assert row["predicted_params"] == count_parameters(get_config("tiny"))["total"]
    assert "optimizer_mean_ms" not in stored["forward-backward"]


def test_the_phase_timer_measures_each_phase_to_its_end():
    timer = phase_timing.PhaseTimer("cpu")
    for name, seconds in (("forward", 0.02), ("backward", 0.04)):
        with timer(name):
            time.sleep(seconds)
    assert timer.times["forward"][0] >= 0.02 and timer.times["backward"][0] >= 0.04
    assert timer.current is None and timer.times["optimizer"] == []


def test_an_optimizer_that_runs_out_of_memory_leaves_an_oom_row_saying_where(tmp_path, monkeypatch):
    message = ("CUDA out of memory. Tried to allocate 180.00 MiB. GPU 0 has a total capacity of 139.81 GiB "
               "of which 90.00 MiB is free. Of the allocated memory 138.5 GiB is allocated by PyTorch, and "
               "1.00 GiB is reserved by PyTorch but unallocated.")

    def no_room(self, closure=None):
        raise torch.OutOfMemoryError(message)

    monkeypatch.setattr(AdamW, "step", no_room)
    assert sweeps.main([*ARGV, "--results-dir", str(tmp_path)]) == 0  # an OOM is a result, not a failure
    by_mode = {r["mode"]: r for r in rows(tmp_path / "end-to-end" / "phases" / "cpu.jsonl")}
    oom, ok = by_mode["train"], by_mode["forward-backward"]
    assert ok["status"] == "ok"
    assert oom["status"] == "oom" and oom["oom_phase"] == "optimizer" and oom["oom_step"] == 0
    assert oom["tried_mib"] == 180.0 and oom["capacity_mib"] == pytest.approx(139.81 * 1024)
    assert oom["predicted_adamw_gib"] == pytest.approx(2 * oom["predicted_weights_gib"])


def test_step_memory_is_the_fp32_state_and_activations():
    cfg = get_config("tiny")
    n = count_parameters(cfg)["total"]
    train = phase_timing.step_memory(cfg, mode="train", batch=4, context=16, capacity_bytes=1.0 * GIB)
    # 4 bytes of weights, 4 of gradients, 8 of AdamW moments per parameter
    assert train["end_of_backward_gib"] * GIB == 16 * n
    assert train["over_capacity_gib"] == pytest.approx(train["lower_bound_gib"] - 1.0)
    forward = phase_timing.step_memory(cfg, mode="forward", batch=4, context=16)
    assert forward["lower_bound_gib"] * GIB == 4 * n and "capacity_gib" not in forward
    with pytest.raises(ValueError, match="mode"):
        phase_timing.step_memory(cfg, mode="inference", batch=4, context=16)


def test_the_10b_training_step_cannot_fit_an_h200_but_its_forward_backward_can_by_arithmetic():
    """Why the 10B rows are attempted: the arithmetic refuses only the training step. 12.83B fp32
    parameters at 16 bytes each (weights, gradients, m, v) are 191 GiB, above the H200's 139.8 GiB
    before any activation; the forward-backward needs the weights and either the activations (end of
    forward) or the gradients (end of backward), about 96 GiB."""
    cfg = get_config("10B", 512)
    train = phase_timing.step_memory(cfg, mode="train", batch=4, context=512, capacity_bytes=H200_BYTES)
    assert train["end_of_backward_gib"] == pytest.approx(16 * 12_832_823_808 / GIB)
    assert train["over_capacity_gib"] > 50
    fwd_bwd = phase_timing.step_memory(cfg, mode="forward-backward", batch=4, context=512,
                                       capacity_bytes=H200_BYTES)
    assert fwd_bwd["over_capacity_gib"] < -30


def test_on_the_cpu_a_size_beyond_the_hosts_memory_is_refused_before_anything_runs(tmp_path, capsys, monkeypatch):
    # a CPU out of memory kills the process (or the shared machine): refuse by arithmetic there
    monkeypatch.setattr(sweeps, "host_memory_bytes", lambda: 24.0 * GIB)
    with pytest.raises(SystemExit) as exc:
        sweeps.main(["--part", "phases", "--device", "cpu", "--results-dir", str(tmp_path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--phase-sizes" in err and "2.7B needs 51 GiB" in err and len(err.strip().splitlines()) == 1
    assert not any(tmp_path.rglob("*.jsonl"))


def test_every_2026_size_is_attempted_10b_included(tmp_path, monkeypatch):
    """No cell is refused by the arithmetic: the sweep asks for all 2026 sizes by default (a fake
    model cache and measurement here, so nothing of 10B is built on the CPU)."""
    attempted = []

    class NoModels:
        def __init__(self, device):
            pass

        def get(self, size, context):
            return None

    def fake(model, cfg, *, mode, **kw):
        attempted.append((cfg.d_model, mode))
        return {"phases": []}

    monkeypatch.setattr(sweeps, "ModelCache", NoModels)
    monkeypatch.setattr(sweeps, "measure_phases", fake)
    monkeypatch.setattr(sweeps, "host_memory_bytes", lambda: float("inf"))  # as on a GPU: no refusal
    argv = ["--part", "phases", "--dtypes", "fp32", "--device", "cpu", "--results-dir", str(tmp_path)]
    assert sweeps.main(argv) == 0
    widths = [get_config(s).d_model for s in edition_presets("2026")]
    assert attempted == [(d, m) for d in widths for m in ("forward-backward", "train")]
    assert widths[-1] == 4608
