"""One GPU call that does everything, in priority order, inside a time budget.

    python3 scripts/attention/device_run.py --budget-s 420 --steps tune,pytest,leaderboard,sweep

Steps (each a subprocess with its own time limit, so one hang cannot sink the call):
  tune         measure launch plans, regenerate fast/tuned_configs.py (used by every later step)
  tune-lb      the same, for the leaderboard shape only
  tune-sweep   the same, for the sweep's shapes only
  pytest       the attention tests on the GPU (pytest-xdist), log under results/attention/flash_gpu_tests/
  leaderboard  ours vs cuDNN / flash / flex / compiled naive at the leaderboard case
  sweep        the flash_benchmarking grid (resumes; stops starting work near the budget's end)
Extra arguments for a step: --leaderboard-args "...", --sweep-args "...".
"""

from __future__ import annotations

import argparse
import datetime as dt
import shlex
import subprocess
import sys
import time
from pathlib import Path

from cs336_systems.bench.provenance import provenance
from cs336_systems.bench.store import REPO_ROOT

TEST_FILES = ["tests/test_flash_attention.py", "tests/test_onepass_ws.py", "tests/test_fwd_ws.py",
              "tests/test_weighted_sum.py", "tests/test_online_softmax.py", "tests/test_flash_precision.py",
              "tests/test_kernel_inputs.py"]
PY = sys.executable


def _run(cmd: list[str], limit_s: float, log: Path | None = None) -> int:
    print(f"\n=== {' '.join(cmd)}  (limit {limit_s:.0f} s)", flush=True)
    start = time.monotonic()
    try:
        if log is None:
            rc = subprocess.run(cmd, cwd=REPO_ROOT, timeout=limit_s).returncode
        else:
            out = subprocess.run(cmd, cwd=REPO_ROOT, timeout=limit_s, capture_output=True, text=True)
            text = out.stdout + out.stderr
            print(text[-6000:], flush=True)
            log.write_text(log.read_text() + text if log.exists() else text)
            rc = out.returncode
    except subprocess.TimeoutExpired:
        print(f"=== timed out after {limit_s:.0f} s", flush=True)
        rc = 124
    print(f"=== rc {rc} in {time.monotonic() - start:.0f} s", flush=True)
    return rc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="device_run", description=__doc__.splitlines()[0])
    ap.add_argument("--budget-s", type=float, default=420)
    ap.add_argument("--steps", default="tune,pytest,leaderboard,sweep")
    ap.add_argument("--leaderboard-args", default="")
    ap.add_argument("--sweep-args", default="")
    ap.add_argument("--pytest-workers", type=int, default=8)
    ap.add_argument("--tune-limit-s", type=float, default=300)  # every tiling is timed with and without TMA
    args = ap.parse_args(argv)
    known = {"tune", "tune-lb", "tune-sweep", "pytest", "leaderboard", "sweep"}
    steps = [s for s in args.steps.split(",") if s]
    if bad := [s for s in steps if s not in known]:
        ap.error(f"--steps: unknown {bad}; choose from {sorted(known)}")
    deadline = time.monotonic() + args.budget_s
    left = lambda: deadline - time.monotonic()  # noqa: E731
    rcs = {}
    for step in steps:
        if left() < 20:
            print(f"=== no time left for {step}", flush=True)
            rcs[step] = "skipped"
            continue
        if step in ("tune", "tune-lb", "tune-sweep"):
            cmd = [PY, "-m", "cs336_systems.bench", "flash-tune", "tune", "--write"]
            only = {"tune-lb": ["--only", "leaderboard"], "tune-sweep": ["--only", "sweep"]}.get(step, [])
            rcs[step] = _run(cmd + only, min(left(), args.tune_limit_s))
        elif step == "pytest":
            log_dir = REPO_ROOT / "results" / "attention" / "flash_gpu_tests"
            log_dir.mkdir(parents=True, exist_ok=True)
            log = log_dir / "nvidia-h200.log"
            p = provenance()
            log.write_text(f"# GPU pytest of the attention tests, {dt.datetime.now(dt.timezone.utc):%Y-%m-%dT%H:%M:%SZ}\n"
                           f"# {p['device']}; torch {p['torch']}; triton {p['triton']}; cuda {p['cuda']}; git {p['git']}\n")
            cmd = [PY, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "-n", str(args.pytest_workers),
                   *TEST_FILES]
            rcs[step] = _run(cmd, min(left(), 240), log)
        elif step == "leaderboard":
            cmd = [PY, "-m", "cs336_systems.bench", "flash-leaderboard", *shlex.split(args.leaderboard_args)]
            rcs[step] = _run(cmd, left())
        elif step == "sweep":
            minutes = max(0.5, (left() - 45) / 60)  # stop starting groups with ~45 s to spare
            cmd = [PY, "-m", "cs336_systems.bench", "flash-sweep", "--max-minutes", f"{minutes:.1f}",
                   *shlex.split(args.sweep_args)]
            rcs[step] = _run(cmd, left())
    print(f"\n=== summary: {rcs}", flush=True)
    return 0 if all(v in (0, "skipped") for v in rcs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
