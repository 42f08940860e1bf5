"""`just bench ceilings`: the code path on a CPU (tiny sizes), its arithmetic, and its bad arguments."""

from __future__ import annotations

import pytest

from cs336_systems.bench import ceilings
from cs336_systems.bench.store import ResultStore


def test_small_run_writes_one_row_per_cell(tmp_path):
    assert ceilings.main(["--size", "small", "--device", "cpu", "--results-dir", str(tmp_path)]) == 0
    rows = ResultStore(ceilings.BENCH, ceilings.KEY, device="cpu", root=tmp_path).rows()
    assert [(r["op"], r["dtype"]) for r in rows] == [(c["op"], c["dtype"]) for c in ceilings.cells("small")]
    assert all(r["status"] == "ok" for r in rows)
    for r in rows:  # the derived rate is the counted work over the measured time
        work = 2 * r["n"] ** 3 / 1e12 if r["op"] == "matmul" else r["bytes_moved"] / 1e12
        assert (r.get("tflops") or r.get("tb_per_s")) == pytest.approx(work / (r["ms"] * 1e-3))


def test_copy_counts_bytes_read_and_written():
    row = ceilings.measure_copy(1 << 16, ceilings.torch.device("cpu"))
    assert row["bytes_moved"] == 2 * (1 << 16)


@pytest.mark.parametrize("argv, flag", [(["--size", "huge"], "--size"),
                                        (["--device", "cpu", "--size", "full"], "--size full")])
def test_bad_arguments_exit_2_naming_the_flag(argv, flag, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        ceilings.main(argv + ["--results-dir", str(tmp_path)])
    assert exc.value.code == 2
    assert flag in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # nothing written
