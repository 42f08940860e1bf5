"""The A/B harness for dK/dV kernel versions, on the interpreter (fp32, tiny shapes)."""

import json
from pathlib import Path

import pytest
import torch

from cs336_systems.attention.fast.experiments import ab_dkdv
from cs336_systems.attention.fast.experiments.harness import load_variant
from cs336_systems.attention.fast.tuning import problem
from tests.triton_mode import ON_GPU, pytestmark  # noqa: F401

on_the_cpu_only = pytest.mark.skipif(ON_GPU, reason="the CPU interpreter's variant of the flow; on a GPU "
                                     "the harness itself is run (just bench flash-ab-dkdv)")

KERNEL = Path(__file__).parents[1] / "cs336_systems" / "attention" / "flash_bwd_kernel.py"


@pytest.fixture
def on_the_interpreter(monkeypatch):
    monkeypatch.setattr(problem, "DEVICE", "cpu")
    monkeypatch.setattr(ab_dkdv, "DTYPE", torch.float32)
    monkeypatch.setattr("cs336_systems.bench.timing.gpu_bench", lambda fn, **kw: 1.0)


@on_the_cpu_only
def test_times_each_version_and_variant_per_round(tmp_path, on_the_interpreter):
    assert ab_dkdv.main(["--variant", f"a={KERNEL}", "--variant", f"b={KERNEL}", "--configs", "16,16,1,1",
                         "--Z", "1", "--seq", "32", "--d", "16", "--rounds", "2", "--results-dir", str(tmp_path)]) == 0
    rows = [json.loads(line) for line in next(tmp_path.rglob("*.jsonl")).read_text().splitlines()]
    cells = {(r["variant"], r["tma"], r["no_tail"]) for r in rows}
    kernel = load_variant("probe", KERNEL, ab_dkdv.VARIANT_PACKAGE).bwd_dkdv_kernel
    per_version = (2 if "TMA" in kernel.arg_names else 1) * (2 if "NO_TAIL" in kernel.arg_names else 1)
    assert len(cells) == 2 * per_version and len(rows) == 2 * len(cells)
    # rel_err: normwise against float64 (fp32, interpreter): ~sqrt(N) u ~ 1e-6 expected, the worst
    # case gamma_N ~ 2e-5 (tests/test_flash_attention.py's tolerance()); a wrong kernel is O(1)
    assert all(r["status"] == "ok" and r["rel_err"] < 1e-4 for r in rows)


@on_the_cpu_only
def test_a_wrong_version_is_not_timed(tmp_path, on_the_interpreter):
    broken = tmp_path / "broken.py"  # dV scaled by 2: a fast wrong kernel must stop the run
    broken.write_text(KERNEL.read_text().replace("store_rows(DV + out, dv,", "store_rows(DV + out, dv * 2,"))
    assert "dv * 2" in broken.read_text()
    with pytest.raises(SystemExit, match="wrong"):
        ab_dkdv.main(["--variant", f"bad={broken}", "--configs", "16,16,1,1", "--Z", "1", "--seq", "32",
                      "--d", "16", "--results-dir", str(tmp_path)])


@pytest.mark.parametrize("argv,message", [(["--variant", "no-equals-sign"], "--variant: expected NAME=PATH"),
                                          (["--variant", "x=/nonexistent.py"], "--variant x: no file")])
def test_bad_arguments_name_the_argument(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        ab_dkdv.main(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_host_overhead_refuses_bad_arguments():
    from cs336_systems.attention.benchmarks import host_overhead

    with pytest.raises(SystemExit):
        host_overhead.main(["--calls", "0"])
