"""Claims of docs/attention.md and docs/attention/runs.md over the committed results."""

from __future__ import annotations

import pytest

from report import attention as at
from report import attention_oom as oom
from report.attention import GRID_SEQS

# ---- pytorch_attention ------------------------------------------------------------------------------

def test_time_is_quadratic_from_4096_and_flat_below():
    # "from seq 4096 on, forward+backward time grows ... per doubling" / "From 4096 on the time is
    # quadratic (4x per doubling would be exactly quadratic)" / "Up to seq 1024 every forward takes
    # ... ms whatever its size: launch overhead, not work"
    g = at.growth_per_doubling()
    assert g.between(3.0, 4.5).all()
    small = at.attention_rows().query("seq <= 1024").forward_ms
    assert small.max() < 2 * small.min()


def test_head_dimension_matters_much_less_than_its_work():
    # "going from d = 16 to d = 128 multiplies the matmuls' work by 8 but the time by ..."
    e = at.attention_rows().query("seq == 16384").set_index("d")
    total = e.forward_ms + e.backward_ms
    assert total[128] / total[16] < 4


def test_grid_fits_and_the_first_probe_runs_out_of_memory():
    # "Nothing in the course's grid runs out of memory on the H200 ...; at d = 64 seq ... runs ... and
    # the first size that runs out of memory is seq ..."
    every = at.newest(at.load_results(at.BENCH), at.KEY)
    grid = every[every.seq.isin(GRID_SEQS)]
    assert (grid.status == "ok").all()
    probes = at.oom_probes()
    assert (probes.status == "OOM").all()
    assert at.largest_run().seq == max(GRID_SEQS) < probes.seq.min()


def test_memory_matches_the_hand_count():
    # "what the forward leaves allocated ... is the output O plus ... P ..., exactly as counted. The
    # peak ... is four score-sized matrices at once, as counted, plus ... MiB that does not depend
    # on d or the sequence"
    c = at.memory_check()
    assert (c["forward added: measured MiB"] == c["by hand (O + P) MiB"]).all()
    offset = c["peak: measured MiB"] - c["peak by hand MiB"]
    assert offset.nunique() == 1 and 0 < offset.iloc[0] < 256


def test_saved_memory_is_mostly_p_and_quadratic():
    # "the forward of seq ... leaves ... GiB, almost all of it P" and "grows as the square of the sequence"
    c = at.memory_check().set_index(["d", "seq"])
    big = c.loc[(64, 16384)]
    assert big["forward added: measured MiB"] < 1.01 * big["score matrix MiB"] + 64  # P plus O (64 MiB)
    for d in (16, 32, 64, 128):
        assert c.loc[(d, 16384), "score matrix MiB"] == 4 * c.loc[(d, 8192), "score matrix MiB"]


def test_hand_count_fits_at_32768_yet_it_ran_out_of_memory():
    # "At seq 32,768 the hand count stays under the card's capacity, yet the run ran out of memory."
    first = at.oom_probes().iloc[0]
    assert first["backward peak by hand GiB"] < first["card GiB"]
    assert first["status"] == "OOM"


# ---- attention/runs.md: the allocator checks ----------------------------------------------------------

def test_allocator_checks_confirm_the_stranded_block():
    # chapter: "The caching allocator, not the algorithm, set that boundary"; runs.md: "Both
    # predictions hold ... the default allocator fails ... while it holds ... reserved but
    # unallocated: the stranded block. With large blocks unsplittable, seq 32,768 runs"
    assert oom.stranded_block_confirmed()
    a = oom.check(32768, oom.DEFAULT)
    assert a["status"] == "oom"
    assert a.reserved_unallocated_mib == pytest.approx(oom.score_mib(32768), rel=0.02)
    split = oom.check(16384, oom.SPLIT)
    assert oom._peaks(split)[1] / oom.score_mib(16384) < 4.5  # "the reserve falls"


# ---- torch_compile -------------------------------------------------------------------------------------

def test_compiling_attention_pays_from_4096_and_halves_the_peak():
    # (a): "From seq 4096 on, `torch.compile` speeds the forward up ... and the backward ..., and cuts
    # the peak memory to ... of eager's" / "Below seq 4096 ... compiling does not pay" / "The memory
    # before the backward is the same as eager's"
    m = at.compiled_vs_eager()
    long, short = m[m.seq >= 4096], m[m.seq < 4096]
    assert (long.fwd_speedup > 1).all() and (long.bwd_speedup > 1).all()
    assert long.peak_ratio.between(0.4, 0.6).all()
    assert (short.fwd_speedup < 1).sum() + (short.bwd_speedup < 1).sum() > len(short)  # most are slower
    assert (long.mem_before_backward_mib_c == long.mem_before_backward_mib_e).all()


def test_compiling_the_model_gains_less_the_larger_it_is():
    # (b): "The gain shrinks with size, from ... of the small model's forward to ... of the 2.7B
    # model's" and "The two fall together with size" and "Where the cut exceeds the eager share
    # outside the matmuls (the small model)"
    c = at.compile_cells()
    for mode in ("forward", "train"):
        assert c[c["mode"] == mode].cut.is_monotonic_decreasing, mode
    assert (c.cut > 0).all()
    v = at.compile_vs_profile().set_index("size")
    assert v["eager forward outside matmuls"].is_monotonic_decreasing
    exceeds = v[v["compile removes (forward)"] > v["eager forward outside matmuls"]].index
    assert list(exceeds) == ["small"]


def test_a_second_compile_on_one_machine_is_warm():
    # runs.md: "the second time ... the first step took a fraction of the cold compile while the
    # steady step did not change"
    t = at.compiled_twice()
    assert len(t) > 0
    assert (t["first compiled step, again s"] < 0.5 * t["first compiled step, first run s"]).all()
    ratio = t["steady step, again ms"] / t["steady step, first run ms"]
    assert ratio.between(0.95, 1.05).all()
