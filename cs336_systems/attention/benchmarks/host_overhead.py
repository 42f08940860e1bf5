"""How long the host takes to issue one attention call, measured with the GPU kept busy.

`do_bench` records its start event right after flushing L2; if the host is still in Python when
the GPU reaches that event, the GPU waits, and the wait is timed as if it were the kernel's. So
the host's time to issue the first kernel of a step is part of the leaderboard number. Here each
piece of our call path (input checks, tensor descriptors, the Triton launch, autograd and
torch.compile around it) is issued many times behind a long `torch.cuda._sleep`, so nothing waits
on the GPU and the wall time per call is the host's alone.

    just bench flash-host [--calls 50] [--rounds 5] [--profile FILE]
    just bench flash-host --batch 32 --heads 32 --seq 1024 --d 128    # 1 x 32 x 1024: the GPU waits on the host

The eager forward+backward step of ours is timed beside cuDNN's, and once more with every launch
through Triton's dispatch (`direct_launch.dispatch_only`), so one run shows what launching the
compiled kernels directly saves.

--profile FILE: afterwards, the eager forward+backward step (Fn.apply, then backward) under cProfile
for --calls calls, the GPU kept busy the same way; the functions with the most own time go to FILE
(pstats text), to show where the host's microseconds go.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

BENCH = "attention/host_overhead"
SPIN_CYCLES = 3_000_000_000  # about 1.5 s of GPU spin at ~2 GHz: longer than any batch of calls here


def host_us(fn: Callable[[], object], calls: int) -> float:
    """Microseconds of host time per call of `fn`, issued while the GPU is busy."""
    torch.cuda.synchronize()
    torch.cuda._sleep(SPIN_CYCLES)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def pieces(batch: int, heads: int, seq: int, d: int) -> dict[str, Callable[[], object]]:
    """What a forward (and a forward+backward) step runs on the host, piece by piece."""
    from ..fast import FlashAttentionFast
    from ..fast.direct_launch import dispatch_only
    from ..fast.table import lookup_fwd
    from ..fast.tuned_configs import TUNED
    from ..flash_launch import _descriptors, launch_fwd
    from ..flash_triton import check_triton_inputs
    from .leaderboard import make_attention

    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(batch, seq, d, device="cuda", dtype=torch.bfloat16, generator=g, requires_grad=True)
               for _ in range(3))
    q4, k4, v4 = (t.detach().unsqueeze(1) for t in (q, k, v))  # (Z, 1, N, d): how the kernels see them
    tuned = lookup_fwd(TUNED, torch.bfloat16, d, True, batch, seq, seq).tiles  # the Triton launch's tiles
    ours, cudnn = make_attention("ours", heads), make_attention("cudnn", heads)
    eager = lambda q, k, v: FlashAttentionFast.apply(q, k, v, True)  # noqa: E731

    def step(f):
        def run():
            f(q, k, v).sum().backward()
        return run

    def dispatched(run):
        def through_triton():
            with dispatch_only():
                run()
        return through_triton

    found = {
        "cudnn: forward": lambda: cudnn(q, k, v),
        "ours: forward (torch.compile(Fn.apply), the leaderboard's call)": lambda: ours(q, k, v),
        "ours: forward (Fn.apply, eager)": lambda: FlashAttentionFast.apply(q, k, v, True),
        "ours: forward+backward step (Fn.apply, eager)": step(eager),
        "ours: forward+backward step (Fn.apply, eager, Triton's dispatch)": dispatched(step(eager)),
        "ours: input checks": lambda: check_triton_inputs(q, k, v, True),
        "ours: launch_fwd, TMA loads": lambda: launch_fwd(q4, k4, v4, True, replace(tuned, tma=True)),
        "ours: launch_fwd, pointers": lambda: launch_fwd(q4, k4, v4, True, replace(tuned, tma=False)),
        "ours: three TensorDescriptors": lambda: _descriptors(q4, k4, v4, None, tuned.block_m, tuned.block_n),
        "cudnn: forward+backward step": step(cudnn),
        "ours: forward+backward step": step(ours),
    }
    return found | gluon_pieces(q4, k4, v4, step)


def gluon_pieces(q4, k4, v4, step) -> dict[str, Callable[[], object]]:
    """The Gluon kernels' launches through Triton's dispatch and directly (`fast.direct_launch`),
    and an eager step that runs them; none where the Gluon kernels do not take these inputs."""
    from ..fast.gluon.fwd_ws import fwd_ws_supported

    if fwd_ws_supported(q4, k4, v4) is not None:
        return {}
    from ..fast import FlashAttentionFast
    from ..fast.gluon.flash_bwd_ws_kernel import bwd_onepass_ws_kernel
    from ..fast.gluon.flash_fwd_ws_kernel import fwd_ws_kernel
    from ..fast.gluon.fwd_ws import launch_fwd_ws
    from ..fast.gluon.onepass_ws import launch_bwd_onepass_ws, ws_supported
    from ..fast.plans import BwdPlan, FwdPlan, GluonBwdConfig, GluonFwdConfig
    from ..flash_launch import launch_preprocess
    from ..tiles import default_bwd, default_fwd

    do4 = torch.randn_like(q4)
    o4, L = launch_fwd_ws(q4, k4, v4, True)
    delta = launch_preprocess(o4, do4)
    pieces = {"ours: Gluon forward launch, Triton's dispatch": lambda: launch_fwd_ws(q4, k4, v4, True, kernel=fwd_ws_kernel),
              "ours: Gluon forward launch, direct": lambda: launch_fwd_ws(q4, k4, v4, True)}
    if ws_supported(q4, k4, v4, do4, True) is None:
        pieces |= {
            "ours: Gluon backward launch, Triton's dispatch":
                lambda: launch_bwd_onepass_ws(q4, k4, v4, do4, L, delta, True, kernel=bwd_onepass_ws_kernel),
            "ours: Gluon backward launch, direct": lambda: launch_bwd_onepass_ws(q4, k4, v4, do4, L, delta, True)}
        fwd = FwdPlan(default_fwd(q4.dtype, q4.shape[-1]), GluonFwdConfig())
        bwd = BwdPlan(default_bwd(q4.dtype, q4.shape[-1]), gluon=GluonBwdConfig())
        pieces["ours: forward+backward step (Fn.apply, eager, the Gluon kernels)"] = step(
            lambda q, k, v: FlashAttentionFast.apply(q, k, v, True, fwd, bwd))
    return pieces


def main(argv: list[str] | None = None) -> int:
    from cs336_systems.bench.cli import Parser, at_least, open_store, require_gpu, results_root

    ap = Parser(prog="host_overhead", description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=at_least(1), default=16)
    ap.add_argument("--heads", type=at_least(1), default=16)
    ap.add_argument("--seq", type=at_least(1), default=16384)
    ap.add_argument("--d", type=at_least(1), default=64)
    ap.add_argument("--calls", type=at_least(1), default=50, help="calls per timing (all queued behind one GPU spin)")
    ap.add_argument("--rounds", type=at_least(1), default=5, help="timings per piece; the median is reported")
    ap.add_argument("--results-dir", type=results_root, default=None)
    ap.add_argument("--profile", default=None, metavar="FILE", help="write a cProfile of the eager step to FILE")
    args = ap.parse_args(argv)
    if args.profile and not Path(args.profile).resolve().parent.is_dir():
        ap.error(f"--profile: the folder of {args.profile} does not exist")
    if args.batch % args.heads:
        ap.error(f"--heads must divide --batch, got {args.heads} and {args.batch}")
    require_gpu(ap, flag=None, cpu_smoke=False)
    store = open_store(ap, BENCH, ["run", "piece"], root=args.results_dir)
    run = time.strftime("%Y%m%dT%H%M%S")
    for name, fn in pieces(args.batch, args.heads, args.seq, args.d).items():
        for _ in range(3):  # compile, autotune-free warm-up, allocator warm-up
            fn()
        us = [host_us(fn, args.calls) for _ in range(args.rounds)]
        store.append({"run": run, "piece": name, "batch": args.batch, "seq": args.seq, "d": args.d,
                      "calls": args.calls}, {"host_us": statistics.median(us), "host_us_min": min(us)})
        print(f"[host] {statistics.median(us):8.1f} us/call (min {min(us):.1f})  {name}", flush=True)
    if args.profile:
        profile_step(pieces(args.batch, args.heads, args.seq, args.d)["ours: forward+backward step (Fn.apply, eager)"],
                     args.calls, Path(args.profile))
    return 0


def profile_step(fn: Callable[[], object], calls: int, path: Path) -> None:
    """cProfile of `calls` calls of `fn` issued behind a GPU spin; the top 40 by own time to `path`."""
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    torch.cuda.synchronize()
    torch.cuda._sleep(SPIN_CYCLES)
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(40)
    path.write_text(text.getvalue())
    print(f"[host] profile of {calls} eager steps -> {path}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
