"""Claims of docs/collectives.md, asserted over the committed all-reduce results.

Each test quotes the sentence it guards. When new results make one fail, rewrite the sentence
(and the test); never make the page choose its own wording.
"""

from __future__ import annotations

from report import collectives as c

GPU, CPU = "nvidia-h200", "cpu"
PROBE, GB = c.PROBE_MB, c.GB_MB


def _t(device, kind, n, mb, column="time_ms"):
    return float(c.cell(device, kind, n, mb)[column])


def test_gloo_is_slower_because_it_goes_through_the_host():
    # answer: "gloo on the same GPUs takes ... ms, ... times longer"
    assert _t(GPU, "gloo+cuda", 2, GB) > 10 * _t(GPU, "nccl+cuda", 2, GB)


def test_nccl_knee_is_far_right_of_gloos():
    # answer: "below the knee o w (about ... MB for NCCL, ... MB for gloo)";
    # Backend: "its knee sits far to the right of gloo's" (far: ten times or more)
    assert c.knee_mb(GPU, "nccl+cuda") > 10 * c.knee_mb(GPU, "gloo+cuda")
    # "NCCL's fixed cost per call is ... times smaller ... and its bandwidth ... times larger"
    (o_n, w_n), (o_g, w_g) = c.fit(GPU, "nccl+cuda", 2), c.fit(GPU, "gloo+cuda", 2)
    assert o_n < o_g and w_n > w_g


def test_more_processes_hurt_small_messages():
    # answer: "More processes hurt small messages most ... a 4 KB call takes ... ms on 2 ranks and
    # ... ms on 6"; CPU section: "With 4 and 6 ranks on 2 cores the 4 KB call takes ... and ... ms"
    t = [_t(CPU, "gloo+cpu", n, PROBE) for n in (2, 4, 6)]
    assert t[0] < t[1] < t[2]


def test_nccl_small_calls_cost_only_their_fixed_cost():
    # Size: "NCCL's 4 KB all-reduce takes ... and its 1 MB all-reduce ..., the same within their
    # standard deviations"
    gap = abs(_t(GPU, "nccl+cuda", 2, 1) - _t(GPU, "nccl+cuda", 2, PROBE))
    assert gap < _t(GPU, "nccl+cuda", 2, 1, "time_ms_std") + _t(GPU, "nccl+cuda", 2, PROBE, "time_ms_std")


def test_nccl_bandwidth_still_climbs_to_100_mb():
    # Size: "NCCL's bus bandwidth climbs from ... at 1 MB to ... at 10 MB and ... at 100 MB, so up to
    # 100 MB it still partly pays for fixed costs"
    bw = [_t(GPU, "nccl+cuda", 2, mb, "busbw_gbps") for mb in (1, 10, 100, GB)]
    assert bw == sorted(bw)


def test_gloo_cuda_and_cpu_tensors_take_the_same_time_at_1_gb_but_not_at_1_mb():
    # Backend: "At 1 GB it takes the same time on CUDA and on CPU tensors" (same: within 10%)
    assert abs(_t(GPU, "gloo+cuda", 2, GB) / _t(GPU, "gloo+cpu", 2, GB) - 1) < 0.1
    # "At 1 MB they do show, ... ms on CUDA tensors against ... ms on CPU tensors"
    assert _t(GPU, "gloo+cuda", 2, 1) > _t(GPU, "gloo+cpu", 2, 1)


def test_the_6_rank_1_gb_cell_ran():
    # CPU: "The 1 GB x 6 cell ran"
    assert _t(CPU, "gloo+cpu", 6, GB) > 0  # cell() raises unless the row is ok


def test_cpu_knee_is_below_1_mb_and_growth_is_less_than_linear():
    # CPU: "The fit puts the knee at ... MB"; "Just past the knee, at 1 MB, the bus bandwidth (...) is
    # still below what 1 GB reaches (...)"
    assert c.knee_mb(CPU, "gloo+cpu") < 1
    assert _t(CPU, "gloo+cpu", 2, 1, "busbw_gbps") < _t(CPU, "gloo+cpu", 2, GB, "busbw_gbps")
    # "from 1 MB to 1 GB the time grows ...x for 1024x the bytes: less than linear"
    assert _t(CPU, "gloo+cpu", 2, GB) / _t(CPU, "gloo+cpu", 2, 1) < 1024


def test_more_ranks_lower_the_cpu_bus_bandwidth_and_6_ahead_of_4_is_scheduling():
    # CPU: "At 1 GB the bus bandwidth falls from ... on 2 ranks to ... on 4 and ... on 6"
    bw = {n: _t(CPU, "gloo+cpu", n, GB, "busbw_gbps") for n in (2, 4, 6)}
    assert bw[2] > bw[4] and bw[2] > bw[6]
    # "In this run 6 ranks came out ahead of 4, the two 1 GB times ... differing by a little more
    # than their standard deviations added" (a little: less than twice)
    assert bw[6] > bw[4]
    gap = _t(CPU, "gloo+cpu", 4, GB) - _t(CPU, "gloo+cpu", 6, GB)
    stds = _t(CPU, "gloo+cpu", 4, GB, "time_ms_std") + _t(CPU, "gloo+cpu", 6, GB, "time_ms_std")
    assert stds < gap < 2 * stds


def test_only_two_gpus_were_measured():
    # note: "the GPU rows cover 2 ranks"
    rows = c.all_reduce_rows(GPU)
    assert set(rows[rows["status"] == "ok"]["world_size"]) == {2}
