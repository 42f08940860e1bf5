"""Every registered benchmark refuses a bad argument the same way: exit 2, one line on stderr that
names the flag, no process started, no results file written. In-process through main(argv), fast."""

from __future__ import annotations

import importlib
import os
import subprocess
import tarfile
from pathlib import Path

import pytest
import torch

from cs336_systems.bench.registry import BENCHMARKS
from tests.triton_mode import needs_triton

NO_GPU = not torch.cuda.is_available()
needs_no_gpu = pytest.mark.skipif(not NO_GPU, reason="the refusal is about a machine without a GPU")

# (benchmark name, argv, the flag the one-line message must name)
CASES = [
    ("model", ["--steps", "0"], "--steps"),
    ("model", ["--context-length", "0"], "--context-length"),
    ("model", ["--peak-tflops", "0"], "--peak-tflops"),
    ("model", ["--trace", "t.json"], "--trace"),
    pytest.param("model", ["--device", "cuda"], "--device", marks=needs_no_gpu),
    ("end-to-end", ["--context", "0"], "--context"),
    ("end-to-end", ["--steps", "1"], "--steps"),
    ("end-to-end", ["--modes", "sideways"], "--modes"),
    ("end-to-end", ["--sizes", "huge"], "--sizes"),
    ("end-to-end", ["--budget-s", "0"], "--budget-s"),
    ("end-to-end", ["--phase-sizes", "huge"], "--phase-sizes"),
    ("end-to-end", ["--phase-modes", "sideways"], "--phase-modes"),
    ("kernels", ["--contexts", "0"], "--contexts"),
    ("kernels", ["--mode", "sideways"], "--mode"),
    ("kernels", ["--cells", "tiny:0"], "--cells"),
    ("memory", ["--contexts", "128,-1"], "--contexts"),
    ("memory", ["--dtypes", "fp8"], "--dtypes"),
    ("memory", ["--snapshot-cells", "512/sideways/fp32"], "--snapshot-cells"),
    ("memory", ["--size", "huge"], "--size"),
    ("checkpointing", ["--context", "0"], "--context"),
    ("accumulation", ["--device", "tpu"], "--device"),
    pytest.param("accumulation", ["--device", "cuda"], "--device", marks=needs_no_gpu),
    ("attention", ["--ds", "0"], "--ds"),
    ("attention", ["--impls", "fast"], "--impls"),
    ("attention", ["--steps", "0"], "--steps"),
    ("attention", ["--batch", "-1"], "--batch"),
    ("attention-oom", ["--seqs", "0"], "--seqs"),
    ("attention-oom", ["--child-timeout-s", "0"], "--child-timeout-s"),
    ("flash-leaderboard", ["--heads", "0"], "--heads"),
    ("flash-leaderboard", ["--batch", "16", "--heads", "5"], "--heads"),
    ("flash-leaderboard", ["--tolerance", "0"], "--tolerance"),
    ("flash-sweep", ["--dims", "8"], "--dims"),
    ("flash-sweep", ["--workers", "0"], "--workers"),
    ("flash-sweep", ["--max-minutes", "0"], "--max-minutes"),
    ("flash-grid", ["--ds", "96"], "--ds"),
    ("flash-grid", ["--seqs", "0"], "--seqs"),
    ("flash-grid", ["--impls", "naive"], "--impls"),
    ("flash-host", ["--calls", "0"], "--calls"),
    ("flash-host", ["--seq", "0"], "--seq"),
    ("flash-host", ["--profile", "no/such/folder/profile.txt"], "--profile"),
    ("flash-tune", ["tune", "--workers", "0"], "--workers"),
    ("flash-tune", ["tune", "--only", "leaderboard", "--dtypes", "fp32"], "--only"),
    ("flash-tune", ["tune", "--dtypes", "fp16"], "--dtypes"),
    ("flash-ab-dkdv", ["--variant", "no-equals-sign"], "--variant"),
    ("flash-ab-dkdv", ["--variant", "x=/nonexistent.py"], "--variant"),
    ("flash-ab-onepass", ["--configs", "64,64"], "--configs"),
    pytest.param("flash-reduce-probe", ["--tiles", "64,48"], "--tiles", marks=needs_triton),  # imports triton
    ("flash-onepass-ws", ["--variants", "128,2,2"], "--variants"),
    ("flash-d128-probe", ["--cells", "1,32,4096"], "--cells"),
    ("flash-d128-probe", ["--fwd-ws", "2,128"], "--fwd-ws"),
    ("flash-ab-bwd128", ["--versions", "nope"], "--versions"),
    ("flash-ab-bwd128", ["--settings", "2"], "--settings"),
    ("ceilings", ["--size", "huge"], "--size"),
    pytest.param("collectives", ["--backend", "nccl"], "--backend", marks=needs_no_gpu),
    ("collectives", ["--world-sizes", "1"], "--world-sizes"),
    ("collectives", ["--sizes-mb", "0"], "--sizes-mb"),
    ("collectives", ["--iters", "0"], "--iters"),
    ("collectives", ["--timeout-s", "0"], "--timeout-s"),
    ("ddp", ["--context-length", "0"], "--context-length"),
    ("ddp", ["--batch-size", "-2"], "--batch-size"),
    ("ddp", ["--batch-size", "3"], "--batch-size"),
    ("ddp", ["--world-size", "0"], "--world-size"),
    ("ddp", ["--steps", "0"], "--steps"),
    ("ddp", ["--bucket-sizes-mb", "0"], "--bucket-sizes-mb"),
    ("ddp", ["--backend", "nccl"], "--backend"),
    pytest.param("ddp", ["--device", "cuda"], "--device", marks=needs_no_gpu),
    ("sharding", ["--context", "0"], "--context"),
    ("sharding", ["--world-size", "0"], "--world-size"),
    ("sharding", ["--batch", "0"], "--batch"),
    ("sharding", ["--steps", "0"], "--steps"),
    pytest.param("sharding", ["--device", "cuda"], "--device", marks=needs_no_gpu),
    ("fsdp", ["--world-size", "0"], "--world-size"),
    ("fsdp", ["--context-length", "0"], "--context-length"),
    ("fsdp", ["--batch-size", "-2"], "--batch-size"),
    ("fsdp", ["--timeout-s", "0"], "--timeout-s"),
    pytest.param("fsdp", ["--device", "cuda"], "--device", marks=needs_no_gpu),
    ("tp-ffn", ["--world-size", "1"], "--world-size"),
    ("tp-ffn", ["--tokens", "0"], "--tokens"),
    ("fused-ce", ["--positions", "0"], "--positions"),
    ("fused-ce", ["--vocab", "-3"], "--vocab"),
    ("fused-ce", ["--d-model", "x"], "--d-model"),
    ("fused-ce", ["--dtype", "fp8"], "--dtype"),
    ("fused-ce", ["--chunk-size", "0"], "--chunk-size"),
    ("fused-ce", ["--impls", "liger"], "--impls"),
    ("fused-ce", ["--rep-ms", "0"], "--rep-ms"),
    ("fused-ce", ["--device", "cpu"], "--device"),
    pytest.param("fused-ce", ["--device", "cuda"], "--device",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is about a machine without a GPU")),
    ("fused-adamw", ["--shard", "0"], "--shard"),
    ("fused-adamw", ["--size", "nope"], "--size"),
    ("fused-adamw", ["--dtype", "fp8"], "--dtype"),
    ("fused-adamw", ["--impls", "ours,apex"], "--impls"),
    ("fused-adamw", ["--device", "cpu"], "--device"),
    ("fused-adamw", ["--device", "tpu"], "--device"),
    pytest.param("fused-adamw", ["--device", "cuda"], "--device",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is about a machine without a GPU")),
    ("training-step", ["--batch", "0"], "--batch"),
    ("training-step", ["--variant", "fastest"], "--variant"),
    ("training-step", ["--size", "tiny", "--keep-blocks", "3"], "--keep-blocks"),
    ("training-step", ["--size", "tiny", "--device", "cpu", "--world-size", "3"], "--batch"),
    ("training-step", ["--size", "8B", "--device", "cpu", "--variant", "plain"], "--variant"),  # cannot fit
    pytest.param("training-step", ["--device", "cuda"], "--device", marks=needs_no_gpu),
]




def test_every_registered_benchmark_has_bad_argument_cases():
    covered = {c.values[0] if hasattr(c, "values") else c[0] for c in CASES}
    assert covered == set(BENCHMARKS)


@pytest.mark.parametrize("bench, argv, flag", CASES)
def test_bad_argument_exits_2_with_one_line_naming_the_flag(bench, argv, flag, tmp_path, capsys,
                                                           no_new_processes):
    main = importlib.import_module(BENCHMARKS[bench].module).main
    results = tmp_path / "results"
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--results-dir", str(results)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert flag in err[0], err[0]
    assert not results.exists() or not any(p.is_file() for p in results.rglob("*"))


UNPACK = Path(__file__).resolve().parents[1] / "scripts" / "unpack_results.sh"


def _empty_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    return repo


def _archive(tmp_path: Path, name: str, text: str, *members: str) -> Path:
    """A .tgz holding `text` under each member name (what on_device.sh packs)."""
    (tmp_path / "x.jsonl").write_text(text)
    with tarfile.open(tmp_path / name, "w:gz") as tar:
        for member in members:
            tar.add(tmp_path / "x.jsonl", arcname=member)
    return tmp_path / name


def test_unpack_results_refuses_an_archive_reaching_outside_results(tmp_path):
    """scripts/unpack_results.sh extracts into the repository: only plain files under results/."""
    repo = _empty_repo(tmp_path)
    for bad in (_archive(tmp_path, "code.tgz", "{}\n", "results/a/x.jsonl", "cs336_systems/__init__.py"),
                _archive(tmp_path, "dots.tgz", "{}\n", "results/../pyproject.toml")):
        out = subprocess.run(["bash", str(UNPACK), str(bad)], cwd=repo, capture_output=True, text=True)
        assert out.returncode == 1 and "not under results/" in out.stderr
        assert [p.name for p in repo.iterdir()] == [".git"]  # nothing extracted, not even the good file
    good = _archive(tmp_path, "good.tgz", "{}\n", "results/a/x.jsonl")
    assert subprocess.run(["bash", str(UNPACK), str(good)], cwd=repo, capture_output=True).returncode == 0
    assert (repo / "results" / "a" / "x.jsonl").read_text() == "{}\n"


def test_unpack_results_appends_rows_instead_of_dropping_an_earlier_calls(tmp_path):
    """Two calls from one snapshot each bring the snapshot's rows plus their own: unpacking the
    second after the first must keep the first call's rows (a store is appended to, not replaced)."""
    repo = _empty_repo(tmp_path)
    store = repo / "results" / "b" / "x.jsonl"
    store.parent.mkdir(parents=True)
    store.write_text('{"row": 0}\n')  # the snapshot's rows
    for name, rows in (("call1.tgz", '{"row": 0}\n{"row": 1}\n'), ("call2.tgz", '{"row": 0}\n{"row": 2}\n')):
        archive = _archive(tmp_path, name, rows, "results/b/x.jsonl")
        subprocess.run(["bash", str(UNPACK), str(archive)], cwd=repo, check=True, capture_output=True)
    assert store.read_text() == '{"row": 0}\n{"row": 1}\n{"row": 2}\n'


SCRIPTS = UNPACK.parent


def test_gpu_snapshot_writes_the_commit_and_on_device_refuses_another(tmp_path):
    """gpu_snapshot.sh writes the snapshot's commit into it; on_device.sh stamps rows with it and
    refuses, before running anything, a CS336_GIT_COMMIT that names another commit."""
    repo = _empty_repo(tmp_path)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "one"], check=True)
    bad = subprocess.run(["bash", str(SCRIPTS / "gpu_snapshot.sh"), "no-such-rev"], cwd=repo, capture_output=True, text=True)
    assert bad.returncode == 2 and "no commit named 'no-such-rev'" in bad.stderr
    assert not (repo / ".gpu_snapshot").exists()
    subprocess.run(["bash", str(SCRIPTS / "gpu_snapshot.sh")], cwd=repo, check=True, capture_output=True)
    head = subprocess.run([*git, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True).stdout.strip()
    snap = repo / ".gpu_snapshot"
    assert (snap / ".commit").read_text().strip() == head
    assert subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True).stdout == ""  # ignored
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "OUT": str(out), "CS336_GIT_COMMIT": "0" * 12}
    wrong = subprocess.run(["bash", str(SCRIPTS / "on_device.sh"), "touch ran"], cwd=snap, env=env,
                           capture_output=True, text=True)
    assert wrong.returncode == 2 and f"this snapshot is {head}" in wrong.stderr
    assert not (snap / "ran").exists() and not any(out.iterdir())
