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

from report import gpu_tests
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


GPU_TEST_PATHS = ["cs336_systems/attention", "cs336_systems/model", *gpu_tests.TEST_FILES, "tests/tolerances.py",
                  "tests/adapters.py", "tests/conftest.py", ":(exclude)cs336_systems/attention/fast/tuning",
                  ":(exclude)cs336_systems/attention/fast/experiments", ":(exclude)cs336_systems/attention/benchmarks"]
# flash-attention.md, beside flash.gpu_tests_pass: what changed since the whole set ran (the tuner,
# the A/B experiments and the benchmarks measure; the GPU tests do not run them). A change to any
# other file the tests reach fails here: run the GPU tests again, or list the file here with why
# and say so on the page. Nothing is listed: the newest log ran the code as it is.
CHANGED_SINCE_THE_GPU_TESTS: set[str] = set()


def test_the_attention_code_changed_since_the_gpu_tests_only_where_the_page_says():
    assert ("claim", "flash.gpu_tests_pass") in USES
    whole, newest = (gpu_tests.log_git(log) for log in (gpu_tests.NEWEST_RUNS[0], gpu_tests.NEWEST_RUNS[-1]))
    changed = set(_git("diff", "--name-only", whole, "--", *GPU_TEST_PATHS).stdout.split())
    assert changed <= CHANGED_SINCE_THE_GPU_TESTS
    # and the listed files have not changed since the newest log ran their tests
    assert not _git("diff", "--name-only", newest, "--", *GPU_TEST_PATHS).stdout.split()


def test_every_collected_gpu_test_is_in_the_log():
    # beside flash.gpu_tests_pass: the newest log ran every test the GPU files collect
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:randomly",
                          *gpu_tests.TEST_FILES], capture_output=True, text=True, cwd=REPO_ROOT, check=True)
    collected = {line for line in out.stdout.splitlines() if "::" in line}
    o = gpu_tests.outcomes()
    assert set(o.test[o.outcome != "UNFINISHED"]) == collected


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


def test_the_two_gpu_script_runs_the_fsdp_benchmark_on_the_2026_xl():
    # fsdp.md, "Which xl": "the two-GPU runs' script, `scripts/two_gpu_runs.sh`, runs the benchmark
    # on `2.7B`" (both its FSDP lines: the two-GPU one and the shared-GPU one)
    lines = [line for line in (REPO_ROOT / "scripts" / "two_gpu_runs.sh").read_text().splitlines()
             if re.match(r"run_\w+\(\) \{ .*bench fsdp ", line)]
    assert len(lines) == 2 and all("--size 2.7B" in line for line in lines)
