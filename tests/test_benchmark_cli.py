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
    """The 'timings' sweep dies (KeyboardInterrupt, as from a kill) at its third cell; the same
    command with --resume measures only the cells that run did not finish."""
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
    assert sweeps.main([*argv, "--resume"]) == 0
    stored = [(r["mode"], r["dtype"]) for r in rows(path)]
    assert len(stored) == 6 and len(set(stored)) == 6  # 3 modes x 2 dtypes, each once
    assert not set(again) & set(seen)  # finished cells were not measured again


def test_a_spent_time_budget_stops_before_the_next_cell_and_resumes(tmp_path):
    argv = ["--part", "timings", "--sizes", "tiny", "--context", "16", "--warmup", "0", "--steps", "2",
            "--modes", "forward", "--device", "cpu", "--results-dir", str(tmp_path)]
    assert sweeps.main([*argv, "--budget-s", "1e-9"]) == 3  # budget spent before the first cell
    assert not (tmp_path / "end-to-end" / "timings" / "cpu.jsonl").exists()
    assert sweeps.main([*argv, "--budget-s", "1000"]) == 0
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
    ("cs336_systems.attention.benchmarks.pytorch_sweep", ["--impls", "eager", "--ds", "16", "--seqs", "32",
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


def test_kernel_sweep_takes_explicit_cells_and_redoes_only_rows_of_an_older_attribution(tmp_path):
    from cs336_systems.profiling import kernel_sweep

    argv = ["--cells", "tiny:16", "--warmup", "1", "--device", "cpu", "--results-dir", str(tmp_path)]
    cells = tmp_path / "profiling" / "kernel_cells" / "cpu.jsonl"
    kernels = tmp_path / "profiling" / "kernels" / "cpu.jsonl"
    assert kernel_sweep.main(argv) == 0
    [row] = rows(cells)
    assert row["attribution"] == kernel_sweep.CPU_ATTRIBUTION and row["cell_run"]
    assert {r["cell_run"] for r in rows(kernels)} == {row["cell_run"]}
    assert kernel_sweep.main([*argv, "--redo-stale"]) == 0 and len(rows(cells)) == 1  # current: kept
    old = {k: v for k, v in row.items() if k not in ("attribution", "cell_run")}
    cells.write_text(json.dumps(old) + "\n")  # a row of the first attribution
    assert kernel_sweep.main([*argv, "--redo-stale"]) == 0
    assert [r.get("attribution") for r in rows(cells)] == [None, kernel_sweep.CPU_ATTRIBUTION]
    assert kernel_sweep.main(argv) == 0 and len(rows(cells)) == 3  # without the flag: measured again


@pytest.mark.parametrize("bad", ["tiny", "tiny:x", "tiny:16,small"])
def test_kernel_sweep_rejects_malformed_cells(tmp_path, capsys, bad):
    from cs336_systems.profiling import kernel_sweep

    with pytest.raises(SystemExit) as exc:
        kernel_sweep.main(["--cells", bad, "--device", "cpu", "--results-dir", str(tmp_path)])
    assert exc.value.code == 2 and "--cells" in capsys.readouterr().err


def test_attention_oom_checks_run_each_cell_in_a_fresh_process_on_cpu(tmp_path):
    from cs336_systems.profiling import attention_oom

    argv = ["--seqs", "16", "--d", "4", "--batch", "2", "--iterations", "2", "--device", "cpu",
            "--results-dir", str(tmp_path)]
    assert attention_oom.main(argv) == 0
    stored = rows(tmp_path / "attention" / "oom_checks" / "cpu.jsonl")
    assert [(r["seq"], r["alloc_conf"], r["status"]) for r in stored] == [
        (16, "default", "ok"), (16, "max_split_size_mb:1024", "ok")]
    assert all(r["ran"] and len(r["iterations"]) == 2 for r in stored)
    path = tmp_path / "attention" / "oom_checks" / "cpu.jsonl"
    assert attention_oom.main([*argv, "--resume"]) == 0 and len(rows(path)) == 2  # that run is complete
    assert attention_oom.main(argv) == 0 and len(rows(path)) == 4  # a new run measures again


def test_the_allocator_oom_message_is_parsed_into_mib():
    from cs336_systems.bench.oom import parse_oom_message

    message = ("CUDA out of memory. Tried to allocate 32.00 GiB. GPU 0 has a total capacity of 139.81 GiB "
               "of which 7.50 GiB is free. Including non-PyTorch memory, this process has 132.30 GiB memory "
               "in use. Of the allocated memory 128.06 GiB is allocated by PyTorch, and 512.00 MiB is "
               "reserved by PyTorch but unallocated. If reserved but unallocated memory is large try ...")
    got = parse_oom_message(message)
    assert got == {"tried_mib": 32 * 1024.0, "capacity_mib": pytest.approx(139.81 * 1024),
                   "free_mib": 7.5 * 1024, "process_in_use_mib": pytest.approx(132.3 * 1024),
                   "allocated_by_pytorch_mib": pytest.approx(128.06 * 1024), "reserved_unallocated_mib": 512.0}
    assert parse_oom_message("CUDA out of memory")["tried_mib"] is None


def fake_nvidia_smi(tmp_path, monkeypatch, line="1755, 1980, 412.37, 51"):
    """An nvidia-smi on PATH that answers every query with one CSV line."""
    import os

    script = tmp_path / "bin" / "nvidia-smi"
    script.parent.mkdir()
    script.write_text(f"#!/bin/sh\necho '{line}'\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")


def test_clock_sampler_reads_nvidia_smi_before_during_and_after(tmp_path, monkeypatch):
    import time

    from cs336_systems.profiling.clocks import ClockSampler, query_gpu

    fake_nvidia_smi(tmp_path, monkeypatch)
    assert query_gpu() == {"sm_mhz": 1755.0, "max_sm_mhz": 1980.0, "power_w": 412.37, "temperature_c": 51.0}
    with ClockSampler(period_s=0.02) as sampler:
        time.sleep(0.3)
    rec = sampler.record()
    assert rec["clocks_before"]["sm_mhz"] == rec["clocks_after"]["sm_mhz"] == 1755.0
    assert len(rec["clock_samples"]) >= 2 and rec["clock_samples"][0][1:] == [1755.0, 1980.0, 412.37, 51.0]
    assert rec["sm_mhz_min"] == rec["sm_mhz_max"] == 1755.0


def test_clock_sampler_without_nvidia_smi_records_nothing(monkeypatch, tmp_path):
    from cs336_systems.profiling.clocks import ClockSampler

    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi here
    with ClockSampler(period_s=0.01) as sampler:
        pass
    assert sampler.record()["clocks_before"] is None and sampler.record()["clock_samples"] == []


def test_record_clocks_remeasures_timing_cells_stored_without_clocks(tmp_path, monkeypatch):
    fake_nvidia_smi(tmp_path, monkeypatch)
    argv = ["--part", "timings", "--sizes", "tiny", "--context", "16", "--warmup", "1", "--steps", "2",
            "--modes", "forward", "--dtypes", "fp32", "--device", "cpu", "--results-dir", str(tmp_path)]
    path = tmp_path / "end-to-end" / "timings" / "cpu.jsonl"
    assert sweeps.main(argv) == 0 and "clock_samples" not in rows(path)[0]
    assert sweeps.main([*argv, "--record-clocks"]) == 0
    assert [("clock_samples" in r) for r in rows(path)] == [False, True]
    assert rows(path)[1]["clocks_before"]["sm_mhz"] == 1755.0
    assert sweeps.main([*argv, "--record-clocks"]) == 0 and len(rows(path)) == 2  # every cell has clocks


def test_a_sweep_whose_cells_fail_exits_1_so_bench_all_reports_it(tmp_path, monkeypatch, capsys):
    from cs336_systems.bench.__main__ import main as bench_main

    def broken(model, cfg, **kw):
        raise RuntimeError("kernel said no")

    monkeypatch.setattr(sweeps, "measure", broken)
    argv = ["end-to-end", "--part", "timings", "--sizes", "tiny", "--context", "16", "--modes", "forward",
            "--dtypes", "fp32", "--device", "cpu", "--results-dir", str(tmp_path)]
    assert bench_main(argv) == 1
    assert "1 of 1 cells failed" in capsys.readouterr().err
    assert [r["status"] for r in rows(tmp_path / "end-to-end" / "timings" / "cpu.jsonl")] == ["error"]


def test_memory_measures_stored_cells_again_and_remeasure_is_the_default(tmp_path, capsys):
    # Every run measures every cell and appends a new row (readers keep the newest); --remeasure,
    # which asked for that before, is still accepted and says it is no longer needed.
    from cs336_systems.profiling import memory_sweep

    argv = ["--size", "tiny", "--contexts", "16", "--dtypes", "fp32", "--modes", "train", "--device", "cpu",
            "--results-dir", str(tmp_path)]
    assert memory_sweep.main(argv) == 0 and memory_sweep.main(argv) == 0
    assert len(rows(tmp_path / "memory" / "peaks" / "cpu.jsonl")) == 2
    assert memory_sweep.main([*argv, "--remeasure"]) == 0
    assert len(rows(tmp_path / "memory" / "peaks" / "cpu.jsonl")) == 3
    assert "--remeasure: every run measures every cell now" in capsys.readouterr().err


def test_snapshot_cells_measured_without_their_timeline_are_measured_again(tmp_path):
    # A snapshot cell added to the defaults after its peak row was stored (the 2026 edition's 128)
    # has no timeline yet: the GPU run must measure it again. One that ran out of memory has none to take.
    from cs336_systems.bench.store import ResultStore
    from cs336_systems.profiling import memory_sweep

    key = memory_sweep.KEY
    peaks = ResultStore("memory/peaks", key, device="cpu", root=tmp_path)
    timelines = ResultStore("memory/timeline", key, device="cpu", root=tmp_path)
    cell = {"size": "2.7B", "mode": "train", "dtype": "fp32", "batch": 4}
    cells = [{**cell, "context": c} for c in (128, 512, 2048)]
    peaks.append(cells[0], {"peak_mib": 1.0})
    peaks.append(cells[1], {"peak_mib": 2.0})
    timelines.append({k: cells[1][k] for k in key}, {"gib": [1.0]})
    peaks.append(cells[2], status="oom")
    snap = {"128/train/fp32", "512/train/fp32", "2048/train/fp32"}
    assert memory_sweep.missing_timelines(cells, snap, peaks, timelines) == [cells[0]]
    assert memory_sweep.missing_timelines(cells, set(), peaks, timelines) == []
    assert {"128/forward/fp32", "128/train/fp32", "2048/forward/fp32"} <= set(memory_sweep.SNAPSHOT_CELLS)
