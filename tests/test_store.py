"""The results store and sweep runner: rows survive a crash, re-runs skip finished cells, OOM is a row."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from cs336_systems.bench import store as store_module
from cs336_systems.bench.store import (
    SCHEMA,
    NotOurResultsFile,
    ResultStore,
    SkippedLineWarning,
    UncommittedCode,
    results_path,
)
from cs336_systems.bench.sweep import EXIT_FAILED, EXIT_INCOMPLETE, EXIT_OK, exit_code, run_sweep, worst


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
    # a new process resuming the interrupted run (the CLIs' --resume RUN)
    resumed = ResultStore("demo/sweep", key=["n"], root=tmp_path, device="cpu", invocation=store.invocation)
    run_sweep(resumed, cells, lambda c: (calls.append(c["n"]), {"sq": c["n"] ** 2})[1])
    assert calls == [3, 4]
    assert sorted(r["n"] for r in resumed.rows()) == [0, 1, 2, 3, 4]
    assert {r["invocation"] for r in resumed.rows()} == {store.invocation}  # one run, resumed


def test_a_new_invocation_measures_every_cell_again(tmp_path):
    """Stored rows (the committed ones, say) are the reference, not a resume point."""
    cells = [{"n": n} for n in range(3)]
    first = ResultStore("demo/again", key=["n"], root=tmp_path, device="cpu")
    run_sweep(first, cells, lambda c: {"sq": c["n"] ** 2})
    calls: list[int] = []
    second = ResultStore("demo/again", key=["n"], root=tmp_path, device="cpu")  # a new invocation
    run_sweep(second, cells, lambda c: (calls.append(c["n"]), {"sq": c["n"] ** 2})[1])
    assert calls == [0, 1, 2] and second.invocation != first.invocation
    assert [r["invocation"] for r in second.rows()] == [first.invocation] * 3 + [second.invocation] * 3
    assert all(r["cell_wall_s"] >= 0 for r in second.rows())


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
    oom = next(r for r in store.rows() if r["n"] == 1)
    assert oom["tried_mib"] == 8 * 1024  # the message's request, in MiB: by how much it missed
    assert store.has({"n": 1}) and not store.has({"n": 2})  # the error row is measured again


def test_an_oom_row_keeps_the_context_its_measurement_attached(tmp_path):
    def measure(cell):
        exc = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")
        exc.oom_context = {"oom_phase": "optimizer", "predicted_lower_bound_gib": 191.2}
        raise exc

    store = ResultStore("demo/oom-context", key=["n"], root=tmp_path, device="cpu")
    [row] = run_sweep(store, [{"n": 0}], measure)
    assert row["status"] == "oom" and row["tried_mib"] == 2048
    assert row["oom_phase"] == "optimizer" and row["predicted_lower_bound_gib"] == 191.2


def test_a_sweep_with_a_failed_cell_exits_1_naming_it(tmp_path, capsys):
    store = ResultStore("demo/fail", key=["n"], root=tmp_path, device="cpu")

    def measure(cell):
        if cell["n"] == 1:
            raise RuntimeError("kernel said no")
        return {"ok": True}

    rows = run_sweep(store, [{"n": n} for n in range(3)], measure)
    assert exit_code(rows, "demo/fail") == EXIT_FAILED
    assert "1 of 3 cells failed" in capsys.readouterr().err
    assert exit_code([r for r in rows if r["status"] == "ok"]) == EXIT_OK
    assert worst(EXIT_OK, EXIT_INCOMPLETE) == EXIT_INCOMPLETE
    assert worst(EXIT_INCOMPLETE, EXIT_FAILED, EXIT_OK) == EXIT_FAILED


# -- a writer killed mid-row loses no finished row ---------------------------------------------

def _store(root):
    return ResultStore("demo/torn", key=["n"], root=root, device="cpu")


def test_a_torn_last_line_is_skipped_with_a_warning_naming_file_and_line(tmp_path):
    store = _store(tmp_path)
    store.append({"n": 1}, {"x": 1})
    with open(store.path, "a") as f:
        f.write('{"schema": "cs336-res')  # killed mid-write
    with pytest.warns(SkippedLineWarning, match=rf"{store.path}:2: skipped torn last line"):
        assert [r["n"] for r in _store(tmp_path).rows()] == [1]


def test_the_next_append_moves_a_torn_tail_aside_and_lands_on_its_own_line(tmp_path):
    store = _store(tmp_path)
    store.append({"n": 1}, {"x": 1})
    with open(store.path, "a") as f:
        f.write('{"schema": "cs336-res')
    with pytest.warns(SkippedLineWarning, match=rf"{store.path}:2: skipped torn last line"):
        reopened = _store(tmp_path)  # a new process opens the file
    with pytest.warns(SkippedLineWarning, match=rf"{store.path}:2: torn last line moved"):
        reopened.append({"n": 2}, {"x": 2})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the file is clean again: no warning at all
        assert [r["n"] for r in _store(tmp_path).rows()] == [1, 2]
    assert Path(f"{store.path}.torn").read_text() == '{"schema": "cs336-res\n'
    _store(tmp_path).append({"n": 3}, {"x": 3})  # and the append after that, too
    assert [r["n"] for r in _store(tmp_path).rows()] == [1, 2, 3]


def test_a_whole_row_missing_only_its_newline_is_kept(tmp_path):
    store = _store(tmp_path)
    row = store.append({"n": 1}, {"x": 1})
    store.path.write_text(json.dumps(row))  # the newline never made it to disk
    _store(tmp_path).append({"n": 2}, {"x": 2})
    assert [r["n"] for r in _store(tmp_path).rows()] == [1, 2]
    assert not Path(f"{store.path}.torn").exists()


def test_an_old_glued_line_in_the_middle_is_skipped_with_a_warning(tmp_path):
    """Files from before the repair may hold a torn row with the next row glued on."""
    store = _store(tmp_path)
    first = store.append({"n": 1}, {"x": 1})
    glued = '{"schema": "cs336-res' + json.dumps({**first, "n": 2})
    with open(store.path, "a") as f:
        f.write(glued + "\n" + json.dumps({**first, "n": 3}) + "\n")
    with pytest.warns(SkippedLineWarning, match=rf"{store.path}:2: skipped line: a torn row"):
        assert [r["n"] for r in _store(tmp_path).rows()] == [1, 3]


WRITER = """
import itertools, sys
from cs336_systems.bench.store import ResultStore
store = ResultStore("demo/killed", key=["n"], root=sys.argv[1], device="cpu")
for n in itertools.count():
    store.append({"n": n}, {"payload": "x" * 2_000_000})  # 2 MB rows: a write takes a while
    print(n, flush=True)  # row n is finished (flushed and fsynced)
"""


def _kill_writer_mid_row(root: Path) -> tuple[Path, list[int]]:
    """Start WRITER, SIGKILL it while the file size says a row is half-written; return the file
    and the rows the writer reported finished."""
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(root)], stdout=subprocess.PIPE,
                              text=True, cwd=Path(__file__).resolve().parents[1])
    finished = [int(writer.stdout.readline())]
    path = root / "demo" / "killed" / "cpu.jsonl"
    row_bytes = path.stat().st_size  # rows 0..9 all have this length
    deadline = time.monotonic() + 20
    while path.stat().st_size % row_bytes == 0 and time.monotonic() < deadline:
        pass  # the kernel grows the file page by page while write() copies a row in
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    return path, finished + [int(line) for line in writer.stdout.read().split()]


def test_a_writer_killed_mid_row_keeps_every_finished_row(tmp_path):
    """SIGKILL a process appending rows in a loop, mid-row. Every row it reported finished is read
    back, the torn tail is reported with file and line, and the next append lands and reads back."""
    torn_seen = False
    for attempt in range(3):  # a kill can land just after a write completes: try again
        root = tmp_path / str(attempt)
        path, finished = _kill_writer_mid_row(root)
        torn = not path.read_bytes().endswith(b"\n")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            store = ResultStore("demo/killed", key=["n"], root=root, device="cpu")
            stored = [r["n"] for r in store.rows()]
        assert stored[:len(finished)] == finished  # every finished row, in order
        assert len(stored) <= len(finished) + 1  # at most the row being written when killed
        if torn:
            where = f"{path}:{len(stored) + 1}: skipped torn last line"
            assert any(where in str(w.message) for w in caught), [str(w.message) for w in caught]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            store.append({"n": -1}, {"after": "the kill"})
        again = ResultStore("demo/killed", key=["n"], root=root, device="cpu").rows()
        assert [r["n"] for r in again] == [*stored, -1]
        torn_seen |= torn
        if torn_seen:
            break
    assert torn_seen, "three kills, none mid-row: the test did not test the repair"


# -- committed results come from committed code -----------------------------------------------

@pytest.fixture
def committed_root(tmp_path, monkeypatch):
    """A stand-in for the repository's results/ (so the test never writes there)."""
    root = tmp_path / "committed"
    monkeypatch.setattr(store_module, "COMMITTED_ROOT", root)
    monkeypatch.delenv("CS336_ALLOW_DIRTY", raising=False)
    return root


def _pretend_commit(monkeypatch, commit: str) -> None:
    """The code is at `commit`, for the store's check and for the rows' provenance."""
    monkeypatch.setattr(store_module, "git_commit", lambda: commit)
    monkeypatch.setattr("cs336_systems.bench.provenance.git_commit", lambda: commit)


@pytest.mark.parametrize("commit", ["0123456789ab-dirty", "unknown"])
def test_committed_results_refuse_rows_from_untraceable_code(committed_root, tmp_path, monkeypatch, commit):
    _pretend_commit(monkeypatch, commit)
    store = ResultStore("demo/dirty", key=["n"], root=committed_root, device="cpu")
    with pytest.raises(UncommittedCode, match="CS336_ALLOW_DIRTY=1"):
        store.append({"n": 1}, {"x": 1})
    with pytest.raises(UncommittedCode):
        run_sweep(store, [{"n": 1}], lambda c: pytest.fail("measured before refusing"))
    assert not store.path.exists()
    for scratch_root in (tmp_path / "scratch", committed_root / "_local"):  # scratch takes any tree
        scratch = ResultStore("demo/dirty", key=["n"], root=scratch_root, device="cpu")
        assert scratch.append({"n": 1}, {"x": 1})["git"] == commit


def test_allow_dirty_writes_rows_labelled_dirty(committed_root, monkeypatch):
    _pretend_commit(monkeypatch, "0123456789ab-dirty")
    monkeypatch.setenv("CS336_ALLOW_DIRTY", "1")
    row = ResultStore("demo/dirty", key=["n"], root=committed_root, device="cpu").append({"n": 1})
    assert row["git"] == "0123456789ab-dirty"


def test_the_device_runs_commit_is_trusted(committed_root, monkeypatch):
    """The GPU machine's .git may be stale: the launcher's CS336_GIT_COMMIT is what ran."""
    from cs336_systems.bench import provenance

    monkeypatch.setenv("CS336_GIT_COMMIT", "fedcba987654")
    provenance.git_commit.cache_clear()
    try:
        row = ResultStore("demo/device", key=["n"], root=committed_root, device="cpu").append({"n": 1})
    finally:
        provenance.git_commit.cache_clear()
    assert row["git"] == "fedcba987654"


def test_changes_under_results_do_not_make_the_tree_dirty():
    from cs336_systems.bench.provenance import _CODE_PATHSPEC

    assert ":(top,exclude)results" in _CODE_PATHSPEC


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


# -- issue 28: a writer checks the file before the first cell; the site build shows skipped lines --

def test_a_writer_refuses_what_a_reader_would_skip_naming_file_and_line(tmp_path):
    from cs336_systems.bench.store import check_results_file

    path = tmp_path / "x.jsonl"
    good = json.dumps({"schema": SCHEMA, "n": 1, "status": "ok"})
    cases = {  # content -> what the refusal says
        f"{good}\nxyz garbage\n{good}\n".encode(): f"{path}:2: not JSON",
        f"{good}\n".encode() + b'{"schema": "\xfe"}\n': f"{path}:2: not UTF-8",
        f"{good}\nxyz garbage".encode(): f"{path}:2: not JSON",  # a torn tail that is no row
        json.dumps({"schema": SCHEMA, "m": 1}).encode() + b"\n": f"{path}:1: row lacks key field(s) n",
    }
    for content, says in cases.items():
        path.write_bytes(content)
        with pytest.raises(NotOurResultsFile, match=re.escape(says)):
            check_results_file(path, ["n"])
    path.write_bytes(f'{good}\n{{"schema": "cs3'.encode())  # a killed writer's tail: repaired, not refused
    with pytest.warns(SkippedLineWarning, match=rf"{path}:2: skipped torn last line"):
        assert len(check_results_file(path, ["n"])) == 1


def test_a_reader_skips_a_line_that_is_not_utf8_with_a_warning_instead_of_failing(tmp_path):
    path = tmp_path / "x.jsonl"
    good = json.dumps({"schema": SCHEMA, "n": 1})
    path.write_bytes(f"{good}\n".encode() + b"\xff\xfe\n" + f"{good}\n".encode())
    with pytest.warns(SkippedLineWarning, match=rf"{path}:2: skipped line: not UTF-8"):
        assert len(store_module.read_rows(path)) == 2


def test_a_destination_that_cannot_hold_the_file_is_refused(tmp_path):
    from cs336_systems.bench.store import BadDestination, check_destination

    a_file = tmp_path / "f"
    a_file.write_text("x")
    for bad in (a_file / "sub" / "x.jsonl", Path("/proc/cs336/x.jsonl"), Path("/sys/cs336/x.jsonl")):
        with pytest.raises(BadDestination):
            check_destination(bad)
    (tmp_path / "d.jsonl").mkdir()
    with pytest.raises(BadDestination, match="not a regular file"):
        check_destination(tmp_path / "d.jsonl")
    check_destination(tmp_path / "new" / "deeper" / "x.jsonl")  # creatable: fine
    assert not (tmp_path / "new").exists()  # and the check creates nothing


def test_skipped_lines_become_log_warnings_once_each(tmp_path):
    import logging

    from cs336_systems.bench.store import log_skipped_lines

    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps({"schema": SCHEMA, "n": 1}) + "\ngarbage\n")
    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logger = logging.getLogger("test.skipped_lines")
    logger.addHandler(Keep())
    saved = warnings.showwarning
    try:
        with warnings.catch_warnings():
            log_skipped_lines(logger)
            for _ in range(3):  # the report layer reads a file many times
                store_module.read_rows(path)
    finally:
        warnings.showwarning = saved
    assert records == [f"results file: {path}:2: skipped line: not JSON"]


REPO = Path(__file__).resolve().parents[1]


def test_the_site_build_names_every_skipped_line_of_a_results_file_and_fails_strict(tmp_path):
    """Issue 28 (5): a corrupted results file read by a page shows each skipped line with its
    file and line in `mkdocs build`, and `--strict` fails on it."""
    results = tmp_path / "results"
    path = results / "demo" / "site" / "nvidia-h200.jsonl"
    path.parent.mkdir(parents=True)
    good = json.dumps({"schema": SCHEMA, "n": 1, "status": "ok"})
    path.write_bytes(f"{good}\nxyz garbage\n".encode() + b'{"schema": "\xff"}\n' + f'{good}\n{{"sche'.encode())
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# rows\n")
    reader = tmp_path / "reads_results.py"  # a page's table: the report layer reads the file
    reader.write_text("from report.results import load_results\n\n"
                      "def on_page_markdown(markdown, page, config, files):\n"
                      f"    return markdown + str(len(load_results('demo/site', root={str(results)!r})))\n")
    (tmp_path / "mkdocs.yml").write_text(
        f"site_name: probe\ntheme: {{name: mkdocs}}\n"
        f"hooks: [{REPO / 'docs' / 'hooks' / 'markers.py'}, {reader}]\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for strict in (True, False):
        proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", *(["--strict"] if strict else [])],
                              cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
        log = proc.stderr + proc.stdout
        assert (proc.returncode != 0) == strict, log
        for line, why in ((2, "line: not JSON"), (3, "line: not UTF-8"), (5, "torn last line")):
            assert f"WARNING -  results file: {path}:{line}: skipped {why}" in log, log
