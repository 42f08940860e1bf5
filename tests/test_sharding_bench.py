"""The sharding benchmark end to end on a tiny model (2 gloo ranks), and its argument checks."""

from __future__ import annotations

import pytest

from cs336_systems.bench.store import ResultStore
from cs336_systems.sharding import sharding_bench as sb


@pytest.mark.distributed
def test_bench_writes_memory_and_time_rows(tmp_path):
    argv = ["--methods", "sharded", "zero1", "--size", "tiny", "--context", "16", "--steps", "1",
            "--warmup", "0", "--results-dir", str(tmp_path)]
    assert sb.main(argv) == 0
    times = ResultStore(sb.TIME_BENCH, sb.CELL_KEY, device="cpu", root=tmp_path).rows()
    memory = ResultStore(sb.MEMORY_BENCH, sb.CELL_KEY + ["point"], device="cpu", root=tmp_path).rows()
    assert {r["method"] for r in times} == {"sharded", "zero1"}
    assert all(r["status"] == "ok" and r["step_ms"] > 0 for r in times)
    n_params = times[0]["n_params"]
    by = {(r["method"], r["point"]): r for r in memory}
    assert len(by) == 6
    for method in ("sharded", "zero1"):
        assert by[method, "after_init"]["state_bytes"] == 0
        assert by[method, "before_step"]["grads_bytes"] == 4 * n_params
        assert by[method, "before_step"]["activations_bytes"] > 0
        # AdamW's m and v for about half of the parameters on each of the 2 ranks
        state = by[method, "after_step"]["state_bytes"]
        assert 0.4 * 8 * n_params < state < 0.6 * 8 * n_params, (method, state, n_params)
    comm = ResultStore(sb.COMM_BENCH, sb.COMM_KEY, device="cpu", root=tmp_path).rows()
    assert {r["op"] for r in comm} == {"all_reduce", "reduce_scatter", "all_gather",
                                       "broadcast_per_parameter"}
    assert all(r["ms"] > 0 and r["bytes"] == 4 * n_params for r in comm)
    # the same run resumed finds every cell done and measures nothing
    assert sb.main([*argv, "--resume"]) == 0
    assert len(ResultStore(sb.TIME_BENCH, sb.CELL_KEY, device="cpu", root=tmp_path).rows()) == 2
    assert len(ResultStore(sb.COMM_BENCH, sb.COMM_KEY, device="cpu", root=tmp_path).rows()) == 4


@pytest.mark.parametrize("argv, match", [
    (["--size", "huge"], "--size"),
    (["--backend", "nccl"], "nccl"),
    (["--world-size", "1"], "--world-size"),
    (["--steps", "0"], "--steps"),
])
def test_bad_arguments_exit_2_naming_the_argument(argv, match, capsys):
    with pytest.raises(SystemExit) as info:
        sb.main(argv)
    assert info.value.code == 2
    assert match in capsys.readouterr().err
