"""Run a function on N ranks: in-process via spawn (tests, benchmarks) or under `torchrun`.

Every distributed program in the project is a function `fn(worker: Worker, *args, **kwargs)`:

    spawn(fn, world_size=2, backend="gloo")       # N fresh processes, results returned by rank
    run_from_env(fn)                              # inside `torchrun --nproc-per-node N ...`
    launch(fn, world_size=2)                      # whichever of the two applies

What the wrapper guarantees, so no caller has to think about it:
- No fixed port. `spawn` starts the rendezvous TCPStore in the parent on port 0 (the OS picks a
  free one, and the parent keeps holding it, so no other program can take it in between); the
  children join it as clients. Under torchrun, torchrun's own MASTER_ADDR/MASTER_PORT are used.
- Every collective has a timeout (`timeout_s`), and `spawn` has a wall-clock deadline on top.
- A rank that raises brings the others down: `spawn` terminates the surviving ranks and raises
  `RankFailed` carrying the failing rank's traceback, instead of leaving them blocked in a
  collective. (Under torchrun the agent does the same when a rank exits non-zero.)
- A parent that dies (even by SIGKILL, which runs no cleanup) takes its ranks with it: each rank
  watches its parent and, once it is gone, removes the run's temporary directory and exits within
  a second, instead of waiting out the store and collective timeouts. A directory left anyway
  (every process SIGKILLed at once) is removed by the next `spawn`: its name holds the parent's pid.
- Ranks never raise KeyboardInterrupt: they start with SIGINT blocked (so neither a Ctrl-C nor
  torch's parent-death SIGINT can land in the middle of an import, where an exception may abort
  the process before it cleans up), then take it in a handler that exits at once (after removing
  the run's directory if the parent is gone), with no traceback. A Ctrl-C thus stops the parent
  with one KeyboardInterrupt, which terminates the ranks.
- A failed rank leaves no `/tmp/pytorch-errorfile-*.pickle` (torch's spawn writes one per raising
  process and never removes it): the rank exits after writing its traceback into the run's
  directory, and the parent removes any such file its ranks left.
- `destroy_process_group` runs when the function returns.

Ranks sharing a GPU (`ranks_per_gpu=k`, gloo only: NCCL refuses two ranks on one device): local
ranks k*g ... k*g + k-1 all run on cuda:g, and each rank's caching allocator is capped at 1/k of
the GPU's memory, so one rank's cache cannot starve the other of the memory both need. What such a
run measures per rank (memory) is real; its times are not (the ranks take turns on one GPU, and gloo
copies every collective through the host).
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .rank_lifetime import (
    EXIT_INTERRUPTED,
    SPAWN_DIR_PREFIX,
    _leave_if_orphaned,
    _sigint_blocked,
    _stop_on_sigint,
    _watch_parent,
    remove_stale_spawn_dirs,
)

DEFAULT_TIMEOUT_S = 120.0
# The parent's store is listening before any rank starts, so a rank that cannot connect within
# this long never will (its parent is gone); the store's own timeout then applies to its waits.
CONNECT_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Worker:
    """What a rank knows about itself. `device` is cuda:(local_rank // ranks_per_gpu) for CUDA
    ranks, else cpu; ranks_per_gpu > 1: that many ranks share each GPU (gloo)."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device
    ranks_per_gpu: int = 1


class RankFailed(RuntimeError):
    """One rank raised; the message holds its traceback. The other ranks were terminated."""

    def __init__(self, rank: int, message: str):
        super().__init__(f"rank {rank} failed:\n{message}")
        self.rank = rank


def default_device(backend: str) -> str:
    """cuda for nccl; cpu for gloo (gloo also runs CUDA tensors if asked with device='cuda')."""
    return "cuda" if backend == "nccl" else "cpu"


def default_backend(device: str | None = None) -> str:
    """nccl for CUDA devices, gloo otherwise."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def in_torchrun() -> bool:
    """True inside a process started by torchrun (or any launcher that sets the env:// variables)."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def gpus_needed(local_world_size: int, ranks_per_gpu: int = 1) -> int:
    """GPUs one host must have for `local_world_size` ranks, `ranks_per_gpu` of them per GPU."""
    return -(-local_world_size // ranks_per_gpu)


def _check_backend(backend: str, device_type: str, world_size: int,
                   local_world_size: int, ranks_per_gpu: int = 1) -> None:
    if backend not in {"gloo", "nccl"}:
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    if device_type not in {"cpu", "cuda"}:
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device_type!r}")
    if backend == "nccl" and device_type != "cuda":
        raise ValueError("backend 'nccl' needs device 'cuda'")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if ranks_per_gpu < 1:
        raise ValueError(f"ranks_per_gpu must be >= 1, got {ranks_per_gpu}")
    if ranks_per_gpu > 1 and backend != "gloo":
        raise ValueError(f"ranks_per_gpu {ranks_per_gpu} needs backend 'gloo' (NCCL refuses two "
                         f"ranks on one GPU), got {backend!r}")
    if device_type == "cuda":
        have, need = torch.cuda.device_count(), gpus_needed(local_world_size, ranks_per_gpu)
        if have < need:
            raise ValueError(f"device 'cuda' needs {need} GPU(s) for {local_world_size} local "
                             f"ranks, {ranks_per_gpu} per GPU, but {have} visible")


def _make_worker(rank: int, world_size: int, local_rank: int, backend: str, device_type: str,
                 threads_per_rank: int | None, ranks_per_gpu: int = 1) -> Worker:
    if device_type == "cuda":
        device = torch.device("cuda", local_rank // ranks_per_gpu)
        torch.cuda.set_device(device)
        if ranks_per_gpu > 1:  # an equal share each: a rank's cache never starves its neighbour
            torch.cuda.set_per_process_memory_fraction(1.0 / ranks_per_gpu, device)
    else:
        device = torch.device("cpu")
    if threads_per_rank is not None:
        torch.set_num_threads(threads_per_rank)
    return Worker(rank, world_size, local_rank, backend, device, ranks_per_gpu)


def cpu_threads_per_rank(local_world_size: int) -> int:
    """Intra-op threads per rank so that the ranks of one host share its cores instead of fighting."""
    return max(1, (os.cpu_count() or 1) // local_world_size)


# -- spawn: in-process launching for tests and benchmarks ----------------------------------------

def _spawn_entry(index: int, fn: Callable[..., Any], world_size: int, backend: str,
                 device_type: str, port: int,
                 timeout_s: float, threads_per_rank: int | None, out_dir: str, parent_pid: int,
                 args: tuple, kwargs: dict, ranks_per_gpu: int = 1) -> None:
    """Body of each spawned process. `index` is the rank (mp.spawn passes it first)."""
    rank = index
    _stop_on_sigint(parent_pid, out_dir)
    _leave_if_orphaned(parent_pid, out_dir)  # the parent may have died while we started
    threading.Thread(target=_watch_parent, args=(parent_pid, out_dir), daemon=True,
                     name="parent-watch").start()
    os.environ.setdefault("OMP_NUM_THREADS", str(threads_per_rank or 1))
    try:
        worker = _make_worker(rank, world_size, rank, backend, device_type, threads_per_rank,
                              ranks_per_gpu)
        store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False,
                              timeout=_dt.timedelta(seconds=min(timeout_s, CONNECT_TIMEOUT_S)))
        store.set_timeout(_dt.timedelta(seconds=timeout_s))
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=_dt.timedelta(seconds=timeout_s),
                                device_id=worker.device if backend == "nccl" else None)
        # A rank that raises skips the (collective) teardown below: the parent terminates everyone.
        result = fn(worker, *args, **kwargs)
        torch.save(result, Path(out_dir) / f"rank{rank}.pt")
        dist.destroy_process_group()
    except BaseException as exc:
        _leave_if_orphaned(parent_pid, out_dir)
        if isinstance(exc, KeyboardInterrupt):  # raised by fn itself: stop quietly, as on SIGINT
            os._exit(EXIT_INTERRUPTED)
        # Keep the traceback readable, tagged with the rank, and timestamped: when one rank fails
        # the others fail soon after ("connection closed by peer"), and the parent reports the
        # earliest failure, which is the cause.
        message = traceback.format_exc()
        sys.stderr.write(f"[rank {rank}] " + message)
        # written whole or not at all (a temporary file, then a rename): the parent may read the
        # folder at any moment, and once read a half-written file as an empty time stamp
        tmp = Path(out_dir) / f".rank{rank}.err.tmp"
        tmp.write_text(f"{time.time()!r}\n{message}")
        os.replace(tmp, Path(out_dir) / f"rank{rank}.err")
        # Leave here rather than raise: torch's spawn would pickle the traceback into a
        # /tmp/pytorch-errorfile-*.pickle that nobody removes; the parent reads rank<N>.err.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    # Done, and the result is saved: leave without the interpreter's teardown. There, C++ destructors
    # join helper threads (compile workers, collective threads) in an order that can abort the
    # process ("terminate called without an active exception", seen once in a 2-rank CPU run of the
    # training step after every row was written), which the parent would report as a failed rank.
    # Skipped with it: atexit handlers; logging's and the standard streams' flushes are done here.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _first_failure(out_dir: str) -> tuple[int, str] | None:
    """(rank, traceback) of the rank that failed first, from the .err files the ranks wrote."""
    failures = []
    for path in Path(out_dir).glob("rank*.err"):
        stamp, _, message = path.read_text().partition("\n")
        failures.append((float(stamp), int(path.stem.removeprefix("rank")), message))
    if not failures:
        return None
    _, rank, message = min(failures)
    return rank, message


def spawn(fn: Callable[..., Any], world_size: int, *args: Any, backend: str = "gloo",
          device: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S, threads_per_rank: int | None = None,
          ranks_per_gpu: int = 1, **kwargs: Any) -> list[Any]:
    """Run `fn(worker, *args, **kwargs)` on `world_size` fresh processes; return results by rank.

    `fn` must be importable (a module-level function) and its result picklable. If any rank raises,
    the others are terminated and `RankFailed` is raised here with that rank's traceback. The whole
    run is also bounded by a deadline of `timeout_s` beyond the collective timeouts, for a rank
    stuck outside a collective. `threads_per_rank` defaults to the host's cores shared out among
    the ranks (CPU backends only). `ranks_per_gpu` ranks share each GPU (gloo; module docstring).
    """
    device_type = device or default_device(backend)
    _check_backend(backend, device_type, world_size, world_size, ranks_per_gpu)
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    if threads_per_rank is None and device_type == "cpu":
        threads_per_rank = cpu_threads_per_rank(world_size)
    remove_stale_spawn_dirs()
    # --8<-- [start:spawn]
    # The rendezvous store lives in this process on a port the OS chose (port 0 = any free port).
    store = dist.TCPStore("127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False,
                          timeout=_dt.timedelta(seconds=timeout_s))
    with tempfile.TemporaryDirectory(prefix=f"{SPAWN_DIR_PREFIX}{os.getpid()}-") as out_dir:
        ctx = None
        try:
            with _sigint_blocked():  # the ranks start with SIGINT blocked (see _stop_on_sigint)
                ctx = mp.spawn(_spawn_entry, nprocs=world_size, join=False,
                               args=(fn, world_size, backend, device_type, store.port, timeout_s,
                                     threads_per_rank, out_dir, os.getpid(), args, kwargs, ranks_per_gpu))
            allowed = 2 * timeout_s + 60  # init + work + teardown, generously
            deadline = time.monotonic() + allowed
            while not ctx.join(timeout=0.5):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{world_size} ranks still running {allowed:.0f}s after "
                                       "the start; terminated them")
        except mp.ProcessRaisedException as exc:
            rank, message = _first_failure(out_dir) or (exc.error_index, exc.msg)
            raise RankFailed(rank, message) from None
        except mp.ProcessExitedException as exc:
            rank, message = _first_failure(out_dir) or (
                exc.error_index, f"exited with code {exc.exit_code} (signal {exc.signal_name})")
            raise RankFailed(rank, message) from None
        finally:
            for p in ctx.processes if ctx is not None else ():
                if p.is_alive():
                    p.terminate()
            for p in ctx.processes if ctx is not None else ():
                p.join(timeout=10)
            for name in ctx.error_files if ctx is not None else ():
                Path(name).unlink(missing_ok=True)  # torch's per-rank traceback file, if one was written
        # --8<-- [end:spawn]
        return [torch.load(Path(out_dir) / f"rank{r}.pt", weights_only=False)
                for r in range(world_size)]


# -- torchrun: the same function under PyTorch's launcher ----------------------------------------

def run_from_env(fn: Callable[..., Any], *args: Any, backend: str | None = None,
                 device: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S, threads_per_rank: int | None = None,
                 ranks_per_gpu: int = 1, **kwargs: Any) -> Any:
    """Run `fn(worker, *args, **kwargs)` in this process as one rank of a torchrun job.

    Reads RANK, WORLD_SIZE, LOCAL_RANK (and LOCAL_WORLD_SIZE) from the environment; torchrun's
    MASTER_ADDR/MASTER_PORT do the rendezvous (env://). Returns this rank's result. On an exception
    the traceback is printed tagged with the rank and re-raised, so the process exits non-zero and
    torchrun tears the job down.
    """
    if not in_torchrun():
        raise RuntimeError("run_from_env needs RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the "
                           "environment (start the program with torchrun)")
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    backend = backend or default_backend()
    device_type = device or default_device(backend)
    _check_backend(backend, device_type, world_size, local_world_size, ranks_per_gpu)
    if threads_per_rank is None and device_type == "cpu":
        threads_per_rank = cpu_threads_per_rank(local_world_size)
    worker = _make_worker(rank, world_size, local_rank, backend, device_type, threads_per_rank,
                          ranks_per_gpu)
    dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world_size,
                            timeout=_dt.timedelta(seconds=timeout_s),
                            device_id=worker.device if backend == "nccl" else None)
    try:
        result = fn(worker, *args, **kwargs)
    except BaseException:
        sys.stderr.write(f"[rank {rank}] " + traceback.format_exc())
        raise
    dist.destroy_process_group()
    return result


def launch(fn: Callable[..., Any], world_size: int, *args: Any, backend: str = "gloo",
           device: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
           **kwargs: Any) -> list[Any] | Any:
    """Under torchrun: this rank's result of `fn` (world size from the environment, which must
    match `world_size`). Otherwise: `spawn` `world_size` ranks and return all their results."""
    if in_torchrun():
        env_world = int(os.environ["WORLD_SIZE"])
        if env_world != world_size:
            raise ValueError(f"world_size {world_size} requested but torchrun started {env_world}")
        return run_from_env(fn, *args, backend=backend, device=device, timeout_s=timeout_s,
                            **kwargs)
    return spawn(fn, world_size, *args, backend=backend, device=device, timeout_s=timeout_s,
                 **kwargs)
