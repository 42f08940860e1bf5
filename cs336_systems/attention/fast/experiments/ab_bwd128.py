"""Versions of the head-dim-128 Gluon backward, timed round-robin beside the table's Triton
backward and cuDNN's forward+backward at one shape (the 8B step's attention by default).

    just bench flash-ab-bwd128
    just bench flash-ab-bwd128 --versions full no_reduce dq_writer --settings 2,1 3,1

A version is the committed kernel's source with one edit (`bwd128_versions.VERSIONS`) or a
kernel of its own (`OWN_KERNELS`, its launch here). Each is checked against the Triton
backward (dQ, dK, dV) before it is timed; ablations that leave dQ out are checked on dK, dV only.
Rows go to results/attention/ab_bwd128/<device>.jsonl.
"""

from __future__ import annotations

import itertools
import sys
import tempfile
from pathlib import Path

import torch

from cs336_systems.bench.cli import Parser, open_store

from .bwd128_versions import (
    DQ_WRONG,
    KERNEL_FILE,
    OWN_KERNELS,
    SOLO_FILE,
    VARIANT_PACKAGE,
    VERSIONS,
    pointer_dq,
    variant_source,
)
from .harness import add_timing_args, cudnn_attention, int_tuples, load_variant, require_gpu, time_round_robin

BENCH = "attention/ab_bwd128"


def _launch_pointer_dq(q, k, v, do, L, delta, is_causal, stages, slots, kernel, group=None):
    """`launch_bwd128_ws` of a version that adds into dQ by pointer: its dq_desc gets the tensor."""
    from ..direct_launch import for_triton
    from ..gluon.bwd128_ws import prepare

    Z, H, n_q, d = q.shape
    prepared = prepare(Z * H, n_q, k.shape[2], d, q.dtype, is_causal, stages, slots)
    dq, dk, dv, args = prepared.outputs_and_args(q, k, v, do, L, delta, group)
    kernel[prepared.grid](*for_triton(args[:6] + (dq,) + args[7:]), **prepared.constexprs)
    return dq.to(q.dtype), dk, dv


SOLO_BN = 64  # keys per program of the solo kernel


def solo_args(q, k, v, do, L, delta, is_causal: bool, stages: int, group: int | None = None):
    """(grid, runtime args, constexprs, dQ's fp32 sum, dK, dV) of the solo kernel's launch."""
    from ..direct_launch import Tma
    from ..gluon.bwd128_ws import BM, _rows, heads_per_group, reread_bytes_per_head

    Z, H, n_q, d = q.shape
    n_k = k.shape[2]
    if n_q % BM or n_k % SOLO_BN or d != 128:
        raise ValueError(f"solo: needs d = 128, n_q a multiple of {BM} and n_k of {SOLO_BN}; got {tuple(q.shape)}")
    from ...flash_launch import _scales

    sm_scale, qk_scale = _scales(d)
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    g = group or heads_per_group(Z * H, reread_bytes_per_head(n_q, d, q.dtype))
    g_q, g_k = _rows(Z * H * n_q, d, (BM, d), q.dtype), _rows(Z * H * n_k, d, (SOLO_BN, d), q.dtype)
    g_dq = _rows(Z * H * n_q, d, (BM, 64), torch.float32)
    args = (Tma(q, *g_q), Tma(k, *g_k), Tma(v, *g_k), Tma(do, *g_q), L, delta, Tma(dq, *g_dq), dk, dv, n_q, n_k,
            qk_scale, sm_scale, g)
    # two programs an SM: 8 warps (the loader warp padded to a warpgroup) of 128 registers at launch
    constexprs = dict(D=d, BM=BM, BN=SOLO_BN, STAGES=stages, CAUSAL=is_causal, LOADER_REGS=24, num_warps=4,
                      maxnreg=128)
    return (n_k // SOLO_BN, Z * H), args, constexprs, dq, dk, dv


def _launch_solo(q, k, v, do, L, delta, is_causal, stages, slots, kernel, group=None):
    from ..direct_launch import for_triton

    grid, args, constexprs, dq, dk, dv = solo_args(q, k, v, do, L, delta, is_causal, stages, group)
    kernel[grid](*for_triton(args), **constexprs)
    return dq.to(q.dtype), dk, dv


def main(argv: list[str] | None = None) -> int:
    from cs336_systems.attention.flash_launch import launch_preprocess

    from ..gluon.bwd128_ws import launch_bwd128_ws
    from ..launch import launch_bwd, launch_fwd
    from ..table import lookup_bwd, lookup_fwd
    from ..tuned_configs import TUNED

    ap = Parser(prog="flash-ab-bwd128", description=__doc__.splitlines()[0])
    ap.add_argument("--versions", nargs="+", default=list(VERSIONS), metavar="VERSION",
                    help=f"one of {', '.join(VERSIONS)}, or several joined by '+'; or {', '.join(OWN_KERNELS)}")
    ap.add_argument("--settings", nargs="+", default=["2,1", "2,2"], metavar="STAGES,SLOTS")
    ap.add_argument("--groups", nargs="+", type=int, default=[0], metavar="G",
                    help="heads whose programs run together (0: the launcher's rule)")
    ap.add_argument("--shape", default="1,32,32768,1", metavar="BATCH,HEADS,SEQ,CAUSAL")
    add_timing_args(ap)
    args = ap.parse_args(argv)
    settings = int_tuples(ap, "--settings", args.settings, "STAGES,SLOTS")
    if bad := [v for v in args.versions if v not in OWN_KERNELS and any(p not in VERSIONS for p in v.split("+"))]:
        ap.error(f"--versions: unknown {bad}; choose from {list(VERSIONS)}, or join them with '+'; or one of {list(OWN_KERNELS)}")
    (batch, heads, seq, causal), = int_tuples(ap, "--shape", [args.shape], "BATCH,HEADS,SEQ,CAUSAL")
    causal = bool(causal)
    require_gpu(ap)
    if any(not 0 <= g <= batch * heads for g in args.groups):
        ap.error(f"--groups: each must be in [0, {batch * heads}] (batch x heads), got {args.groups}")
    store = open_store(ap, BENCH, ["run", "round", "impl", "version", "stages", "slots", "group", "batch", "heads",
                                   "seq", "causal"], root=args.results_dir)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = [torch.randn(batch, heads, seq, 128, device="cuda", dtype=torch.bfloat16, generator=g)
                   for _ in range(4)]
    o, L = launch_fwd(q, k, v, causal, lookup_fwd(TUNED, q.dtype, 128, causal, batch * heads, seq, seq))
    delta = launch_preprocess(o, do)
    plan = lookup_bwd(TUNED, q.dtype, 128, causal, batch * heads, seq, seq)
    triton_bwd = lambda: launch_bwd(q, k, v, o, L, do, causal, plan)  # noqa: E731
    want = triton_bwd()
    qr, kr, vr = (t.detach().clone().requires_grad_() for t in (q, k, v))

    def cudnn(backward: bool):
        out = cudnn_attention(qr, kr, vr, causal)
        return torch.autograd.grad(out, (qr, kr, vr), do) if backward else out

    none = (("stages", 0), ("slots", 0), ("group", 0))
    cells = {(("impl", "triton (table)"), ("version", ""), *none): (triton_bwd, 0.0),
             (("impl", "cudnn fwd+bwd"), ("version", ""), *none): (lambda: cudnn(True), 0.0),
             (("impl", "cudnn fwd"), ("version", ""), *none): (lambda: cudnn(False), 0.0)}
    source = KERNEL_FILE.read_text()
    with tempfile.TemporaryDirectory() as workdir:
        for version, (stages, slots), group in itertools.product(args.versions, settings, args.groups):
            if version == "solo":
                kernel = load_variant("bwd128_solo", SOLO_FILE, VARIANT_PACKAGE).bwd128_solo_kernel
                launch = _launch_solo
            else:
                path = Path(workdir) / f"bwd128_{version}.py"
                if not path.exists():
                    path.write_text(variant_source(version, source))
                kernel = load_variant(f"bwd128_{version}", path, VARIANT_PACKAGE).bwd128_ws_kernel
                launch = _launch_pointer_dq if pointer_dq(version) else launch_bwd128_ws
            fn = lambda kern=kernel, st=stages, sl=slots, g=group, launch=launch: launch(  # noqa: E731
                q, k, v, do, L, delta, causal, st, sl, kernel=kern, group=g or None)
            got = fn()  # compiles
            pairs = list(zip(got, want))[1 if any(a in version for a in DQ_WRONG) else 0:]
            err = max(float((a.float() - b.float()).norm() / b.float().norm()) for a, b in pairs)
            print(f"[ab_bwd128] {version} stages={stages} slots={slots} group={group}: rel err vs Triton {err:.2e}", flush=True)
            if not err < 3e-2:
                raise SystemExit(f"[ab_bwd128] {version} {stages},{slots} is wrong (rel err {err:.3g}); not timing it")
            cells[(("impl", "gluon bwd128"), ("version", version), ("stages", stages), ("slots", slots),
                   ("group", group))] = (fn, err)
        time_round_robin(cells, store, args.rounds, args.rep_ms,
                         {"batch": batch, "heads": heads, "seq": seq, "causal": causal, "d": 128, "dtype": "bf16"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
