"""How a spawned rank never outlives its parent (`launch.spawn`'s ranks): it watches the parent and
leaves once it is gone, takes SIGINT in a handler that exits at once, and starts with SIGINT
blocked; a run directory left behind by a dead parent is removed by the next spawn (its name holds
the parent's pid). launch.py's docstring says what a caller gets from this."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

EXIT_INTERRUPTED = 130  # a rank stopped by SIGINT, as a shell reports it
PARENT_POLL_S = 0.5
SPAWN_DIR_PREFIX = "cs336-spawn-"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


def remove_stale_spawn_dirs(tmp: str | Path | None = None) -> list[Path]:
    """Remove the temporary directories of spawns whose parent process is dead; return them."""
    removed = []
    uid = os.getuid() if hasattr(os, "getuid") else None
    for path in Path(tmp or tempfile.gettempdir()).glob(f"{SPAWN_DIR_PREFIX}*-*"):
        pid = path.name.removeprefix(SPAWN_DIR_PREFIX).partition("-")[0]
        try:
            ours = path.is_dir() and (uid is None or path.stat().st_uid == uid)  # not another user's
        except OSError:  # removed meanwhile by another spawn
            continue
        if pid.isdigit() and ours and not _pid_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _leave_if_orphaned(parent_pid: int, out_dir: str, grace_s: float = 0.0) -> None:
    """If the parent is gone (or goes within `grace_s`), remove the run's directory and exit:
    nobody will read what we write.

    A killed parent's ranks are re-parented (to init or a subreaper), so getppid() changes, but
    only once the parent's last thread has exited: the death signal can come a little earlier."""
    deadline = time.monotonic() + grace_s
    while os.getppid() == parent_pid and time.monotonic() < deadline:
        time.sleep(0.05)
    if os.getppid() != parent_pid:
        sys.stderr.write(f"[pid {os.getpid()}] the parent process {parent_pid} is gone; exiting\n")
        shutil.rmtree(out_dir, ignore_errors=True)
        os._exit(1)


def _watch_parent(parent_pid: int, out_dir: str) -> None:
    """Daemon thread of each rank: leave once the parent is gone.

    torch's spawn also asks the kernel for a SIGINT at the parent's death, but Python acts on it
    only between bytecodes, and a rank blocked in C++ (connecting to the dead parent's store, in
    a collective) would sit there until its timeout. Those calls release the GIL, so this thread
    runs while they block. The poll costs one wake-up every PARENT_POLL_S.
    """
    while True:
        time.sleep(PARENT_POLL_S)
        _leave_if_orphaned(parent_pid, out_dir)


def _stop_on_sigint(parent_pid: int, out_dir: str) -> None:
    """The rank's SIGINT handler, then SIGINT unblocked (spawn started the rank with it blocked):
    a SIGINT (torch's parent-death signal, or a Ctrl-C) makes the rank leave at once, from the
    handler, raising nothing into whatever code it interrupted."""
    def on_sigint(signum, frame):  # noqa: ARG001 (signal API)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the death signal can come twice
        # The death signal can come before the re-parenting shows: look for a moment.
        _leave_if_orphaned(parent_pid, out_dir, grace_s=2.0)
        os._exit(EXIT_INTERRUPTED)  # a Ctrl-C: the parent, interrupted too, terminates the others

    signal.signal(signal.SIGINT, on_sigint)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@contextlib.contextmanager
def _sigint_blocked():
    """SIGINT blocked in this thread while ranks start: a blocked signal stays blocked across
    fork and exec, so each rank's start-up (imports of torch, Triton) runs without it until the
    rank installs its own handler. A Ctrl-C meanwhile waits and arrives here when unblocked."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
