"""The launcher: results by rank, a failing rank's error surfaces (no hang), timeouts, bad input."""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from cs336_systems.distributed.launch import (
    RankFailed,
    Worker,
    gpus_needed,
    remove_stale_spawn_dirs,
    spawn,
)

pytestmark = pytest.mark.distributed


def _sum_ranks(worker: Worker, scale: float) -> tuple[int, int, list[float]]:
    t = torch.full((3,), float(worker.rank + 1) * scale)
    dist.all_reduce(t)
    return worker.rank, worker.world_size, t.tolist()


def _rank1_raises(worker: Worker) -> None:
    if worker.rank == 1:
        time.sleep(0.2)
        raise ValueError("rank one refuses")
    t = torch.ones(1)
    dist.all_reduce(t)  # the other ranks would block here forever without the launcher's care


def _rank0_stalls(worker: Worker) -> None:
    if worker.rank == 0:
        time.sleep(60)
    dist.barrier()


def test_results_come_back_by_rank():
    out = spawn(_sum_ranks, 3, 2.0)
    assert out == [(r, 3, [12.0] * 3) for r in range(3)]  # 2 * (1 + 2 + 3)


def _aborts_at_exit(worker: Worker) -> int:
    atexit.register(os.abort)  # stands in for a C++ helper thread that aborts the interpreter's teardown
    return worker.rank


def test_a_rank_done_and_saved_skips_the_teardown_that_could_abort_it():
    assert spawn(_aborts_at_exit, 2) == [0, 1]


def test_failing_rank_brings_the_others_down_with_its_message():
    start = time.monotonic()
    with pytest.raises(RankFailed) as info:
        spawn(_rank1_raises, 3, timeout_s=30)
    assert info.value.rank == 1
    assert "rank one refuses" in str(info.value)
    assert time.monotonic() - start < 25  # torn down, not waiting out the collective timeout


def test_collective_timeout_ends_a_stalled_job():
    start = time.monotonic()
    with pytest.raises(RankFailed):
        spawn(_rank0_stalls, 2, timeout_s=3)
    assert time.monotonic() - start < 30


@pytest.mark.parametrize("kwargs, match", [
    (dict(world_size=0), "world_size"),
    (dict(world_size=2, backend="mpi"), "backend"),
    (dict(world_size=2, backend="nccl", device="cpu"), "nccl"),
    (dict(world_size=2, timeout_s=0), "timeout_s"),
    (dict(world_size=2, ranks_per_gpu=0), "ranks_per_gpu"),
    (dict(world_size=2, backend="nccl", device="cuda", ranks_per_gpu=2), "ranks_per_gpu 2 needs backend 'gloo'"),
])
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        spawn(_sum_ranks, **kwargs)


@pytest.mark.skipif(torch.cuda.device_count() >= 64, reason="needs fewer GPUs than asked for")
def test_nccl_without_enough_gpus_is_refused_before_spawning():
    with pytest.raises(ValueError, match="GPU"):
        spawn(_sum_ranks, 64, 1.0, backend="nccl")


def _where(worker: Worker) -> tuple[int, str, int]:
    return worker.rank, worker.device.type, worker.ranks_per_gpu


def test_ranks_sharing_a_device_know_it():
    # on the CPU every rank is on the host anyway: the run goes through the same path, and each
    # rank is told how many share its device (the benchmarks mark their rows with it)
    assert spawn(_where, 2, ranks_per_gpu=2) == [(0, "cpu", 2), (1, "cpu", 2)]


def test_gpus_needed_rounds_up():
    assert [gpus_needed(n, 2) for n in (1, 2, 3, 4)] == [1, 1, 2, 2]
    assert gpus_needed(8) == 8


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="needs fewer than 2 GPUs")
def test_sharing_counts_the_gpus_it_needs():
    have = torch.cuda.device_count()
    with pytest.raises(ValueError, match=f"needs 2 GPU\\(s\\) for 4 local ranks, 2 per GPU, but {have}"):
        spawn(_where, 4, device="cuda", ranks_per_gpu=2)


# -- a parent that dies takes its ranks and its temporary directory with it ----------------------

def _write_pid_and_sleep(worker: Worker, pid_dir: str) -> None:
    (Path(pid_dir) / f"rank{worker.rank}.pid").write_text(str(os.getpid()))
    time.sleep(600)  # far beyond the test: only the parent's death can end it in time


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie lingers until its new parent reaps it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def _poll(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc (Linux)")
def test_ranks_exit_and_the_temp_dir_goes_when_the_parent_is_killed(tmp_path):
    """SIGKILL runs no cleanup in the parent: the ranks must notice on their own."""
    pids, tmp = tmp_path / "pids", tmp_path / "tmp"
    pids.mkdir()
    tmp.mkdir()
    code = ("from cs336_systems.distributed.launch import spawn\n"
            "from tests.test_launch import _write_pid_and_sleep\n"
            f"spawn(_write_pid_and_sleep, 2, {str(pids)!r}, timeout_s=600)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1],
                              env={**os.environ, "TMPDIR": str(tmp)}, stderr=subprocess.DEVNULL)
    try:
        # Starting two ranks (each imports torch) takes seconds on a busy 2-core machine.
        assert _poll(lambda: len(list(pids.glob("*.pid"))) == 2, 120), "the ranks never started"
        ranks = [int(p.read_text()) for p in pids.glob("*.pid")]
        assert [d.name.startswith(f"cs336-spawn-{parent.pid}-") for d in tmp.iterdir()] == [True]
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        # The watch polls every PARENT_POLL_S; allow for a loaded machine.
        assert _poll(lambda: not any(_running(p) for p in ranks), 10), "ranks outlived their parent"
        assert _poll(lambda: not list(tmp.iterdir()), 5), f"left behind: {list(tmp.iterdir())}"
    finally:
        parent.kill()
        for p in pids.glob("*.pid"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(p.read_text()), signal.SIGKILL)


def test_the_next_spawn_removes_directories_of_dead_parents(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    stale = tmp_path / f"cs336-spawn-{dead.stdout.strip()}-abc"
    live = tmp_path / f"cs336-spawn-{os.getpid()}-abc"
    stale.mkdir()
    live.mkdir()
    (stale / "rank0.pt").write_bytes(b"x")
    assert remove_stale_spawn_dirs(tmp_path) == [stale]
    assert not stale.exists() and live.exists()


# -- issue 28 (6): no leftovers after a SIGKILL during start-up, none after a failure, Ctrl-C quiet --

def _start_slowly(worker: Worker, marker_dir: str) -> None:
    (Path(marker_dir) / f"rank{worker.rank}.pid").write_text(str(os.getpid()))
    try:
        time.sleep(20)  # a long start-up: an import of Triton, say
    except KeyboardInterrupt:
        os.abort()  # what a C++ extension's initialiser does when Python raises inside it


def _children(pid: int) -> list[int]:
    """The live children of `pid` (Linux: /proc/<pid>/task/*/children)."""
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            out += [int(c) for c in (task / "children").read_text().split()]
    return out


def _kill_parent_during_start_up(tmp_path: Path, delay_s: float, in_fn: bool) -> tuple[Path, list[int]]:
    """Start a parent that spawns a _start_slowly rank and SIGKILL it `delay_s` after it starts
    spawning (`in_fn` False: while its rank imports torch or connects) or after the rank began its
    function (True: in its slow start-up); return its TMPDIR and its children's pids (the rank,
    and multiprocessing's resource tracker)."""
    markers, tmp = tmp_path / "markers", tmp_path / "tmp"
    markers.mkdir(parents=True)
    tmp.mkdir()
    code = ("import sys\nfrom cs336_systems.distributed.launch import spawn\n"
            "from tests.test_launch import _start_slowly\n"
            f"print('spawning', flush=True)\nspawn(_start_slowly, 1, {str(markers)!r}, timeout_s=60)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1],
                              env={**os.environ, "TMPDIR": str(tmp)}, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
    ranks: list[int] = []
    try:
        assert parent.stdout.readline().strip() == "spawning"
        if in_fn:
            assert _poll(lambda: list(markers.glob("*.pid")), 120), "the rank never started"
        deadline = time.monotonic() + delay_s
        while time.monotonic() < deadline:
            ranks = sorted(set(ranks) | set(_children(parent.pid)))
            time.sleep(0.02)
        ranks = sorted(set(ranks) | set(_children(parent.pid)))
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    finally:
        parent.kill()
    return tmp, ranks


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads process trees from /proc (Linux)")
def test_no_spawn_directory_or_error_file_is_left_after_a_sigkill_during_start_up(tmp_path):
    """Ten parents killed at ten moments of their rank's start-up (in parallel: each try waits
    mostly for imports): five while the rank imports torch and connects, five while it is in a
    slow start-up of its own that stands for an extension's import which aborts the process when
    Python raises inside it (torch's parent-death SIGINT did that to a rank importing Triton). A
    rank killed while it still imports torch notices once that is done."""
    from concurrent.futures import ThreadPoolExecutor

    moments = [(0.4 * i, False) for i in range(5)] + [(0.2 * i, True) for i in range(5)]
    with ThreadPoolExecutor(len(moments)) as pool:
        runs = list(pool.map(lambda i: _kill_parent_during_start_up(tmp_path / f"try{i}", *moments[i]),
                             range(len(moments))))
    try:
        for (tmp, ranks), moment in zip(runs, moments):
            assert _poll(lambda: not any(_running(p) for p in ranks), 90), f"ranks outlived the parent {moment}"
            assert _poll(lambda tmp=tmp: not list(tmp.iterdir()), 10), f"left behind {moment}: {list(tmp.iterdir())}"
    finally:
        for _, ranks in runs:
            for p in ranks:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGKILL)


def test_a_failed_rank_leaves_no_pytorch_error_file(tmp_path, monkeypatch):
    """torch's spawn pickles a raising rank's traceback into /tmp/pytorch-errorfile-*.pickle and
    never removes it; ours leaves none (and still reports the rank's traceback)."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with pytest.raises(RankFailed, match="rank one refuses"):
        spawn(_rank1_raises, 2, timeout_s=30)
    assert not list(tmp_path.glob("pytorch-errorfile-*")) and not list(tmp_path.glob("cs336-spawn-*"))


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="sends SIGINT to a process group (POSIX)")
def test_ctrl_c_ends_a_benchmark_with_one_line_and_no_traceback(tmp_path):
    """The terminal sends SIGINT to the whole process group: the parent and its ranks."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    cmd = [sys.executable, "-m", "cs336_systems.bench", "collectives", "--world-sizes", "2", "--sizes-mb", "1",
           "--warmup", "0", "--iters", "1000000", "--results-dir", str(tmp_path / "results")]
    # SIGINT's default action restored: a shell's background job (pytest run with &) ignores it, and
    # the bench would inherit that.
    bench = subprocess.Popen(cmd, cwd=Path(__file__).resolve().parents[1], start_new_session=True,
                             env={**os.environ, "TMPDIR": str(tmp)}, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert _poll(lambda: len(_children(bench.pid)) >= 2 and list(tmp.glob("cs336-spawn-*")), 120), \
            "the ranks never started"
        ranks = _children(bench.pid)
        time.sleep(3)  # the ranks are in their all-reduce loop
        os.killpg(bench.pid, signal.SIGINT)
        _, err = bench.communicate(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(bench.pid, signal.SIGKILL)
    lines = [line for line in err.splitlines() if line.strip() and "\r" not in line]
    assert bench.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert lines[-1].startswith("bench collectives: interrupted (Ctrl-C); no row written"), err
    assert _poll(lambda: not any(_running(p) for p in ranks), 10)
    assert not list(tmp.iterdir())
