"""scripts/two_gpu_runs.sh: the lines it would run on two GPUs (and on one) are valid commands of
their tools, its own bad arguments are refused before anything runs, and every run works end to
end on CPU gloo ranks at the tiny size (TINY=1: the same lines with each tool's CPU flags)."""

from __future__ import annotations

import importlib
import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from cs336_systems.bench.registry import BENCHMARKS

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "two_gpu_runs.sh"
RUNS = ["1", "2", "3", "shared"]

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="the script is bash")


def _script(*runs: str, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if k not in ("TINY", "DRY", "CS336_RESULTS_DIR")}
    return subprocess.run(["bash", str(SCRIPT), *runs], cwd=ROOT, env={**full, **env},
                          capture_output=True, text=True, timeout=900)


def _commands(stderr: str) -> list[list[str]]:
    """The `+ ...` lines the script prints before running each command, as argv lists."""
    return [shlex.split(line[2:]) for line in stderr.splitlines() if line.startswith("+ ")]


def _parser(argv: list[str]):
    """The argparse parser of the tool an argv runs, and the arguments it is given."""
    argv = [a for a in argv if "=" not in a or a.startswith("-")]  # drop VAR=value prefixes
    assert argv[:2] == ["python", "-m"], argv
    if argv[2] == "cs336_systems.bench":
        return importlib.import_module(BENCHMARKS[argv[3]].module).build_parser(), argv[4:]
    return importlib.import_module(argv[2]).build_parser(), argv[3:]


def test_the_gpu_lines_are_valid_commands_of_their_tools():
    out = _script(*RUNS, DRY="1")
    assert out.returncode == 0, out.stderr
    commands = _commands(out.stderr)
    benches = [c for c in commands if "cs336_systems.bench" in c]
    assert [c[c.index("cs336_systems.bench") + 1] for c in benches] == [
        "fsdp", "tp-ffn", "ddp", "sharding", "training-step", "training-step", "fsdp"]
    for argv in commands:
        if "pytest" in argv:
            assert all((ROOT / a).is_file() for a in argv if a.startswith("tests/")), argv
            continue
        parser, args = _parser(argv)
        parser.parse_args(args)  # exits 2 on a flag the tool does not take
    # the 2026 xl (our 2.7B preset) wherever the issue names it
    for argv in benches[:1] + benches[2:4] + benches[6:]:
        assert argv[argv.index("--size") + 1] == "2.7B", argv
    shared = benches[-1]
    assert shared[0] == "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    assert shared[shared.index("--ranks-per-gpu") + 1] == "2" and "gloo" in shared


@pytest.mark.parametrize("argv", [["bogus"], ["1", "4"], ["1d"]])
def test_an_unknown_run_is_refused_before_anything_runs(argv, tmp_path):
    out = _script(*argv, TINY="1", CS336_RESULTS_DIR=str(tmp_path))
    assert out.returncode == 2 and "unknown run" in out.stderr
    assert not _commands(out.stderr) and not any(tmp_path.iterdir())


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="has 2 GPUs")
def test_without_the_gpus_nothing_runs():
    out = _script("1")
    assert out.returncode == 2 and "1a needs 2 GPU(s)" in out.stderr
    assert not _commands(out.stderr)


def test_a_failed_gate_skips_the_rest_of_its_run(tmp_path):
    # the one-GPU run's tiny GPU test gates its 2.7B run; a pytest that cannot start stands in
    out = _script("shared", TINY="1", CS336_RESULTS_DIR=str(tmp_path), PYTEST_ADDOPTS="--no-such-flag")
    assert out.returncode == 1 and "shared_b: skipped (shared_a failed)" in out.stderr
    assert not (tmp_path / "fsdp").exists(), "the benchmark did not run"


def _rows(root: Path, bench: str) -> list[dict]:
    return [json.loads(line) for line in (root / bench / "cpu.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("run", RUNS)
def test_every_run_works_end_to_end_on_cpu_ranks(run, tmp_path):
    out = _script(run, TINY="1", CS336_RESULTS_DIR=str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    if run == "1":
        rows = _rows(tmp_path, "fsdp/steps")
        assert len(rows) == 7 and all(r["status"] == "ok" and r["ranks_per_gpu"] == 1 for r in rows)
        assert {r["variant"] for r in _rows(tmp_path, "fsdp/trace")} == {"fsdp", "fsdp-bf16"}
        assert (tmp_path / "traces" / "fsdp" / "fsdp_fsdp.json.gz").is_file()
        assert all(r["status"] == "ok" for r in _rows(tmp_path, "parallelism/tp_ffn"))
    elif run == "2":
        assert {r["stage"] for r in _rows(tmp_path, "ddp/steps")} >= {"naive", "flat", "overlap"}
        assert {r["method"] for r in _rows(tmp_path, "sharding/step_time")} == {
            "ddp", "sharded", "zero1", "zero_redundancy"}
    elif run == "3":
        rows = _rows(tmp_path, "training-step")
        assert sorted((r["variant"], r["flags"]["shard"]) for r in rows) == [
            ("ours", "fsdp"), ("ours", "fsdp2"), ("stock", "fsdp2")]
        assert all(r["status"] == "ok" and r["world_size"] == 2 for r in rows)
        assert all(r["flags"]["keep_blocks"] == 2 for r in rows), "tiny: both blocks fit kept"
    else:
        rows = _rows(tmp_path, "fsdp/steps")
        assert [r["variant"] for r in rows] == ["fsdp", "fsdp2", "fsdp-bf16", "fsdp2-bf16", "zero1", "ddp"]
        assert all(r["ranks_per_gpu"] == 2 and r["step_ms"] is None for r in rows)
