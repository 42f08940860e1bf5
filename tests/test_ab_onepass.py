"""The one-pass kernel's ablations (ab_onepass): the source edits do what their names say."""

from __future__ import annotations

import pytest
import torch

from cs336_systems.attention.fast.experiments import ab_onepass
from cs336_systems.attention.fast.launch import launch_bwd_onepass
from cs336_systems.attention.flash_launch import launch_fwd, launch_preprocess
from cs336_systems.attention.reference import attention_reference
from cs336_systems.attention.tiles import BwdConfig
from tests.triton_mode import DEVICE, ON_GPU, pytestmark  # noqa: F401


def test_edits_find_their_lines():
    source = ab_onepass.KERNEL_FILE.read_text()
    for name in ab_onepass.VARIANTS:
        edited = ab_onepass.variant_source(name, source)
        compile(edited, name, "exec")  # still Python
        assert (edited == source) == (name == "full")
    with pytest.raises(ValueError, match="copies of"):
        ab_onepass.variant_source("no_add", source.replace(ab_onepass.DQ_LINE, ""))
    with pytest.raises(ValueError, match="unknown variant"):
        ab_onepass.variant_source("sideways", source)


@pytest.mark.skipif(ON_GPU, reason="the interpreter's run of the ablations; on the GPU `ab_onepass` itself checks them")
def test_ablations_on_the_interpreter(tmp_path):
    """full and dp_first give every gradient; no_add and no_dq still give dK, dV, and leave dQ zero."""
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(1, 2, 40, 16, generator=g).to(DEVICE) for _ in range(4))
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    o64, _ = attention_reference(q64, k64, v64, True)
    o64.backward(do.double())
    o, L = launch_fwd(q, k, v, True)
    delta = launch_preprocess(o, do)
    c = BwdConfig(16, 16, 16, 16, 1, 1, 1, 1)  # the one-pass kernel reads the *1 tiles
    for name, mod in ab_onepass.load_variants(list(ab_onepass.VARIANTS), tmp_path).items():
        dq, dk, dv = launch_bwd_onepass(q, k, v, do, L, delta, True, c, kernel=mod.bwd_onepass_kernel)
        # fp32 (interpreter) vs float64, elementwise: chains of ~d + 2 n_k + 30 ~ 130 roundings over
        # magnitudes of a few units, so the all-same-sign worst case is ~1e-4 and the measured error
        # <= 1.1e-6; a variant that drops a term is off by O(1).
        torch.testing.assert_close(dk.double(), k64.grad, rtol=1e-4, atol=1e-4, msg=f"{name}: dK")
        torch.testing.assert_close(dv.double(), v64.grad, rtol=1e-4, atol=1e-4, msg=f"{name}: dV")
        if name in ("full", "dp_first"):
            torch.testing.assert_close(dq.double(), q64.grad, rtol=1e-4, atol=1e-4, msg=f"{name}: dQ")
        else:
            assert not dq.any(), f"{name}: dQ should never be added"


@pytest.mark.skipif(ON_GPU, reason="the interpreter's variant of the flow; on a GPU the harness itself is run")
def test_main_times_each_version_per_round(tmp_path, monkeypatch):
    import json

    from cs336_systems.attention.fast.tuning import problem

    monkeypatch.setattr(problem, "DEVICE", "cpu")
    monkeypatch.setattr(ab_onepass, "DTYPE", torch.float32)
    monkeypatch.setattr("cs336_systems.bench.timing.gpu_bench", lambda fn, **kw: 1.0)
    assert ab_onepass.main(["--configs", "16,16,1,1", "--Z", "1", "--seq", "32", "--d", "16", "--rounds", "2",
                            "--results-dir", str(tmp_path)]) == 0
    rows = [json.loads(line) for line in next(tmp_path.rglob("*.jsonl")).read_text().splitlines()]
    cells = {(r["variant"], r["tma"]) for r in rows}
    assert cells == {(v, t) for v in ab_onepass.VARIANTS for t in (False, True)}
    assert len(rows) == 2 * len(cells) and {r["round"] for r in rows} == {0, 1}
    # rel_err: normwise against float64 (tests/test_flash_attention.py's tolerance() for why ~1e-6)
    assert all(r["status"] == "ok" and r["rel_err"] < 1e-4 and r["dtype"] == "fp32" for r in rows)


@pytest.mark.parametrize("bad", [["64,64"], ["64,64,4,x"], ["64,64,4,3", "1"]])
def test_bad_configs_name_the_argument(bad, capsys):
    with pytest.raises(SystemExit):
        ab_onepass.main(["--configs", *bad])
    assert "--configs: expected M,N,WARPS,STAGES" in capsys.readouterr().err
