"""The results store and sweep runner: rows survive a crash, re-runs skip finished cells, OOM is a row."""

from __future__ import annotations

import json

import pytest
import torch

from cs336_systems.bench.store import SCHEMA, NotOurResultsFile, ResultStore, results_path
from cs336_systems.bench.sweep import run_sweep


def test_rows_carry_config_metrics_status_and_provenance(tmp_path):
    store = ResultStore("demo/bench", key=["n"], root=tmp_path, device="cpu")
    store.append({"n": 3}, {"ms": 1.5})
    [row] = store.rows()
    assert row["n"] == 3 and row["ms"] == 1.5 and row["status"] == "ok" and row["schema"] == SCHEMA
    for field in ("device", "torch", "triton", "cuda", "git", "time_utc"):
        assert row[field], field
    assert store.path == tmp_path / "demo" / "bench" / "cpu.jsonl"


def test_cpu_and_gpu_results_live_in_different_files(tmp_path):
    assert results_path("a/b", "cpu", tmp_path) != results_path("a/b", "nvidia-h200", tmp_path)


def test_sweep_resumes_without_repeating_finished_cells(tmp_path):
    cells = [{"n": n} for n in range(5)]
    calls: list[int] = []

    def dies_at_three(cell):
        if cell["n"] == 3:
            raise KeyboardInterrupt  # the process is killed mid-sweep
        calls.append(cell["n"])
        return {"sq": cell["n"] ** 2}

    store = ResultStore("demo/sweep", key=["n"], root=tmp_path, device="cpu")
    with pytest.raises(KeyboardInterrupt):
        run_sweep(store, cells, dies_at_three)
    assert calls == [0, 1, 2]

    calls.clear()
    fresh = ResultStore("demo/sweep", key=["n"], root=tmp_path, device="cpu")  # a new process
    run_sweep(fresh, cells, lambda c: (calls.append(c["n"]), {"sq": c["n"] ** 2})[1])
    assert calls == [3, 4]
    assert sorted(r["n"] for r in fresh.rows()) == [0, 1, 2, 3, 4]


def test_oom_is_a_result_and_errors_are_retried(tmp_path):
    def measure(cell):
        if cell["n"] == 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 8 GiB")
        if cell["n"] == 2:
            raise RuntimeError("flaky")
        return {"ok": True}

    store = ResultStore("demo/oom", key=["n"], root=tmp_path, device="cpu")
    run_sweep(store, [{"n": n} for n in range(3)], measure)
    status = {r["n"]: r["status"] for r in store.rows()}
    assert status == {0: "ok", 1: "oom", 2: "error"}
    assert store.has({"n": 1}) and not store.has({"n": 2})  # the error row is measured again


def test_torn_last_line_is_ignored(tmp_path):
    store = ResultStore("demo/torn", key=["n"], root=tmp_path, device="cpu")
    store.append({"n": 1}, {"x": 1})
    with open(store.path, "a") as f:
        f.write('{"schema": "cs336-res')  # killed mid-write
    assert [r["n"] for r in ResultStore("demo/torn", key=["n"], root=tmp_path, device="cpu").rows()] == [1]


def test_refuses_a_file_that_is_not_ours(tmp_path):
    path = results_path("demo/foreign", "cpu", tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"something": "else"}) + "\n")
    with pytest.raises(NotOurResultsFile):
        ResultStore("demo/foreign", key=["n"], root=tmp_path, device="cpu")


@pytest.mark.parametrize("bench", ["", "/abs", "../up"])
def test_bench_names_must_be_relative(bench, tmp_path):
    with pytest.raises(ValueError, match="bench"):
        results_path(bench, "cpu", tmp_path)
