"""Head dim 128 against cuDNN: the Gluon forward's settings, the tuned table's Triton kernels and
SDPA's cuDNN backend at the cells where real models run, timed round-robin in one process.

    just bench flash-d128-probe                       # every cell, every forward setting
    just bench flash-d128-probe --cells 1,32,32768,1 --fwd-ws 2,128,2

A cell is (batch, heads, seq, causal). Each forward is checked against cuDNN's output first, each
Gluon backward against the table's Triton one (bf16 operands: a relative error near 4e-3 is the
rounding of the output alone; 2e-2 means a wrong kernel; the tests compare with float64);
a setting that does not compile (shared memory, registers) is reported and skipped. Rows go to
results/attention/d128_probe/<device>.jsonl, one per timing, with the run's id.
"""

from __future__ import annotations

import itertools
import sys
import time
import traceback

import torch

from cs336_systems.bench.cli import Parser, open_store

from .harness import add_timing_args, cudnn_attention, int_tuples, require_gpu

BENCH = "attention/d128_probe"
CELLS = ["1,32,32768,1", "2,32,4096,1", "1,16,16384,0", "2,16,8192,0", "1,16,4096,1"]
FWD_WS = ["2,128,3", "2,128,2", "2,64,4", "3,64,3"]
BWD_WS = ["2,1", "2,2"]
TOL = 2e-2  # bf16 output rounding is ~4e-3 relative; a wrong tile or mask is far above


def main(argv: list[str] | None = None) -> int:
    from cs336_systems.attention.flash_launch import launch_preprocess
    from cs336_systems.bench.timing import gpu_bench

    from ..gluon.bwd128_ws import launch_bwd128_ws
    from ..gluon.fwd_ws import launch_fwd_ws
    from ..launch import launch_bwd, launch_fwd
    from ..table import lookup_bwd, lookup_fwd
    from ..tuned_configs import TUNED

    ap = Parser(prog="flash-d128-probe", description=__doc__.splitlines()[0])
    ap.add_argument("--cells", nargs="+", default=CELLS, metavar="BATCH,HEADS,SEQ,CAUSAL")
    ap.add_argument("--fwd-ws", nargs="+", default=FWD_WS, metavar="WARPGROUPS,BLOCK_N,STAGES")
    ap.add_argument("--bwd-ws", nargs="+", default=BWD_WS, metavar="STAGES,SLOTS",
                    help="settings of the d = 128 Gluon backward (gluon/flash_bwd128_ws_kernel.py)")
    ap.add_argument("--groups", nargs="+", type=int, default=[0], metavar="G",
                    help="heads whose programs run together in the Gluon kernels (0: the launcher's rule; "
                         "larger than batch x heads: all)")
    ap.add_argument("--no-bwd", action="store_true", help="forward only")
    add_timing_args(ap)
    args = ap.parse_args(argv)
    cells = int_tuples(ap, "--cells", args.cells, "BATCH,HEADS,SEQ,CAUSAL")
    settings = int_tuples(ap, "--fwd-ws", args.fwd_ws, "WARPGROUPS,BLOCK_N,STAGES")
    bwd_settings = int_tuples(ap, "--bwd-ws", args.bwd_ws, "STAGES,SLOTS")
    require_gpu(ap)
    store = open_store(ap, BENCH, ["run", "round", "batch", "heads", "seq", "causal", "impl", "pass"],
                       root=args.results_dir)
    run = time.strftime("%Y%m%dT%H%M%S")
    d = 128
    for batch, heads, seq, causal in cells:
        causal = bool(causal)
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, do = [torch.randn(batch, heads, seq, d, device="cuda", dtype=torch.bfloat16, generator=g)
                       for _ in range(4)]
        want = cudnn_attention(q, k, v, causal)
        fplan = lookup_fwd(TUNED, q.dtype, d, causal, batch * heads, seq, seq)
        bplan = lookup_bwd(TUNED, q.dtype, d, causal, batch * heads, seq, seq)
        fns = {("cudnn", "fwd"): lambda: cudnn_attention(q, k, v, causal),
               ("table", "fwd"): lambda: launch_fwd(q, k, v, causal, fplan)}
        groups = sorted({min(g, batch * heads) for g in args.groups})
        for (nw, bn, st), gr in itertools.product(settings, groups):
            fns[(f"gluon_ws nw{nw} bn{bn} st{st} g{gr}", "fwd")] = (
                lambda nw=nw, bn=bn, st=st, gr=gr: launch_fwd_ws(q, k, v, causal, bn, st, nw, group=gr or None))
        if not args.no_bwd:
            qr, kr, vr = (t.detach().clone().requires_grad_() for t in (q, k, v))

            def cudnn_fb():
                out = cudnn_attention(qr, kr, vr, causal)
                return torch.autograd.grad(out, (qr, kr, vr), do)

            o, L = launch_fwd(q, k, v, causal, fplan)
            fns[("cudnn", "fwd+bwd")] = cudnn_fb
            fns[("table", "bwd")] = lambda: launch_bwd(q, k, v, o, L, do, causal, bplan)
            bwd_want = launch_bwd(q, k, v, o, L, do, causal, bplan)
            nw, bn, st = settings[0]  # the first forward setting, for ours forward+backward
            for (bst, bsl), gr in itertools.product(bwd_settings, groups):
                fns[(f"gluon_bwd128 st{bst} sl{bsl} g{gr}", "bwd")] = (
                    lambda bst=bst, bsl=bsl, gr=gr: launch_bwd128_ws(q, k, v, do, L, launch_preprocess(o, do), causal,
                                                                     bst, bsl, group=gr or None))

                def ours_fb(bst=bst, bsl=bsl, gr=gr):
                    o2, L2 = launch_fwd_ws(q, k, v, causal, bn, st, nw, group=gr or None)
                    return launch_bwd128_ws(q, k, v, do, L2, launch_preprocess(o2, do), causal, bst, bsl,
                                            group=gr or None)
                fns[(f"gluon fwd nw{nw} bn{bn} st{st} + bwd128 st{bst} sl{bsl} g{gr}", "fwd+bwd")] = ours_fb
        ok = {}
        for key, fn in fns.items():
            try:
                t0 = time.perf_counter()
                out = fn()
                torch.cuda.synchronize()
                if key[1] == "fwd":
                    got = out[0] if isinstance(out, tuple) else out
                    err = float((got.float() - want.float()).norm() / want.float().norm())
                elif key[0] != "cudnn" and key[0] != "table":  # dQ, dK, dV against the table's backward
                    err = max(float((a.float() - b.float()).norm() / b.float().norm()) for a, b in zip(out, bwd_want))
                else:
                    err = 0.0
                print(f"[d128] {batch}x{heads}x{seq} causal={causal} {key}: ready in "
                      f"{time.perf_counter() - t0:.1f} s, rel err vs cuDNN {err:.2e}", flush=True)
                if err < TOL:
                    ok[key] = (fn, err)
                else:
                    print("[d128]   wrong: not timed", flush=True)
            except Exception as exc:  # a setting that does not compile or launch: say so, go on
                print(f"[d128]   {key} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}", flush=True)
                traceback.print_exc(limit=1)
        times = {key: [] for key in ok}
        for r in range(args.rounds):
            for key, (fn, err) in ok.items():
                ms = gpu_bench(fn, warmup_ms=10, rep_ms=args.rep_ms)
                times[key].append(ms)
                store.append({"run": run, "round": r, "batch": batch, "heads": heads, "seq": seq,
                              "causal": causal, "impl": key[0], "pass": key[1]},
                             {"ms": ms, "rel_err": err, "d": d})
        med = {key: sorted(ts)[len(ts) // 2] for key, ts in times.items()}
        print(f"[d128] === {batch}x{heads}x{seq}x{d} causal={causal}")
        for key, ms in sorted(med.items(), key=lambda kv: (kv[0][1], kv[1])):
            ref = med.get(("cudnn", key[1]))
            ratio = f"  {ref / ms:.3f}x cuDNN" if ref and key[0] != "cudnn" else ""
            print(f"[d128]   {key[1]:8s} {ms:8.3f} ms  {key[0]}{ratio}")
        ok = fns = None  # the closures hold this cell's tensors
        torch.cuda.empty_cache()
    _resources()
    return 0


def _resources() -> None:
    """Registers, spills and shared memory of every Gluon forward this run compiled."""
    from ..direct_launch import direct
    from ..gluon.flash_fwd_ws_kernel import fwd_ws_kernel

    for key, (compiled, _) in direct(fwd_ws_kernel).compiled.items():
        consts = {k: v for k, v in key[1] if k in ("BN", "STAGES", "NW", "CAUSAL", "MATH_REGS", "maxnreg")}
        print(f"[d128] resources {consts}: regs {compiled.n_regs}, spills {compiled.n_spills}, "
              f"shared {compiled.metadata.shared} B", flush=True)


if __name__ == "__main__":
    sys.exit(main())
