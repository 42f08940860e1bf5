"""Where the one-pass backward's time goes: ablations of its kernel, timed side by side.

The one-pass kernel (`flash_bwd_onepass_kernel.py`) is the dK/dV pass plus, per score tile, one
more matmul (dQ's share = dS K) and an fp32 reduction of that share into global memory. To see
what each costs, this makes versions of the kernel file by editing its source text, loads each
as a module, and times them round-robin in one process (as `ab_dkdv` does for the dK/dV pass):

    full      the kernel as committed
    no_add    dQ's share computed, never added (the add sits behind a runtime test that is false,
              so the compiler must still compute the share)
    no_dq     neither the dQ matmul nor the add (the dK/dV pass's work, in this kernel's loop)
    dp_first  dP^T = V dO^T issued before the exponentials, as the two-pass dK/dV kernel does

    just bench flash-ab-onepass --configs 64,64,4,3 --rounds 3

Each version's dK and dV are checked against the two-pass backward before timing (and dQ too for
the versions that still compute it all). Rows go to results/attention/onepass_ab/<device>.jsonl.
"""

from __future__ import annotations

import itertools
import sys
import tempfile
import textwrap
from pathlib import Path

import torch

from cs336_systems.bench.cli import Parser, open_store

from ..launch import launch_bwd_onepass
from ..table import dtype_name
from ..tuning.problem import prepare, rel_err
from .harness import add_checked, add_run_args, int_tuples, load_variant, require_gpu, time_round_robin

BENCH = "attention/onepass_ab"
KEY = ["run", "round", "variant", "block_m1", "block_n1", "num_warps1", "num_stages1", "tma"]
KERNEL_FILE = Path(__file__).parents[1] / "flash_bwd_onepass_kernel.py"
VARIANT_PACKAGE = "cs336_systems.attention.fast"  # where the kernel file lives: its relative imports resolve
DQ_LINE = "        dq = tl.dot(tl.trans(dsT), k, input_precision=INPUT_PRECISION) * sm_scale"
ADD_START = "        if DQ_TMA:"
ADD_END = "    return dk, dv\n"
NEVER = "        if n_keys < 0:  # ablation: never true, not known at compile time\n"
DV_LINE = "        dv = tl.dot(pT.to(do.dtype), do, dv, input_precision=INPUT_PRECISION)\n"
DP_LINE = "        dpT = tl.dot(v, tl.trans(do), input_precision=INPUT_PRECISION)  # (BLOCK_N, BLOCK_M)\n"
EXP_LINE = "        pT = tl.math.exp2("
VARIANTS = ("full", "no_add", "no_dq", "dp_first")
DTYPE = torch.bfloat16  # the leaderboard's (the interpreter test uses fp32)


def _guard(block: str) -> str:
    """`block` (8-space indented lines) behind the never-true runtime test."""
    return NEVER + textwrap.indent(block, "    ")


def variant_source(name: str, source: str) -> str:
    """The kernel file's text for one ablation. Raises if the kernel no longer has the lines the
    edit looks for (the ablation would silently time the unedited kernel otherwise)."""
    for marker in (DQ_LINE, ADD_START, ADD_END, DV_LINE, DP_LINE, EXP_LINE):
        if source.count(marker) != 1:
            raise ValueError(f"ab_onepass: kernel source has {source.count(marker)} copies of {marker.strip()!r}")
    if name == "full":
        return source
    if name == "dp_first":
        without = source.replace(DP_LINE, "")
        at = without.index(EXP_LINE)
        return without[:at] + DP_LINE + without[at:]
    dq_at, add_at, end_at = source.index(DQ_LINE), source.index(ADD_START), source.index(ADD_END)
    if name == "no_add":
        return source[:add_at] + _guard(source[add_at:end_at]) + source[end_at:]
    if name == "no_dq":
        return source[:dq_at] + _guard(source[dq_at:end_at]) + source[end_at:]
    raise ValueError(f"ab_onepass: unknown variant {name!r}; choose from {VARIANTS}")


def load_variants(names: list[str], workdir: Path) -> dict:
    """Each variant's kernel module (written to `workdir`, imported beside the committed kernel)."""
    source = KERNEL_FILE.read_text()
    mods = {}
    for name in names:
        path = workdir / f"onepass_{name}.py"
        path.write_text(variant_source(name, source))
        mods[name] = load_variant(f"onepass_{name}", path, VARIANT_PACKAGE)
    return mods


def onepass_runner(kernel, q, k, v, do, L, delta, block_m, block_n, warps, stages, tma):
    """A closure launching `kernel` exactly as `launch.launch_bwd_onepass` does."""
    from ...tiles import BwdConfig

    c = BwdConfig(block_m, block_n, block_m, block_n, warps, stages, warps, stages, tma1=tma)
    return lambda: launch_bwd_onepass(q, k, v, do, L, delta, True, c, kernel=kernel)


def main(argv: list[str] | None = None) -> int:
    from ...flash_launch import launch_dkdv, launch_dq, tma_ok
    from ...tiles import BwdConfig

    ap = Parser(prog="flash-ab-onepass", description=__doc__.splitlines()[0])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--configs", nargs="+", default=["64,64,4,3"], metavar="M,N,WARPS,STAGES",
                    help="one-pass tilings (block_m1, block_n1, warps, stages)")
    ap.add_argument("--tma", choices=["on", "off", "both"], default="both")
    add_run_args(ap)
    args = ap.parse_args(argv)
    configs = int_tuples(ap, "--configs", args.configs, "M,N,WARPS,STAGES")
    require_gpu(ap)
    store = open_store(ap, BENCH, KEY, root=args.results_dir)

    q, k, v, do, _o, L, delta = state = prepare(args.Z, args.seq, args.d, DTYPE)
    ref = BwdConfig(64, 64, 64, 64, 4, 2, 4, 2)
    want_dq = launch_dq(q, k, v, do, L, delta, True, ref)
    want_dkdv = launch_dkdv(q, k, v, do, L, delta, True, ref)
    tmas = {"on": [True], "off": [False], "both": [False, True]}[args.tma]
    tmas = [t for t in tmas if not t or tma_ok(q, k, v, do)]
    cells = {}
    with tempfile.TemporaryDirectory() as workdir:
        mods = load_variants(args.variants, Path(workdir))
        for (name, mod), (m, n, w, s), tma in itertools.product(mods.items(), configs, tmas):
            cell = dict(variant=name, block_m1=m, block_n1=n, num_warps1=w, num_stages1=s, tma=tma)
            fn = onepass_runner(mod.bwd_onepass_kernel, q, k, v, do, L, delta, m, n, w, s, tma)

            def error(grads, with_dq=name in ("full", "dp_first")):  # the versions that still compute dQ
                dq, dk, dv = grads
                return max(rel_err((dk, dv), want_dkdv), rel_err(dq, want_dq) if with_dq else 0.0)
            add_checked(cells, cell, fn, error)
        del state
        time_round_robin(cells, store, args.rounds, args.rep_ms, {"Z": args.Z, "seq": args.seq, "d": args.d,
                                                                  "dtype": dtype_name(DTYPE)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
