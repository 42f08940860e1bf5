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
# flash-attention.md, beside flash.gpu_tests_pass: "Since that run the code those tests reach changed
# only on the CPU side of the speed path: ..." (the tuner, the A/B experiments and the benchmarks
# measure; the GPU tests do not run them). A change to any other file the tests reach fails here until the GPU tests run again.
CHANGED_SINCE_THE_GPU_TESTS = {
    "cs336_systems/attention/fast/op.py", "cs336_systems/model/attention.py",  # the custom operator
    "cs336_systems/attention/fast/launch.py", "cs336_systems/attention/fast/__init__.py",  # copies, warning
    "cs336_systems/attention/fast/gluon/requirements.py", "cs336_systems/attention/fast/gluon/fwd_ws.py",
    "cs336_systems/attention/fast/gluon/onepass_ws.py", "cs336_systems/attention/fast/gluon/bwd128_ws.py",
    "cs336_systems/model/config.py", "cs336_systems/model/transformer.py",  # 10B, sub-block checkpoints
    "tests/conftest.py",  # the chapter markers
    # the float64 reference masks with -inf instead of adding -1e6: for the tests' inputs the same
    # values (exp(-1e6 + O(10)) is exactly 0 in float64, as exp(-inf) is)
    "cs336_systems/attention/reference.py",
    # the host path (issue 30): the fast path's Triton launches go to the compiled launchers directly,
    # device facts and the interpreter's patch asked once, the eager input checks' verdict remembered;
    # tested on the CPU with the launches recorded
    "cs336_systems/attention/fast/function.py", "cs336_systems/attention/fast/triton_launch.py", "cs336_systems/attention/fast/direct_launch.py",
    "cs336_systems/attention/device_facts.py", "cs336_systems/attention/flash_launch.py",
    "cs336_systems/attention/triton_loader.py", "cs336_systems/attention/__init__.py",
    "tests/test_direct_launch.py", "tests/test_flash_precision.py",  # new CPU cases; their GPU tests unchanged
}


def test_the_attention_code_changed_since_the_gpu_tests_only_where_the_page_says():
    assert ("claim", "flash.gpu_tests_pass") in USES
    changed = set(_git("diff", "--name-only", gpu_tests.log_git(gpu_tests.NEWEST_RUNS[-1]), "--",
                       *GPU_TEST_PATHS).stdout.split())
    assert changed <= CHANGED_SINCE_THE_GPU_TESTS


def test_every_collected_gpu_test_is_in_the_log_or_cut_on_the_teaching_path():
    # beside flash.gpu_tests_pass: what the newest log lacks is cases of the two teaching-path test
    # functions its time limit cut, each of which the previous full run passed (or skipped)
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:randomly",
                          *gpu_tests.TEST_FILES], capture_output=True, text=True, cwd=REPO_ROOT, check=True)
    collected = {line for line in out.stdout.splitlines() if "::" in line}
    o = gpu_tests.outcomes()
    done = set(o.test[o.outcome != "UNFINISHED"])
    missing = collected - done
    assert done <= collected and {t.split("[")[0] for t in missing} <= gpu_tests.TEACHING_PATH_CUT
    before = gpu_tests.outcomes((gpu_tests.PREVIOUS_FULL_RUN,)).set_index("test").outcome
    assert all(before.get(t) in ("PASSED", "SKIPPED") for t in missing)
    # and those cases' kernels and test file did not change between the two runs
    teaching = ["cs336_systems/attention/flash_fwd_kernel.py", "cs336_systems/attention/flash_bwd_kernel.py",
                "cs336_systems/attention/flash_launch.py", "cs336_systems/attention/tile_io.py",
                "cs336_systems/attention/tiles.py", "cs336_systems/attention/flash_triton.py",
                "cs336_systems/attention/fast/flash_bwd_onepass_kernel.py", "tests/test_flash_attention.py"]
    runs = [gpu_tests.log_git(log) for log in (gpu_tests.PREVIOUS_FULL_RUN, gpu_tests.NEWEST_RUNS[-1])]
    assert _git("diff", "--name-only", *runs, "--", *teaching).stdout.split() == []


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
