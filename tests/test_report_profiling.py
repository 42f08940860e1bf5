"""The Part 1 report modules (report/profiling.py, mixed_precision.py, memory.py,
attention.py): what they compute from rows written here, independent of
the committed results, and that every fact the chapters quote renders from the committed ones."""

from __future__ import annotations

import importlib
import json
import shutil

import pytest

from cs336_systems.attention.benchmarks.pytorch_sweep import attention_memory
from cs336_systems.bench.store import ResultStore, results_path
from cs336_systems.profiling.attention_oom import KEY as OOM_KEY
from cs336_systems.profiling.kernel_attribution import ATTRIBUTION
from report import registry
from report import results as report_results

PART1 = ("profiling", "mixed_precision",
         "memory", "attention")
PREFIXES = ("profiling.", "mixed_precision.", "memory.", "attention.")


@pytest.fixture
def results_root(tmp_path, monkeypatch):
    """An empty results tree the report layer reads instead of the committed one."""
    monkeypatch.setattr(report_results, "RESULTS_ROOT", tmp_path)
    return tmp_path


def test_every_part1_fact_renders_from_the_committed_results():
    for name in PART1:
        importlib.import_module(f"report.{name}")
    names = [n for n in registry.names("fact") if n.startswith(PREFIXES)]
    assert len(names) > 100
    for name in names:
        text = registry.fact(name)
        assert text and "nan" not in text.lower(), (name, text)


# ---- the bf16 cells measured twice (report.mixed_precision) -------------------------------------------

def test_remeasured_rows_pair_each_cells_first_and_newest_run_with_the_newest_clock_record(results_root):
    from report.mixed_precision import remeasured_rows, remeasured_table

    cell = {"schema": "cs336-results/1", "bench": "end-to-end/timings", "size": "xl", "mode": "forward",
            "dtype": "bf16", "status": "ok"}
    samples = [[0.25, 1980.0, 1980.0, 300.0, 40.0], [0.5, 1800.0, 1980.0, 650.0, 41.0]]
    rows = [{**cell, "mean_ms": 50.0, "std_ms": 1.0, "times_ms": [50.0] * 10, "time_utc": "2026-01-01T00:00:00Z"},
            {**cell, "size": "small", "mean_ms": 9.0, "std_ms": 1.0, "times_ms": [9.0] * 10,
             "time_utc": "2026-01-01T00:00:00Z"},  # measured once: not re-measured
            {**cell, "mean_ms": 75.0, "std_ms": 2.0, "times_ms": [75.0] * 10, "clock_samples": samples,
             "time_utc": "2026-01-02T00:00:00Z"},
            {**cell, "mean_ms": 60.0, "std_ms": 2.0, "times_ms": [60.0] * 10, "time_utc": "2026-01-01T12:00:00Z"}]
    path = results_path("end-to-end/timings", "nvidia-h200", results_root)
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = remeasured_rows()
    assert len(r) == 1
    row = r.iloc[0]
    assert (row["size"], row.first_ms, row.new_ms) == ("xl", 50.0, 75.0)  # by time, not by file order
    assert row.change == pytest.approx(0.5)
    assert (row.samples, row.sm_min, row.sm_max, row.sm_top, row.w_min, row.w_max) == (2, 1800, 1980, 1980, 300, 650)
    assert "| xl | forward | bf16 | 50.0 ± 1.0 | 75.0 ± 2.0 | +50% | 1800-1980 | 300-650 | 2 |" in remeasured_table()


# ---- the seq-32,768 allocator checks (report.attention_oom) ---------------------------------------------

def _oom_rows(root, split_32k_runs: bool) -> None:
    """The four check cells, in score matrices as the hypothesis predicts (or not)."""
    store = ResultStore("attention/oom_checks", OOM_KEY, device="nvidia-h200", root=root)
    mat = {s: attention_memory(8, s, 64)["one_score_matrix"] / 2**20 for s in (16384, 32768)}

    def peaks(seq, alloc, reserved):
        return {"peak_allocated_mib": alloc * mat[seq], "peak_reserved_mib": reserved * mat[seq]}

    cell = {"batch": 8, "d": 64}
    store.append({**cell, "seq": 16384, "alloc_conf": "default"}, {"ran": True, **peaks(16384, 4.0, 5.0)})
    store.append({**cell, "seq": 16384, "alloc_conf": "max_split_size_mb:1024"}, {"ran": True, **peaks(16384, 4.0, 4.0)})
    oom = {"ran": False, "oom_iteration": 0, "at_oom": peaks(32768, 3.0, 4.0), "tried_mib": 32768.0,
           "free_mib": 7680.0, "reserved_unallocated_mib": 32512.0}
    store.append({**cell, "seq": 32768, "alloc_conf": "default"}, oom, status="oom")
    split = {"ran": True, **peaks(32768, 4.0, 4.0)} if split_32k_runs else oom
    store.append({**cell, "seq": 32768, "alloc_conf": "max_split_size_mb:1024"}, split,
                 status="ok" if split_32k_runs else "oom")


@pytest.mark.parametrize("split_runs", [True, False])
def test_allocator_checks_in_score_matrices_and_the_verdict(results_root, split_runs):
    from report import attention as attention_oom

    _oom_rows(results_root, split_runs)
    assert attention_oom.stranded_block_confirmed() is split_runs
    table = attention_oom.checks_table()
    assert "| 16,384 | default | ran | 4.00 | 5.00 | — | — | — |" in table
    assert "| 32,768 | default | out of memory | 3.00 | 4.00 | 32.00 | 7.50 | 31.75 |" in table


# ---- the kernel double count (report.profiling) ----------------------------------------------

def _first_attribution_only(root) -> None:
    """Copy the committed profiler rows, keeping only those of the first attribution."""
    shutil.copytree(report_results.RESULTS_ROOT / "profiling", root / "profiling")
    for bench in ("kernel_cells", "kernels"):
        path = root / "profiling" / bench / "nvidia-h200.jsonl"
        rows = [line for line in path.read_text().splitlines()
                if "attribution" not in json.loads(line) and "cell_run" not in json.loads(line)]
        path.write_text("\n".join(rows) + "\n")


def test_marked_cells_then_a_rerun_that_replaces_their_kernels(tmp_path, monkeypatch):
    from report import profiling

    _first_attribution_only(tmp_path)
    monkeypatch.setattr(report_results, "RESULTS_ROOT", tmp_path)
    old = profiling.kernel_cells()
    marked = [(r["size"], r.context) for _, r in old.iterrows() if profiling.overcounted(r)]
    assert marked  # the first-attribution rows hold cells with more kernel time than wall time
    assert profiling.rerun_cells().empty
    cells, kernels = (tmp_path / "profiling" / b / "nvidia-h200.jsonl" for b in ("kernel_cells", "kernels"))
    with cells.open("a") as fc, kernels.open("a") as fk:
        for size, ctx in marked:  # a re-run of each marked cell with the fixed attribution
            r = old[(old["size"] == size) & (old["context"] == ctx)].iloc[-1].to_dict()
            run = f"run-{size}-{ctx}"
            for p in ("fwd", "bwd", "opt"):
                r[f"{p}_kernel_ms"] = 0.95 * r[f"{p}_range_ms"]
                r[f"{p}_appended_ms"] = 1.05 * r[f"{p}_kernel_ms"]
            r.update(attribution=ATTRIBUTION, cell_run=run, check_ok=True, copied_host_events=3,
                     colliding_host_ids=0, repeated_device_events=0, stream_overlap_ms=0.0,
                     launch_by_op=0, placed_by_gpu_time=0, time_utc="2099-01-01T00:00:00Z")
            fc.write(json.dumps(r) + "\n")
            for phase in ("forward", "backward", "optimizer"):
                fk.write(json.dumps({"schema": r["schema"], "bench": "profiling/kernels", "size": size,
                                     "context": ctx, "mode": "train", "dtype": "fp32", "phase": phase,
                                     "region": "", "kernel": "sm90_xmma_gemm", "matmul": True, "calls": 1,
                                     "total_ms": 1.0, "share": 1.0, "status": "ok", "cell_run": run,
                                     "time_utc": "2099-01-01T00:00:00Z"}) + "\n")
    assert not any(profiling.overcounted(r) for _, r in profiling.kernel_cells().iterrows())
    m = profiling.marked_rows()
    assert {(s, c) for s, c in zip(m["size"], m["context"])} == set(marked)
    assert (m["re-run: kernels ms"] < m["re-run: range ms"]).all()
    checks = profiling.rerun_checks()
    assert len(checks) == len(marked)
    assert checks["old sum over unique, fwd"].tolist() == pytest.approx([0.05] * len(marked))
    assert (checks["CPU events listed twice"] == 3).all()
    k = profiling.kernel_rows()
    size, ctx = marked[0]
    assert set(k[(k["size"] == size) & (k["context"] == ctx)]["kernel"]) == {"sm90_xmma_gemm"}  # no old rows mixed in


# ---- tables from rows written here ----------------------------------------------------------------------

def test_warmup_rows_read_zero_one_and_two_warmups_off_one_trace(results_root):
    from report.profiling import warmup_rows

    def write(bench, rows):
        path = results_path(bench, "nvidia-h200", results_root)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps({"schema": "cs336-results/1", "bench": bench, "status": "ok",
                                            "time_utc": "2026-01-01T00:00:00Z", **r}) + "\n" for r in rows))

    trace = [500.0, 110.0] + [100.0] * 10  # 12 steps: a slow first, a settling second, then steady
    write("end-to-end/warmup", [{"size": "small", "mode": "forward", "context_init_ms": 150.0, "step_ms": trace}])
    write("end-to-end/timings", [{"size": "small", "mode": "forward", "dtype": "fp32", "mean_ms": 101.0, "std_ms": 1.0}])
    w = warmup_rows().iloc[0]
    assert w.first_ms == 500.0 and w.steady_ms == 100.0 and w.extra_ms == 400.0
    assert w.w0_mean == pytest.approx(sum(trace[:10]) / 10)
    assert w.w1_mean == pytest.approx(sum(trace[1:11]) / 10)
    assert w.w2_mean == 100.0 and w.w2_std == 0.0
    assert w.w5_vs_w1 == pytest.approx(abs(101.0 / 101.0 - 1))
