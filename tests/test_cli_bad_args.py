"""Every registered benchmark refuses a bad argument the same way: exit 2, one line on stderr that
names the flag, no process started, no results file written. In-process through main(argv), fast."""

from __future__ import annotations

import importlib
import json
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
    ("flash-ab-bwd128", ["--rounds", "0"], "--rounds"),
    ("flash-d128-probe", ["--rep-ms", "0"], "--rep-ms"),
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
    pytest.param("flash-d128-probe", ["--cells", "1,2,3"], "--cells", marks=needs_triton),  # imports triton
    # -- issue 28 (2): the fit check, before any process starts (far past any host's memory)
    ("sharding", ["--context", "99999999"], "--context"),
    ("ddp", ["--size", "8B", "--world-size", "1", "--batch-size", "1"], "--size"),
    ("fsdp", ["--size", "8B"], "--size"),
    ("tp-ffn", ["--tokens", "100000000000"], "--tokens"),
    ("model", ["--size", "2.7B", "--context-length", "65536", "--device", "cpu"], "--context-length"),
    ("end-to-end", ["--device", "cpu", "--sizes", "2.7B", "--context", "65536", "--part", "timings"], "--context"),
    ("kernels", ["--device", "cpu", "--cells", "2.7B:65536"], "--cells"),
    ("memory", ["--device", "cpu", "--contexts", "65536"], "--contexts"),
    ("checkpointing", ["--device", "cpu", "--context", "65536"], "--context"),
    ("attention", ["--device", "cpu", "--seqs", "262144", "--probe-seqs", ""], "--seqs"),
    ("attention-oom", ["--device", "cpu", "--seqs", "1048576"], "--seqs"),
    # -- issue 28 (4): bounds of numeric flags, and flags this combination would ignore
    ("collectives", ["--sizes-mb", "1e-9"], "--sizes-mb"),  # 0 bytes: measures nothing
    ("collectives", ["--timeout-s", "1e308"], "--timeout-s"),  # past what c10d takes
    ("collectives", ["--timeout-s", "inf"], "--timeout-s"),
    ("collectives", ["--sizes-mb", "1", "1"], "--sizes-mb"),
    ("collectives", ["--world-sizes", "2", "2"], "--world-sizes"),
    ("model", ["--seed", str(2**64)], "--seed"),  # past torch.manual_seed's range
    ("model", ["--seed", "-1"], "--seed"),
    ("model", ["--peak-tflops", "inf"], "--peak-tflops"),
    ("model", ["--rope-theta", "inf"], "--rope-theta"),
    ("ddp", ["--timeout-s", "1e308"], "--timeout-s"),
    ("ddp", ["--stages", "naive", "naive"], "--stages"),
    ("ddp", ["--stages", "naive", "--bucket-sizes-mb", "5"], "--bucket-sizes-mb"),
    ("sharding", ["--methods", "ddp", "ddp"], "--methods"),
    ("sharding", ["--methods", "zero1", "--ddp", "bucketed"], "--ddp"),
    ("sharding", ["--timeout-s", "1e308"], "--timeout-s"),
    ("fsdp", ["--variants", "ddp", "--trace-variants", "fsdp", "--trace-dir", "traces"], "--trace-variants"),
    ("fsdp", ["--trace-variants", "fsdp"], "--trace-variants"),  # without --trace-dir: nothing traced
    ("fsdp", ["--variants", "ddp", "ddp"], "--variants"),
    ("fsdp", ["--timeout-s", "1e308"], "--timeout-s"),
    ("tp-ffn", ["--timeout-s", "1e308"], "--timeout-s"),
    ("tp-ffn", ["--tokens", "16,16"], "--tokens"),
    ("training-step", ["--seed", str(2**64)], "--seed"),
    ("training-step", ["--timeout-s", "1e308"], "--timeout-s"),
    ("training-step", ["--variant", "stock", "stock"], "--variant"),
    ("attention-oom", ["--child-timeout-s", "1e308"], "--child-timeout-s"),
    ("end-to-end", ["--sizes", "tiny,tiny"], "--sizes"),
    ("end-to-end", ["--device", "cpu", "--part", "warmup", "--record-clocks"], "--record-clocks"),
    ("end-to-end", ["--device", "cpu", "--part", "timings", "--compile-sizes", "small"], "--compile-sizes"),
    ("kernels", ["--device", "cpu", "--cells", "tiny:16", "--sizes", "tiny"], "--cells"),
    ("kernels", ["--device", "cpu", "--cells", "tiny:16,tiny:16"], "--cells"),
    ("memory", ["--device", "cpu", "--size", "tiny", "--snapshot-cells", "512/train/fp32"], "--snapshot-cells"),
    ("attention", ["--device", "cpu", "--probe-seqs", "", "--probe-d", "32"], "--probe-d"),
    # -- issue 28 (8): --resume names a run of this results file
    ("ceilings", ["--device", "cpu", "--size", "small", "--resume", "nope"], "--resume"),
    ("ceilings", ["--device", "cpu", "--size", "small", "--resume"], "--resume"),  # no file, no run
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


# -- issue 28: runs a user can trust ---------------------------------------------------------------

GPU_BENCHMARKS = [name for name, b in BENCHMARKS.items() if b.gpu]
# The [gpu] benchmarks with a CPU smoke run (--device cpu --results-dir DIR); the others refuse a CPU.
CPU_SMOKE = ["ceilings", "end-to-end", "kernels", "memory", "checkpointing", "attention", "attention-oom"]


@pytest.fixture
def cpu_only(monkeypatch, tmp_path):
    """A machine without a GPU (even on a GPU node), whose default results root is a scratch folder:
    whatever a refused run would have written lands there, not in the repository."""
    from cs336_systems.bench import store

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    default = tmp_path / "default-results"
    monkeypatch.setattr(store, "DEFAULT_ROOT", default)
    return default


def _refused(main, argv, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("bench", GPU_BENCHMARKS)
def test_every_gpu_benchmark_refuses_a_cpu_only_machine_in_one_line(bench, cpu_only, capsys, no_new_processes):
    """Issue 28 (1): no [gpu] benchmark starts on the CPU by default, and none writes a row."""
    main = importlib.import_module(BENCHMARKS[bench].module).main
    line = _refused(main, [], capsys)
    assert "GPU" in line and "0 visible" in line or "CUDA GPU" in line, line
    assert not cpu_only.exists()


@pytest.mark.parametrize("bench", CPU_SMOKE)
def test_a_cpu_smoke_run_of_a_gpu_benchmark_must_name_its_results_dir(bench, cpu_only, capsys, no_new_processes):
    """--device cpu without --results-dir would add cpu.jsonl files beside the committed GPU rows."""
    main = importlib.import_module(BENCHMARKS[bench].module).main
    line = _refused(main, ["--device", "cpu"], capsys)
    assert "--results-dir" in line
    assert not cpu_only.exists()


def test_the_gpu_benchmarks_without_a_cpu_run_refuse_device_cpu(cpu_only, capsys):
    for bench in sorted(set(GPU_BENCHMARKS) - set(CPU_SMOKE)):
        main = importlib.import_module(BENCHMARKS[bench].module).main
        line = _refused(main, ["--device", "cpu", "--results-dir", str(cpu_only)], capsys)
        assert "--device" in line, (bench, line)  # a CPU it refuses, or a flag it does not have
    assert not cpu_only.exists()


def test_allow_oom_runs_what_the_fit_check_refuses(tmp_path, no_new_processes):
    """--allow-oom passes the fit check: the run gets as far as starting its ranks."""
    from cs336_systems.distributed import ddp_bench

    with pytest.raises(AssertionError, match="a process was started"):
        ddp_bench.main(["--size", "8B", "--world-size", "1", "--batch-size", "1", "--allow-oom",
                        "--results-dir", str(tmp_path)])


def test_the_fit_check_uses_ram_per_rank_on_a_cpu_and_the_gpu_memory_with_cuda(monkeypatch):
    from cs336_systems.bench import fit

    pages = {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": 2**20}  # 4 GiB of RAM
    monkeypatch.setattr(fit.os, "sysconf", pages.__getitem__)
    assert fit.capacity_bytes("cpu", 4) == (2**30, "1.0 GiB, this host's RAM / 4 rank(s)")

    class Props:
        total_memory = 80 * 2**30

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: Props)
    assert fit.capacity_bytes("cuda", 2)[0] == 80 * 2**30  # a GPU per rank: not divided


def _committed_rows(bench: str) -> list[dict]:
    from cs336_systems.bench.store import COMMITTED_ROOT, read_rows, results_path

    path = results_path(bench, "nvidia-h200", COMMITTED_ROOT)
    return read_rows(path) if path.exists() else []


def test_the_fit_check_refuses_no_cell_the_h200_measured_and_some_it_could_not():
    """The lower bound is a lower bound: every committed `ok` cell of the model sweeps is below the
    H200's memory (its capacity from the committed OOM rows' allocator message), and the fp32 train
    step at context 2,048, which ran out of memory, is above it."""
    from cs336_systems.bench.fit import step_memory
    from cs336_systems.model import get_config

    capacity = {r["capacity_mib"] for r in _committed_rows("memory/peaks") if r.get("capacity_mib")}
    if not capacity:
        pytest.skip("no committed OOM row with the allocator's capacity")
    have = max(capacity) * 2**20
    checked, refused = 0, []
    for bench in ("memory/peaks", "end-to-end/timings", "profiling/kernel_cells", "memory/checkpointing"):
        for r in _committed_rows(bench):
            k = r.get("checkpoint_every") or 0
            cfg = get_config(r["size"], r["context"])
            need = step_memory(cfg, r["mode"], batch=r["batch"], context=r["context"], bf16=r["dtype"] == "bf16",
                               checkpointed_blocks=cfg.num_layers - k if k else 0,
                               attention=r.get("attention", "naive"))
            if r["status"] == "ok":
                checked += 1
                assert need.lower_bound <= have, (bench, r["size"], r["context"], r["mode"], need.explain())
            elif r["status"] == "oom" and need.lower_bound > have:
                refused.append((bench, r["context"], r["mode"], r["dtype"]))
    assert checked > 50
    assert ("memory/peaks", 2048, "train", "fp32") in refused


# -- (3) where the rows go is checked before the first cell -----------------------------------------

def _ceilings_refuses(argv, capsys, monkeypatch) -> str:
    from cs336_systems.bench import ceilings

    monkeypatch.setattr(ceilings, "measure", lambda *a: pytest.fail("measured before checking the destination"))
    return _refused(ceilings.main, ["--device", "cpu", "--size", "small", *argv], capsys)


@pytest.mark.parametrize("where", ["a file", "under a file", "/proc", "/sys"])
def test_a_results_dir_that_cannot_take_the_rows_is_refused_naming_it(where, tmp_path, capsys, monkeypatch):
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory\n")
    root = {"a file": a_file, "under a file": a_file / "results", "/proc": Path("/proc/cs336-results"),
            "/sys": Path("/sys/cs336-results")}[where]
    line = _ceilings_refuses(["--results-dir", str(root)], capsys, monkeypatch)
    assert str(a_file if where != "/proc" and where != "/sys" else where) in line, line
    assert a_file.read_text() == "not a directory\n"


def test_an_empty_results_dir_is_refused_not_taken_as_the_current_directory(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert "--results-dir" in _ceilings_refuses(["--results-dir", ""], capsys, monkeypatch)
    assert not any(tmp_path.iterdir())
    from cs336_systems.distributed import fsdp_bench  # a --results-dir without a type of its own

    assert "--results-dir" in _refused(fsdp_bench.main, ["--results-dir", ""], capsys)


CORRUPT = {  # results file content -> the line the refusal names
    "invalid UTF-8": (b'{"schema": "cs336-results/1", "x": "\xff"}\n', 1),
    "non-JSON torn tail": (b"xyz garbage", 1),
    "garbage in the middle": (None, 2),
    "row missing the key fields": (None, 1),
}


@pytest.mark.parametrize("case", [*CORRUPT, "a directory"])
def test_a_corrupt_results_file_is_refused_before_the_first_cell_naming_file_and_line(case, tmp_path, capsys,
                                                                                     monkeypatch):
    from cs336_systems.bench import ceilings
    from cs336_systems.bench.store import ResultStore, results_path

    path = results_path(ceilings.BENCH, "cpu", tmp_path)
    path.parent.mkdir(parents=True)
    if case == "a directory":
        path.mkdir()
        where = str(path)
    else:
        content, line_no = CORRUPT[case]
        if content is None:  # a good row first (and for the key case, one without the key fields)
            good = ResultStore(ceilings.BENCH, ceilings.KEY, device="cpu", root=tmp_path / "good")
            row = good.append({"op": "copy", "dtype": "fp32", "n": 1}, {"ms": 1.0})
            if case == "row missing the key fields":
                row.pop("op")
                content = (json.dumps(row) + "\n").encode()
            else:
                content = (json.dumps(row) + "\nnot a row\n" + json.dumps(row) + "\n").encode()
        path.write_bytes(content)
        where = f"{path}:{line_no}"
    before = path.read_bytes() if path.is_file() else None
    line = _ceilings_refuses(["--results-dir", str(tmp_path)], capsys, monkeypatch)
    assert where in line, line
    assert (path.read_bytes() if path.is_file() else None) == before  # left as it was


# -- (8) a second invocation measures again; --resume goes on with an interrupted one ---------------

def _stub_bench(argv: list[str], measure) -> int:
    """The smallest sweep CLI: four cells, --resume, the shared store and runner."""
    from cs336_systems.bench.cli import Parser, add_resume, open_store, results_root
    from cs336_systems.bench.sweep import exit_code, run_sweep

    p = Parser(prog="stub")
    p.add_argument("--results-dir", type=results_root, required=True)
    add_resume(p)
    args = p.parse_args(argv)
    store = open_store(p, "stub/cells", ["n"], device="cpu", root=args.results_dir)
    return exit_code(run_sweep(store, [{"n": n} for n in range(4)], measure), "stub")


def test_a_second_invocation_over_committed_rows_measures_every_cell_again(tmp_path):
    from cs336_systems.bench.store import ResultStore, read_rows

    committed = ResultStore("stub/cells", ["n"], device="cpu", root=tmp_path)
    for n in range(4):  # the committed rows: every cell done (rows from before run ids, too)
        row = committed.append({"n": n}, {"v": -1})
    path = committed.path
    path.write_text(path.read_text().replace(f', "invocation": "{row["invocation"]}"', ""))
    seen: list[int] = []
    argv = ["--results-dir", str(tmp_path)]
    assert _stub_bench(argv, lambda c: (seen.append(c["n"]), {"v": c["n"]})[1]) == 0
    assert seen == [0, 1, 2, 3]
    rows = read_rows(path)
    assert [r["v"] for r in rows] == [-1] * 4 + [0, 1, 2, 3]
    assert len({r.get("invocation") for r in rows[4:]}) == 1 and "invocation" not in rows[0]


def test_an_interrupted_invocation_resumes_with_resume_and_only_then(tmp_path, capsys):
    from cs336_systems.bench.store import read_rows

    argv = ["--results-dir", str(tmp_path)]

    def dies_at_two(cell):
        if cell["n"] == 2:
            raise KeyboardInterrupt
        return {"v": cell["n"]}

    with pytest.raises(KeyboardInterrupt):
        _stub_bench(argv, dies_at_two)
    path = tmp_path / "stub" / "cells" / "cpu.jsonl"
    run = read_rows(path)[0]["invocation"]
    seen: list[int] = []
    assert _stub_bench([*argv, "--resume"], lambda c: (seen.append(c["n"]), {"v": c["n"]})[1]) == 0
    assert seen == [2, 3]  # the newest run's unfinished cells only
    assert "resuming run" in capsys.readouterr().err
    assert [r["invocation"] for r in read_rows(path)] == [run] * 4
    assert _stub_bench([*argv, "--resume", run], lambda c: pytest.fail("all done")) == 0  # by its id
    seen.clear()
    assert _stub_bench(argv, lambda c: (seen.append(c["n"]), {"v": c["n"]})[1]) == 0 and seen == [0, 1, 2, 3]


def test_ctrl_c_says_in_one_line_what_was_written_and_how_to_go_on(tmp_path, monkeypatch, capsys):
    """bench/__main__.py: a KeyboardInterrupt out of a benchmark is one line, exit 130."""
    from cs336_systems.bench import __main__ as bench_main
    from cs336_systems.bench import ceilings

    calls = []

    def interrupted_at_the_third(cell, device):
        if len(calls) == 2:
            raise KeyboardInterrupt
        calls.append(cell)
        return {"ms": 1.0}

    monkeypatch.setattr(ceilings, "measure", interrupted_at_the_third)
    code = bench_main.main(["ceilings", "--device", "cpu", "--size", "small", "--results-dir", str(tmp_path)])
    assert code == 130
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    last = lines[-1]
    assert last.startswith("bench ceilings: interrupted (Ctrl-C); wrote 2 row(s) in ") and "--resume " in last
    assert not any("Traceback" in line for line in lines)
    run = last.split("--resume ")[1].split()[0]
    monkeypatch.setattr(ceilings, "measure", lambda cell, device: {"ms": 2.0})
    assert bench_main.main(["ceilings", "--device", "cpu", "--size", "small", "--results-dir", str(tmp_path),
                            "--resume", run]) == 0
    from cs336_systems.bench.store import read_rows

    rows = read_rows(tmp_path / "ceilings" / "cpu.jsonl")
    assert [r["ms"] for r in rows] == [1.0, 1.0] + [2.0] * (len(rows) - 2) and {r["invocation"] for r in rows} == {run}


def test_bench_all_prints_rough_times_from_committed_rows_then_progress(tmp_path, monkeypatch, capsys):
    from cs336_systems.bench import bench_all
    from cs336_systems.bench.store import ResultStore

    # a file whose rows are 60 s apart: every cell counts the minute since the row before it,
    # the first the median; a cell measured twice counts once (its newest row)
    store = ResultStore("ceilings", ["op", "dtype", "n"], device="nvidia-h200", root=tmp_path)
    rows = [store.append({"op": "copy", "dtype": "fp32", "n": n}, {"ms": 1.0}) for n in (1, 2, 3, 3)]
    lines = [json.dumps({**r, "time_utc": f"2026-01-01T00:0{i}:00Z"}) for i, r in enumerate(rows)]
    store.path.write_text("\n".join(lines) + "\n")
    assert bench_all.estimate(BENCHMARKS["ceilings"], tmp_path) == (180.0, 3)
    bench_all.print_plan([], root=tmp_path)
    out = capsys.readouterr().out
    assert "ceilings" in out and "~  3 min  (3 cells)" in out and "memory" in out and "(no committed rows)" in out

    ran = []
    monkeypatch.setattr(bench_all.subprocess, "run",
                        lambda cmd: (ran.append(cmd[3:]), type("Done", (), {"returncode": 1 if cmd[3] == "memory" else 0}))[1])
    assert bench_all.run_all(["--budget-s", "60"], root=tmp_path) == 1
    out = capsys.readouterr().out
    names = [n for n, b in BENCHMARKS.items() if b.gpu]
    assert [c[0] for c in ran] == names
    assert ran[names.index("memory")] == ["memory", "--allow-oom", "--budget-s", "60"]
    assert f"== [1/{len(names)}] ceilings (about 3 min;" in out and "!! exit 1" in out
    assert f"{len(names) - 1} of {len(names)} benchmarks exited 0; not: memory (1)" in out


def test_every_timed_results_file_names_key_fields_its_committed_rows_have():
    """bench-all's estimate reads the registry's files by their cell keys: a committed row without
    them would make every cell look the same."""
    from cs336_systems.bench.store import COMMITTED_ROOT, check_results_file, results_path

    for name, b in BENCHMARKS.items():
        for bench, key in b.timed:
            path = results_path(bench, "nvidia-h200", COMMITTED_ROOT)
            if path.exists():
                check_results_file(path, key)  # raises, naming file and line
