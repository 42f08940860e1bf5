"""What the pages say that is not about committed results but about this checkout's code, tests and
history, and so is no build-time claim (report/registry.py): it needs git, a pytest collection, a
stand-in GPU or the course adapters in tests/. Each test names the sentence it guards (by the claim
marker next to it where there is one)."""

from __future__ import annotations

import inspect
import json
import re
import subprocess
import sys
import types

import pytest
import torch

from report import flash_grid, gpu_tests
from report.results import REPO_ROOT
from tests import adapters
from tests.claims.test_claims import USES


def _git(*args: str) -> subprocess.CompletedProcess:
    try:
        out = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True)
    except FileNotFoundError:
        pytest.skip("git is not installed")
    if out.returncode != 0:
        pytest.skip(f"git {' '.join(args[:2])}: not in this clone's history (a shallow clone?)")
    return out


def test_the_gpu_tests_ran_the_current_attention_code():
    # beside flash.gpu_tests_pass: nothing the tests run or check changed since the run's commit
    # (working tree included); the tuner and the benchmarks measure, the tests do not run them
    assert ("claim", "flash.gpu_tests_pass") in USES
    paths = ["cs336_systems/attention", "cs336_systems/model", *gpu_tests.TEST_FILES, "tests/tolerances.py",
             "tests/adapters.py", "tests/conftest.py", ":(exclude)cs336_systems/attention/fast/tuning",
             ":(exclude)cs336_systems/attention/benchmarks"]
    assert _git("diff", "--name-only", gpu_tests.log_git(gpu_tests.NEWEST_RUNS[-1]), "--", *paths).stdout.split() == []


def test_every_collected_gpu_test_is_in_the_log():
    # beside flash.every_gpu_test_passed_or_skipped: the total is every test the files hold now
    # (a GPU adds no ids, its skips are marks), none left out, none cut by a time limit
    assert ("claim", "flash.every_gpu_test_passed_or_skipped") in USES
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:randomly",
                          *gpu_tests.TEST_FILES], capture_output=True, text=True, cwd=REPO_ROOT, check=True)
    assert set(gpu_tests.outcomes().test) == {line for line in out.stdout.splitlines() if "::" in line}


def test_the_tested_code_differs_from_the_grids_only_outside_the_bf16_plans():
    # grid.md: "Its attention code differs from the grid's version only in parts that leave the bf16
    # kernels and their tiles unchanged: a warning for untuned shapes, the tuner, the cache key of the
    # direct launch and the table's fp32 entries"
    tested, grid = gpu_tests.log_git(gpu_tests.NEWEST_RUNS[-1]), flash_grid.newest_git()
    table = "cs336_systems/attention/fast/tuned_configs.py"
    assert set(_git("diff", "--name-only", grid, tested, "--", "cs336_systems/attention").stdout.split()) == {
        "cs336_systems/attention/fast/direct_launch.py", "cs336_systems/attention/fast/table.py",
        "cs336_systems/attention/fast/tuning/tune.py", table}
    tables = []
    for rev in (grid, tested):
        scope: dict = {}
        exec(_git("show", f"{rev}:{table}").stdout, scope)
        tables.append({kind: {k: v for k, v in e.items() if not k.startswith("fp32")} for kind, e in scope["TUNED"].items()})
    assert tables[0] == tables[1]


@pytest.mark.parametrize("which", ["fwd", "bwd"])
def test_which_head_dims_the_gluon_kernels_take(monkeypatch, which):
    # grid.md: "The Gluon backward takes only d = 64 (`ws_supported`: "written for head dim 64")":
    # asked on a stand-in for a Hopper tensor; the forward now takes d = 128 too
    import triton

    from cs336_systems.attention.fast.gluon import fwd_ws, onepass_ws

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(triton, "__version__", "3.6.0")

    def ask(d):
        t = types.SimpleNamespace(is_cuda=True, device="cuda:0", dtype=torch.bfloat16, shape=(1, 16, 1024, d),
                                  is_contiguous=lambda: True)
        return fwd_ws.fwd_ws_supported(t, t, t) if which == "fwd" else onepass_ws.ws_supported(t, t, t, t, True)

    assert ask(64) is None
    if which == "fwd":
        assert ask(128) is None and ask(80) == "written for head dim 64 or 128"
    else:
        assert ask(128) == "written for head dim 64"


def test_the_committed_table_is_what_the_committed_tuning_rows_choose():
    # Every plan the chapters quote comes from fast/tuned_configs.py, which `flash-tune write-table`
    # generates from results/attention/flash_tune: a hand edit or a forgotten regeneration would make
    # the table and its measurements disagree.
    from cs336_systems.attention.fast.tuned_configs import TUNED
    from cs336_systems.attention.fast.tuning import tune

    path = REPO_ROOT / "results" / "attention" / "flash_tune" / "nvidia-h200.jsonl"
    assert tune.choose([json.loads(line) for line in path.read_text().splitlines() if line.strip()]) == TUNED


def test_the_fsdp_adapters_table_names_what_each_adapter_returns():
    # fsdp.md, the table under "The 2026 adapters": each adapter exists with the listed parameters,
    # and its body calls the class or function in the "ours" column
    page = (REPO_ROOT / "docs" / "fsdp.md").read_text()
    section = page.split("### The 2026 adapters")[1].split("###")[0]
    rows = re.findall(r"^\| `(\w+)\(([^)]*)\)` \| [^|]+ \| `([\w.]+)` \|$", section, re.MULTILINE)
    assert len(rows) == 5
    for name, params, ours in rows:
        fn = getattr(adapters, name)
        assert list(inspect.signature(fn).parameters) == [p.split("=")[0].strip() for p in params.split(",")], name
        assert ours.split(".")[-1] in inspect.getsource(fn), f"{name} does not use {ours}"
