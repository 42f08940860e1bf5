"""The longest power-of-two context that fits, found by trying (nsys_profile, 2026), and the kernel
sweep that profiles there, on the CPU: out-of-memory errors are injected above a chosen context."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cs336_systems.bench.store import ResultStore
from cs336_systems.profiling import context_probe, kernel_sweep

CELL = {"size": "tiny", "mode": "train", "dtype": "fp32", "batch": 4}
OOM = ("CUDA out of memory. Tried to allocate 12.00 GiB. GPU 0 has a total capacity of 139.81 GiB of which "
       "3.50 GiB is free.")


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def fits_up_to(longest: int, seen: list[int]):
    def run_at(ctx: int) -> dict:
        seen.append(ctx)
        if ctx > longest:
            raise torch.OutOfMemoryError(OOM)
        return {"peak_mib": float(ctx)}
    return run_at


def test_the_probe_doubles_until_the_first_oom_and_stores_that_row(tmp_path):
    store = ResultStore(context_probe.BENCH, context_probe.KEY, device="cpu", root=tmp_path)
    seen: list[int] = []
    probe = context_probe.probe_longest_context(store, CELL, fits_up_to(1024, seen), start=256, limit=16384)
    assert (probe.longest, probe.first_oom) == (1024, 2048)
    assert seen == [256, 512, 1024, 2048]
    assert [r["status"] for r in probe.rows] == ["ok", "ok", "ok", "oom"]
    assert probe.rows[-1]["tried_mib"] == 12 * 1024 and probe.rows[-1]["free_mib"] == 3.5 * 1024
    assert probe.profile_contexts(256) == [256, 512, 1024]  # three above 128, the largest the longest


def test_a_probe_run_again_reads_its_rows_instead_of_measuring(tmp_path):
    store = ResultStore(context_probe.BENCH, context_probe.KEY, device="cpu", root=tmp_path)
    context_probe.probe_longest_context(store, CELL, fits_up_to(512, []), start=256, limit=16384)
    seen: list[int] = []
    again = context_probe.probe_longest_context(store, CELL, fits_up_to(512, seen), start=256, limit=16384)
    assert seen == [] and (again.longest, again.first_oom) == (512, 1024)
    assert again.profile_contexts(256) == [256, 512]  # only two fit above 128: the caller warns


def test_a_probe_that_never_runs_out_stops_at_its_limit_and_other_errors_propagate(tmp_path):
    store = ResultStore(context_probe.BENCH, context_probe.KEY, device="cpu", root=tmp_path)
    probe = context_probe.probe_longest_context(store, CELL, fits_up_to(10**6, []), start=16, limit=64)
    assert (probe.longest, probe.first_oom) == (64, None)
    assert probe.profile_contexts(16) == [16, 32, 64] and probe.profile_contexts(64) == [64]

    def broken(ctx):
        raise RuntimeError("not a memory problem")

    with pytest.raises(RuntimeError, match="not a memory"):
        context_probe.probe_longest_context(store, {**CELL, "size": "other"}, broken, start=16, limit=64)
    with pytest.raises(ValueError, match="start"):
        context_probe.probe_longest_context(store, CELL, broken, start=64, limit=16)


def test_the_kernel_sweep_profiles_the_longest_context_that_fits_and_the_two_below(tmp_path, monkeypatch, capsys):
    real = kernel_sweep.step_at

    def oom_above_32(model, *, context, **kw):
        if context > 32:
            raise torch.OutOfMemoryError(OOM)
        return real(model, context=context, **kw)

    monkeypatch.setattr(kernel_sweep, "step_at", oom_above_32)
    argv = ["--longest-fit", "tiny", "--probe-start", "8", "--probe-limit", "128", "--warmup", "1",
            "--device", "cpu", "--results-dir", str(tmp_path)]
    assert kernel_sweep.main(argv) == 0
    probed = rows(tmp_path / "profiling" / "context_probe" / "cpu.jsonl")
    assert [(r["context"], r["status"]) for r in probed] == [(8, "ok"), (16, "ok"), (32, "ok"), (64, "oom")]
    assert len(probed[0]["step_ms"]) == context_probe.PROBE_STEPS
    cells = rows(tmp_path / "profiling" / "longest_fit_cells" / "cpu.jsonl")
    assert [(r["size"], r["context"], r["status"]) for r in cells] == [("tiny", c, "ok") for c in (8, 16, 32)]
    kernels = rows(tmp_path / "profiling" / "longest_fit_kernels" / "cpu.jsonl")
    assert {r["cell_run"] for r in kernels} == {r["cell_run"] for r in cells}
    assert not (tmp_path / "profiling" / "kernel_cells").exists()  # the 2025 grid's file: untouched
    assert "the longest context that fits is 32, 64 does not" in capsys.readouterr().err


@pytest.mark.parametrize("argv, needle", [
    (["--longest-fit", "tiny", "--cells", "tiny:16"], "--longest-fit"),
    (["--longest-fit", "tiny", "--probe-start", "64", "--probe-limit", "32"], "--probe-limit"),
    (["--longest-fit", "huge"], "--longest-fit"),
])
def test_bad_probe_arguments_exit_2_naming_the_flag(tmp_path, capsys, argv, needle):
    with pytest.raises(SystemExit) as exc:
        kernel_sweep.main([*argv, "--device", "cpu", "--results-dir", str(tmp_path)])
    assert exc.value.code == 2 and needle in capsys.readouterr().err
    assert not any(tmp_path.rglob("*.jsonl"))
