"""The end-to-end benchmark CLI and the resumable Part 1 sweeps, on CPU with the tiny config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cs336_systems.bench.provenance import PROVENANCE_FIELDS
from cs336_systems.profiling import benchmark, sweeps

TINY = ["--size", "tiny", "--context-length", "16", "--warmup", "1", "--steps", "2", "--device", "cpu"]


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


@pytest.mark.parametrize("mode", ["forward", "forward-backward", "train"])
def test_cli_prints_mean_and_std_and_writes_a_row_with_provenance(tmp_path, capsys, mode):
    assert benchmark.main([*TINY, "--mode", mode, "--results-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "mean" in out and "std" in out and "tokens/s" in out
    [row] = rows(tmp_path / "end-to-end" / "runs" / "cpu.jsonl")
    assert row["status"] == "ok" and row["mode"] == mode and row["size"] == "tiny"
    assert len(row["times_ms"]) == 2 and row["mean_ms"] > 0 and row["std_ms"] >= 0
    assert all(row.get(f) for f in PROVENANCE_FIELDS)


def test_explicit_hyperparameters_override_the_preset(tmp_path):
    assert benchmark.main([*TINY, "--d-model", "32", "--num-heads", "2", "--results-dir", str(tmp_path)]) == 0
    [row] = rows(tmp_path / "end-to-end" / "runs" / "cpu.jsonl")
    assert (row["d_model"], row["num_heads"]) == (32, 2)


def test_torch_profile_mode_writes_a_chrome_trace_and_prints_the_phase_table(tmp_path, capsys):
    trace = tmp_path / "trace.json"
    assert benchmark.main([*TINY, "--mode", "train", "--profile", "torch", "--trace", str(trace),
                           "--results-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "[forward]" in out and "[backward]" in out and "[optimizer]" in out
    assert json.loads(trace.read_text())["traceEvents"]


@pytest.mark.parametrize("argv, needle", [
    (["--size", "huge"], "unknown model size 'huge'"),
    (["--size", "tiny", "--steps", "-3"], "--steps must be >= 1"),
    (["--size", "tiny", "--warmup", "-1"], "--warmup must be >= 0"),
    (["--size", "tiny", "--mode", "backward"], "--mode must be one of"),
    (["--size", "tiny", "--num-heads", "3"], "divisible by num_heads"),
    (["--size", "tiny", "--memory-snapshot", "x.pickle", "--device", "cpu"], "needs --device cuda"),
])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, capsys, argv, needle):
    with pytest.raises(SystemExit) as exc:
        benchmark.main([*argv, "--results-dir", str(tmp_path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err
    assert files_under(tmp_path) == []


def test_bf16_on_a_cpu_without_support_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(benchmark, "bf16_supported", lambda device: False)
    with pytest.raises(SystemExit) as exc:
        benchmark.main([*TINY, "--dtype", "bf16", "--results-dir", str(tmp_path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "bf16" in err
    assert files_under(tmp_path) == []


def test_a_results_file_that_is_not_ours_is_refused_and_left_alone(tmp_path, capsys):
    foreign = tmp_path / "end-to-end" / "runs" / "cpu.jsonl"
    foreign.parent.mkdir(parents=True)
    foreign.write_text("size,mean\nsmall,1.0\n")
    with pytest.raises(SystemExit) as exc:
        benchmark.main([*TINY, "--results-dir", str(tmp_path)])
    assert exc.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert foreign.read_text() == "size,mean\nsmall,1.0\n"


def test_a_killed_sweep_resumes_without_repeating_finished_cells(tmp_path, monkeypatch):
    """The 'timings' sweep dies (KeyboardInterrupt, as from a kill) at its third cell; re-running
    the same command measures only the cells not yet stored."""
    argv = ["--part", "timings", "--sizes", "tiny", "--context", "16", "--warmup", "0", "--steps", "2",
            "--device", "cpu", "--results-dir", str(tmp_path)]
    real = sweeps.measure
    seen: list[tuple] = []

    def dies_on_third(model, cfg, **kw):
        if len(seen) == 2:
            raise KeyboardInterrupt
        seen.append((kw["mode"], kw["dtype"]))
        return real(model, cfg, **kw)

    monkeypatch.setattr(sweeps, "measure", dies_on_third)
    with pytest.raises(KeyboardInterrupt):
        sweeps.main(argv)
    path = tmp_path / "end-to-end" / "timings" / "cpu.jsonl"
    assert len(rows(path)) == 2

    again: list[tuple] = []

    def counting(model, cfg, **kw):
        again.append((kw["mode"], kw["dtype"]))
        return real(model, cfg, **kw)

    monkeypatch.setattr(sweeps, "measure", counting)
    assert sweeps.main(argv) == 0
    stored = [(r["mode"], r["dtype"]) for r in rows(path)]
    assert len(stored) == 6 and len(set(stored)) == 6  # 3 modes x 2 dtypes, each once
    assert not set(again) & set(seen)  # finished cells were not measured again


def test_a_spent_time_budget_stops_before_the_next_cell_and_resumes(tmp_path):
    argv = ["--part", "timings", "--sizes", "tiny", "--context", "16", "--warmup", "0", "--steps", "2",
            "--modes", "forward", "--device", "cpu", "--results-dir", str(tmp_path)]
    assert sweeps.main([*argv, "--budget-s", "1e-9"]) == 3  # budget spent before the first cell
    assert not (tmp_path / "end-to-end" / "timings" / "cpu.jsonl").exists()
    assert sweeps.main(argv) == 0
    assert len(rows(tmp_path / "end-to-end" / "timings" / "cpu.jsonl")) == 2


def test_warmup_stats_read_windows_off_one_trace():
    trace = [100.0, 10.0, 12.0, 10.0, 12.0]
    assert sweeps.warmup_stats(trace, 0, 2) == {"mean_ms": 55.0, "std_ms": pytest.approx(63.6396, rel=1e-4)}
    assert sweeps.warmup_stats(trace, 1, 2)["mean_ms"] == 11.0
    with pytest.raises(ValueError):
        sweeps.warmup_stats(trace, 4, 2)


@pytest.mark.parametrize("module, argv, files", [
    ("cs336_systems.profiling.kernel_sweep", ["--sizes", "tiny", "--contexts", "16", "--warmup", "1"],
     ["profiling/kernel_cells", "profiling/kernels"]),
    ("cs336_systems.profiling.memory_sweep", ["--size", "tiny", "--contexts", "16", "--dtypes", "fp32"],
     ["memory/peaks"]),
    ("cs336_systems.attention.pytorch_sweep", ["--impls", "eager", "--ds", "16", "--seqs", "32",
                                               "--probe-seqs", "", "--steps", "2", "--warmup", "1"],
     ["attention/pytorch_attention"]),
])
def test_every_sweep_runs_on_cpu_and_writes_its_rows(tmp_path, module, argv, files):
    """The CPU smoke of each GPU sweep, so a GPU call never dies of a typo."""
    import importlib

    main = importlib.import_module(module).main
    assert main([*argv, "--device", "cpu", "--results-dir", str(tmp_path)]) == 0
    for bench in files:
        stored = rows(tmp_path / bench / "cpu.jsonl")
        assert stored and all(r["status"] == "ok" for r in stored)
