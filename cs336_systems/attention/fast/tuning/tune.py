"""Choose tile sizes / warps / stages for the FlashAttention-2 kernels by measurement.

    just bench flash-tune tune [--only leaderboard|sweep|grid] [--dtypes bf16,fp32] [--kinds ...] [--write]
    just bench flash-tune write-table

For each table key (dtype, padded head dim, mask, size class) at a representative shape, every
candidate of each kernel (forward, dK/dV pass, dQ pass, one-pass backward, the Gluon forward and
one-pass backward where they apply, then fused launches of the best dK/dV and dQ pairs) is compiled
(in parallel worker processes, which fill Triton's on-disk cache), checked against the heuristic
configuration's output (the backward ones against the two-pass backward), and timed
with do_bench (median). A single short timing can be moved a few percent by when it ran (the
GPU's clock follows its power and temperature), so the fastest few of each kernel are then timed
again in interleaved rounds and ranked by their median (`confirm`). Rows go to
results/attention/flash_tune/<device>.jsonl (each candidate's launch plan as its flat fields,
`plans.fwd_fields` / `bwd_fields`); `write-table` turns the latest run of each (key, kernel) into
`fast/tuned_configs.py`, the table `FlashAttentionFast` looks shapes up in (`--kinds` re-times some
kernels only).
"""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import json
import multiprocessing as mp
import os
import pprint
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from cs336_systems.bench.cli import Parser, csv_of
from cs336_systems.bench.store import ResultStore

from ...flash_launch import dot_precision
from ...tiles import BwdConfig, heuristic_bwd, heuristic_fwd
from ..plans import BwdPlan, FwdPlan, bwd_fields, fwd_fields
from ..table import key_is_causal, table_key
from . import problem
from .tune_candidates import (  # noqa: F401
    bwd_from,
    dkdv_candidates,
    dq_candidates,
    fwd_candidates,
    fwd_ws_candidates,
    fwd_ws_from,
    onepass_candidates,
    onepass_from,
    ws_candidates,
    ws_from,
)

BENCH = "attention/flash_tune"
TABLE_PATH = Path(__file__).parents[1] / "tuned_configs.py"
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
CONFIRM_TOP, CONFIRM_ROUNDS = 4, 3  # re-timed candidates per kernel, interleaved rounds
TMA = (False, True)  # tile loads by pointers, or by tensor descriptors (flash_launch.tma_ok decides if usable)
KINDS = ("fwd", "fwd_ws", "dkdv", "dq", "onepass", "ws", "fused")


# (key, Z, N, d, dtype, wide search); the mask is the key's (`key_is_causal`). Z stands for
# batch x heads (the problem is (Z, 1, N, d)). The leaderboard shape stands for bf16-d64-causal-large.
def tune_shapes(only: str | None, dtypes: tuple[str, ...] = ("bf16", "fp32"),
                head_dims: tuple[int, ...] = (16, 32, 64, 128)) -> list[tuple[str, int, int, int, str, bool]]:
    """The (key, Z, N, d, dtype, wide) shapes `only` names, those of `dtypes` and `head_dims`."""
    return [s for s in _all_shapes(only) if s[4] in dtypes and s[3] in head_dims]


def _all_shapes(only: str | None) -> list[tuple[str, int, int, int, str, bool]]:
    leaderboard = (table_key(torch.bfloat16, 64, True, "large"), 16, 16384, 64, "bf16", True)
    shapes = [leaderboard] if only in (None, "leaderboard") else []
    if only in (None, "sweep"):
        # Small launches (a few programs) are latency-bound: they borrow the medium entry. The
        # leaderboard's key is tuned at the leaderboard's shape only (`--only sweep` leaves it alone).
        # fp32 is tuned at the medium shape only and its large launches borrow that plan: with
        # true-fp32 dots a candidate at 65,536 takes up to seconds a call, and there are hundreds.
        sizes = {"bf16": (("medium", 16384), ("large", 65536)), "fp32": (("medium", 16384),)}
        for dt, d in itertools.product(("bf16", "fp32"), (16, 32, 64, 128)):
            for size, n in sizes[dt]:
                # the key names the dtype itself (not DTYPES, which the interpreter's dry run remaps)
                key = table_key({"bf16": torch.bfloat16, "fp32": torch.float32}[dt], d, True, size)
                if key != leaderboard[0]:
                    shapes.append((key, 1, n, d, dt, False))
    if only in (None, "grid"):
        # The flash-grid's shapes (bf16, d 64/128, 16 or 32 heads, 1k-32k): the non-causal keys at a
        # middle shape of their size class (16 x 2,048; 32 x 8,192), and the training step's
        # attention (32 heads x 32,768, d = 128, causal: the "huge" class) with the wide search.
        for d, (size, Z, n) in itertools.product((64, 128), (("medium", 16, 2048), ("large", 32, 8192))):
            shapes.append((table_key(torch.bfloat16, d, False, size), Z, n, d, "bf16", False))
        shapes.append((table_key(torch.bfloat16, 128, True, "huge"), 32, 32768, 128, "bf16", True))
    return shapes


def _dots(dtype: torch.dtype) -> dict[str, str]:
    """An fp32 row's `fp32_dots`: the precision its tl.dots ran in ("ieee" or "tf32", PyTorch's
    setting at the time: flash_launch.dot_precision). Other dtypes' rows do not depend on it."""
    return {"fp32_dots": dot_precision(dtype)} if dtype == torch.float32 else {}


def _timed_the_table_kernels(row: dict) -> bool:
    """Whether a row timed kernels the table serves. The table serves PyTorch's default fp32 setting,
    true fp32 dots; fp32 rows without `fp32_dots` were timed before the kernels followed that setting,
    when every fp32 dot ran as TF32 (Triton's default), so they describe other kernels."""
    return not str(row.get("key", "")).startswith("fp32") or row.get("fp32_dots") == "ieee"


# -- work done for one candidate, in a worker (precompile) or in the timing process -------------

def _fields(kind: str, plan) -> dict:
    """A candidate's plan as its result row stores it."""
    return fwd_fields(plan) if kind in ("fwd", "fwd_ws") else bwd_fields(plan)


def _runner(kind: str, plan, state, causal: bool):
    from ...flash_launch import launch_bwd_fused, launch_dkdv, launch_dq, launch_fwd
    from ..gluon.fwd_ws import launch_fwd_ws
    from ..launch import launch_bwd_onepass, launch_gluon_bwd

    q, k, v, do, o, L, delta = state
    c, g = plan.tiles, plan.gluon
    if kind == "fwd":
        return lambda: launch_fwd(q, k, v, causal, c)[0]
    if kind == "fwd_ws":  # raises where the Gluon kernel does not apply (never falls back to Triton)
        return lambda: launch_fwd_ws(q, k, v, causal, g.block_n, g.stages, g.warpgroups)[0]
    if kind == "dkdv":
        return lambda: launch_dkdv(q, k, v, do, L, delta, causal, c)
    if kind == "dq":
        return lambda: launch_dq(q, k, v, do, L, delta, causal, c)
    if kind == "onepass":  # dQ, dK, dV (with the zeroing and the cast of the fp32 dQ buffer)
        return lambda: launch_bwd_onepass(q, k, v, do, L, delta, causal, c)
    if kind == "ws":  # raises where the Gluon kernel does not apply (never falls back to Triton)
        return lambda: launch_gluon_bwd(q, k, v, do, L, delta, causal, g)
    return lambda: launch_bwd_fused(q, k, v, do, L, delta, causal, c)


def _compile_job(job: tuple) -> str | None:
    """Run one candidate once (in a worker): compiles it into Triton's on-disk cache."""
    kind, config, Z, N, d, dt, causal = job
    try:
        _runner(kind, config, problem.prepare(Z, N, d, DTYPES[dt], causal), causal)()
        if problem.DEVICE == "cuda":
            torch.cuda.synchronize()
        return None
    except Exception as exc:  # noqa: BLE001 - reported per candidate
        return f"{type(exc).__name__}: {str(exc)[:300]}"


def precompile(pool: cf.Executor | None, jobs: list[tuple]) -> dict[tuple, str | None]:
    """Compile every distinct (kernel, config, d, dtype) once, in parallel worker processes that
    share Triton's disk cache; returns the compile error (or None) of each job."""
    identity = lambda j: (j[0], j[1], j[4], j[5], j[6])  # noqa: E731 - shapes of one size share a binary
    unique = list({identity(j): j for j in jobs}.values())
    errors = list(pool.map(_compile_job, unique, chunksize=1)) if pool else [_compile_job(j) for j in unique]
    by_identity = {identity(j): e for j, e in zip(unique, errors)}
    return {j: by_identity[identity(j)] for j in jobs}


def time_candidates(store: ResultStore, run: str, key: str, Z: int, N: int, d: int, dt: str, wide: bool,
                    kind: str, configs: list, errors: dict) -> list[tuple[float, object]]:
    """Check each compiled candidate against the heuristic config's result, then time it."""
    from cs336_systems.bench.timing import gpu_bench

    dtype, causal = DTYPES[dt], key_is_causal(key)
    state = problem.prepare(Z, N, d, dtype, causal)
    base = FwdPlan(heuristic_fwd(dtype, d)) if kind in ("fwd", "fwd_ws") else BwdPlan(heuristic_bwd(dtype, d))
    if kind == "fwd_ws":  # checked against the Triton forward
        want = _runner("fwd", base, state, causal)()
    elif kind in ("onepass", "ws"):  # checked against the two-pass (dQ, dK, dV), not against itself
        want = (_runner("dq", base, state, causal)(), *_runner("dkdv", base, state, causal)())
    else:
        want = _runner(kind, base, state, causal)()
    tol = 1e-2 if dtype == torch.float32 else 3e-2
    results = []
    for config in configs:
        cfg = {"key": key, "kernel": kind, "config": _fields(kind, config), "run": run, "Z": Z, "seq": N, "d": d, "dtype": dt,
               **_dots(dtype)}
        error = errors[(kind, config, Z, N, d, dt, causal)]
        if error:
            store.append(cfg, status="unsupported", error=error)
            continue
        fn = _runner(kind, config, state, causal)
        try:
            err = problem.rel_err(fn(), want)
        except Exception as exc:  # noqa: BLE001 - e.g. out of shared memory at launch
            store.append(cfg, status="unsupported", error=f"{type(exc).__name__}: {exc}")
            continue
        if not err < tol:
            store.append(cfg, {"rel_err": err}, status="error", error=f"wrong result: rel err {err:.3g}")
            continue
        ms = gpu_bench(fn, warmup_ms=10, rep_ms=60 if wide else 30)
        store.append(cfg, {"ms": ms, "rel_err": err})
        results.append((ms, config))
    return sorted(results, key=lambda r: r[0])


def confirm(store: ResultStore, run: str, key: str, Z: int, N: int, d: int, dt: str, wide: bool, kind: str,
            ranked: list[tuple[float, object]]) -> list[tuple[float, object]]:
    """Time the fastest CONFIRM_TOP candidates again, round-robin over CONFIRM_ROUNDS rounds (so a
    drift in clocks hits each alike), and rank them by their median; the rest keep their order."""
    from cs336_systems.bench.timing import gpu_bench

    top = [c for _, c in ranked[:CONFIRM_TOP]]
    if len(top) < 2:
        return ranked
    causal = key_is_causal(key)
    state = problem.prepare(Z, N, d, DTYPES[dt], causal)
    runners = [_runner(kind, c, state, causal) for c in top]
    times: list[list[float]] = [[] for _ in top]
    for r in range(CONFIRM_ROUNDS):
        for c, fn, ts in zip(top, runners, times):
            ms = gpu_bench(fn, warmup_ms=10, rep_ms=60 if wide else 30)
            ts.append(ms)
            store.append({"key": key, "kernel": kind, "config": _fields(kind, c), "run": run, "Z": Z, "seq": N, "d": d,
                          "dtype": dt, **_dots(DTYPES[dt]), "phase": "confirm", "round": r}, {"ms": ms})
    confirmed = sorted(((statistics.median(ts), c) for c, ts in zip(top, times)), key=lambda mc: mc[0])
    return confirmed + ranked[CONFIRM_TOP:]


def tune(store: ResultStore, shapes: list[tuple], pool: cf.Executor | None, write: bool = False,
         kinds: tuple[str, ...] = KINDS) -> None:
    """Tune every shape (only the kernels in `kinds`). With `write`, the table is regenerated after
    each key, so a run cut short still leaves a table of what it measured."""
    run = time.strftime("%Y%m%dT%H%M%S")
    plans = []
    for key, Z, N, d, dt, wide in shapes:
        dtype = DTYPES[dt]
        cands = {
            "fwd": [FwdPlan(replace(c, tma=t)) for c in fwd_candidates(dtype, d, wide) for t in TMA],
            "fwd_ws": [fwd_ws_from(c, dtype, d) for c in fwd_ws_candidates(dtype, d, wide)],
            # each tiling with pointer loads and with TMA descriptors (Hopper)
            "dkdv": [bwd_from(c, (64, 32, 4, 2), tma1=t) for c in dkdv_candidates(dtype, d, wide) for t in TMA],
            "dq": [bwd_from((32, 64, 4, 2), c, tma2=t) for c in dq_candidates(dtype, d, wide) for t in TMA],
            "onepass": [onepass_from(c, t) for c in onepass_candidates(dtype, d, wide) for t in TMA],
            "ws": [ws_from(c, dtype, d) for c in ws_candidates(dtype, d, wide)]}
        plans.append((key, Z, N, d, dt, wide, {kind: cs for kind, cs in cands.items() if kind in kinds and cs}))
    jobs = [(kind, c, Z, N, d, dt, key_is_causal(key)) for key, Z, N, d, dt, _, cands in plans
            for kind, cs in cands.items() for c in cs]
    started = time.perf_counter()
    errors = precompile(pool, jobs)
    print(f"[tune] compiled {len(jobs)} candidates in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    fused_plans = []
    for key, Z, N, d, dt, wide, cands in plans:
        best = {kind: confirm(store, run, key, Z, N, d, dt, wide, kind,
                              time_candidates(store, run, key, Z, N, d, dt, wide, kind, cs, errors))
                for kind, cs in cands.items()}
        print(f"[tune] {key}: " + "; ".join(f"{k} {v[0] if v else None}" for k, v in best.items()),
              file=sys.stderr, flush=True)
        if write:
            write_table(store.rows(), str(Path(BENCH) / store.path.name))
        if "fused" in kinds and best.get("dkdv") and best.get("dq"):
            # One launch takes the larger shared memory and register count of its two programs, so
            # besides the two fastest dQ tiles try the fastest small one (lets more programs share an SM).
            dq_pool = [b.tiles for _, b in best["dq"][:2]]
            dq_pool += [b.tiles for _, b in best["dq"] if b.tiles.block_m2 <= 64 and b.tiles not in dq_pool][:1]
            dkdv_pool = [a.tiles for _, a in best["dkdv"][:2]]
            fused = [BwdPlan(BwdConfig(a.block_m1, a.block_n1, b.block_m2, b.block_n2, a.num_warps1, a.num_stages1,
                                       a.num_warps1, a.num_stages1, True, tma1=a.tma1, tma2=b.tma2))
                     for a, b in itertools.product(dkdv_pool, dq_pool)]
            fused_plans.append((key, Z, N, d, dt, wide, fused))
    jobs = [("fused", c, Z, N, d, dt, key_is_causal(key)) for key, Z, N, d, dt, _, cs in fused_plans for c in cs]
    errors = precompile(pool, jobs)
    for key, Z, N, d, dt, wide, cs in fused_plans:
        confirm(store, run, key, Z, N, d, dt, wide, "fused",
                time_candidates(store, run, key, Z, N, d, dt, wide, "fused", cs, errors))
    if write:
        write_table(store.rows(), str(Path(BENCH) / store.path.name))


# -- from measurements to the table ---------------------------------------------------------------

def choose(rows: list[dict]) -> dict[str, dict[str, dict]]:
    """The table: per key, the fastest forward; for backward the fastest of (best dK/dV + best dQ),
    the best fused launch and the best one-pass backward, with the Gluon backward's settings and
    `gluon_ws` added where its best beat all of those (the Triton fields stay: they run the inputs
    the Gluon kernel does not take). Only each (key, kernel)'s latest tuning run counts; where it
    has confirmation rounds, their medians decide (single timings otherwise). Where a key has rows
    at its own shape (`tune_shapes`), rows at other shapes do not count. fp32 rows count only if
    their dots were true fp32 (`_timed_the_table_kernels`)."""
    rows = [r for r in rows if _timed_the_table_kernels(r)]
    shape_of = {key: (Z, N) for key, Z, N, *_ in tune_shapes(None)}
    at_own = lambda r: (r.get("Z"), r.get("seq")) == shape_of.get(r.get("key"))  # noqa: E731
    own_keys = {r["key"] for r in rows if at_own(r)}
    rows = [r for r in rows if r.get("key") not in own_keys or at_own(r)]
    latest: dict[tuple[str, str], str] = {}  # (key, kernel) -> its newest run with a timing
    for r in rows:
        if r.get("status") == "ok":
            slot = (r["key"], r["kernel"])
            latest[slot] = max(latest.get(slot, ""), r["run"])
    timings: dict[tuple[str, str], dict[str, list]] = {}  # slot -> config (JSON) -> [times]
    confirmed: set[tuple[str, str]] = set()
    for r in rows:
        slot = (r.get("key"), r.get("kernel"))
        if r.get("status") != "ok" or r["run"] != latest[slot]:
            continue
        if r.get("phase") == "confirm":
            if slot not in confirmed:  # the first confirmation row replaces the single timings
                confirmed.add(slot)
                timings[slot] = {}
        elif slot in confirmed:
            continue
        timings.setdefault(slot, {}).setdefault(json.dumps(r["config"], sort_keys=True), []).append(r["ms"])
    best: dict[tuple[str, str], tuple[float, dict]] = {}
    for slot, per_config in timings.items():
        ms, config = min((statistics.median(ts), c) for c, ts in per_config.items())
        best[slot] = (ms, json.loads(config))
    table: dict[str, dict[str, dict]] = {"fwd": {}, "bwd": {}}
    for key in sorted({k for k, _ in latest}):
        if (key, "fwd") in best:
            t, fwd = best[(key, "fwd")]
            fwd = {k: v for k, v in fwd.items() if k != "gluon_ws" and not k.startswith("ws_")}
            if (key, "fwd_ws") in best and best[(key, "fwd_ws")][0] < t:
                fwd |= {k: v for k, v in best[(key, "fwd_ws")][1].items() if k.startswith("ws_")} | {"gluon_ws": True}
            table["fwd"][key] = fwd
        if (key, "dkdv") in best and (key, "dq") in best:
            (t1, c1), (t2, c2) = best[(key, "dkdv")], best[(key, "dq")]
            dq_fields = ("block_m2", "block_n2", "num_warps2", "num_stages2", "tma2")
            t, bwd = t1 + t2, {**c1, **{k: c2[k] for k in dq_fields if k in c2}, "fused": False}
            for kind in ("fused", "onepass"):
                if (key, kind) in best and best[(key, kind)][0] < t:
                    t, bwd = best[(key, kind)]
            bwd = {k: v for k, v in bwd.items() if k != "gluon_ws" and not k.startswith("ws_")}
            if (key, "ws") in best and best[(key, "ws")][0] < t:
                ws = best[(key, "ws")][1]
                bwd |= {k: v for k, v in ws.items() if k.startswith("ws_")} | {"gluon_ws": True}
            table["bwd"][key] = bwd
    return table


def write_table(rows: list[dict], source: str) -> Path:
    table = choose(rows)
    gits = sorted({r.get("git", "?") for r in rows if r.get("status") == "ok"})
    TABLE_PATH.write_text(
        '"""Launch plans chosen by measurement (`plans.fwd_plan` / `bwd_plan` read an entry). GENERATED:\n'
        "do not edit; regenerate with `just bench flash-tune write-table` (or re-measure with `tune`).\n\n"
        f"Source: {source} (code at git {', '.join(gits)}).\n"
        '"""\n\n'
        f"TUNED = {pprint.pformat(table, width=110, sort_dicts=True)}\n")
    return TABLE_PATH


def main(argv: list[str] | None = None) -> int:
    ap = Parser(prog="flash-tune", description="measure launch plans on this GPU, or regenerate the table")
    sub = ap.add_subparsers(dest="command", required=True)
    t = sub.add_parser("tune", help="measure candidates on this GPU")
    t.add_argument("--only", choices=["leaderboard", "sweep", "grid"], default=None)
    t.add_argument("--dtypes", type=csv_of(choices=list(DTYPES)), default=list(DTYPES),
                   help="tune the keys of these dtypes only (comma-separated)")
    t.add_argument("--head-dims", type=csv_of(int, choices=[16, 32, 64, 128]), default=[16, 32, 64, 128],
                   help="tune the keys of these head dims only (comma-separated)")
    t.add_argument("--workers", type=int, default=max(1, min(14, (os.cpu_count() or 2) - 2)))
    t.add_argument("--write", action="store_true", help="regenerate tuned_configs.py afterwards")
    t.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS),
                   help="re-time only these kernels (the table keeps each other kernel's latest run)")
    t.add_argument("--results-dir", default=None)
    w = sub.add_parser("write-table", help="regenerate fast/tuned_configs.py from stored measurements")
    w.add_argument("--results-dir", default=None)
    w.add_argument("--device", default="nvidia-h200")
    args = ap.parse_args(argv)
    if args.command == "write-table":
        store = ResultStore(BENCH, key=["key", "kernel", "config", "run"], device=args.device, root=args.results_dir)
        if not store.path.exists():
            ap.error(f"--results-dir: no tuning results at {store.path}")
        print(write_table(store.rows(), str(Path(BENCH) / store.path.name)))
        return 0
    if args.workers < 1:
        ap.error(f"--workers must be at least 1, got {args.workers}")
    shapes = tune_shapes(args.only, tuple(args.dtypes), tuple(args.head_dims))
    if not shapes:
        ap.error(f"--only {args.only} --dtypes {','.join(args.dtypes)} --head-dims "
                 f"{','.join(map(str, args.head_dims))}: no table key to tune "
                 f"(the leaderboard and grid keys are bf16)")
    if not torch.cuda.is_available():
        ap.error("tune needs a CUDA GPU (timings on the interpreter mean nothing)")
    store = ResultStore(BENCH, key=["key", "kernel", "config", "run"], root=args.results_dir)
    if args.workers > 1:
        with cf.ProcessPoolExecutor(args.workers, mp_context=mp.get_context("spawn")) as pool:
            tune(store, shapes, pool, args.write, tuple(args.kinds))
    else:
        tune(store, shapes, None, args.write, tuple(args.kinds))
    return 0
