"""Claims of docs/profiling.md and docs/profiling/double-count.md, asserted over the committed results.

Each test quotes the sentence it guards. When new results make one fail, rewrite the sentence
(and the test); never make the page choose its own wording.
"""

from __future__ import annotations

from report import profiling as p
from report import profiling_attribution as a
from report import profiling_kernels as k

# ---- benchmarking_script ----------------------------------------------------------------------------

def test_steps_are_steady_after_warmup():
    # profiling.md (b): "The variability is small: no forward+backward step has a standard deviation
    # above ... of its mean." Small: under 5% (a spread that would not hide a 10% effect).
    assert p.e2e_ratios().fb_cv.max() < 0.05


def test_backward_costs_about_twice_the_forward():
    # profiling.md (b): "the backward about twice as long" / "The backward costs about twice the forward"
    r = p.e2e_ratios().bwd_over_fwd
    assert r.between(1.5, 2.5).all(), r


def test_small_model_does_not_keep_the_gpu_busy():
    # profiling.md (b): "The 2.7B step takes ...x the small one for ...x the parameters: the small
    # model does not keep the GPU busy ..., which is also why its MFU is the lowest."
    r = p.e2e_ratios()
    assert r.fb_ms["2.7B"] / r.fb_ms["small"] < r.params["2.7B"] / r.params["small"]
    assert r.mfu.idxmin() == "small"


def test_first_step_is_slow_and_one_warmup_step_removes_it():
    # profiling.md (c): "Without warm-up the first step is slow ... Here one warm-up step removes all
    # of it: with 1 or 2 warm-up steps the means agree to within ..."
    w = p.warmup_rows()
    assert (w.first_over_steady > 1.2).all()
    assert (w.w0_std > 10 * w.w1_std).all()  # no warm-up: the first step dominates the spread
    assert w.w1_vs_w2.max() < 0.02
    # "(a separate 5-warm-up process is off by up to ... for the launch-bound small model)" and
    # "agrees ... for the medium to 2.7B models, while the launch-bound small model moves"
    assert w[w["size"] == "small"].w5_vs_w1.max() > w[w["size"] != "small"].w5_vs_w1.max()


def test_first_step_extra_is_roughly_constant_so_small_suffers_most():
    # profiling.md (c): "That extra is roughly constant across sizes, so it hurts the small model most."
    w = p.warmup_rows()
    for mode, g in w.groupby("mode"):
        assert g.extra_ms.max() < 3 * g.extra_ms.min(), mode
        assert g.set_index("size").first_over_steady.idxmax() == "small", mode


# ---- nsys_profile -----------------------------------------------------------------------------------

def test_every_profiled_cell_ran_and_fits_its_wall_time():
    # profiling.md: "none ran out of memory" and "every cell on this page was profiled again with the fix"
    cells = p.newest(p.load_results("profiling/kernel_cells"), ["size", "context"])
    assert (cells["status"] == "ok").all()
    assert len(a.rerun_cells()) == len(k.kernel_cells())
    assert not any(k.overcounted(r) for _, r in k.kernel_cells().iterrows())


def test_profiler_and_timer_agree_only_where_the_gpu_is_busy():
    # profiling.md (a): "Where the GPU has enough work they agree to a few percent ... For small
    # cells they do not ... In the launch-bound cells the profiled range is longer still"
    big, small = k._cell("2.7B", 512), k._cell("small", 128)
    assert abs(big.fwd_kernel_ms / big.fwd_python_ms - 1) < 0.05
    assert small.fwd_kernel_ms < 0.5 * small.fwd_python_ms
    assert small.fwd_range_ms > small.fwd_python_ms


def test_top_kernel_is_an_fp32_gemm_with_the_same_launches_per_layer():
    # profiling.md (b): "In every size the forward's top kernel is cuBLAS's fp32 SIMT GEMM
    # (`sm80_xmma_gemm_f32f32…`), launched the same number of times in every layer (..., the rest
    # being the output projection)"
    t = k.top_kernels(512)
    assert t.fwd_top.str.startswith("sm80_xmma_gemm_f32f32").all()
    assert set(t.rest) <= {0, 1}


def test_top_of_forward_plus_backward_is_a_matmul_but_not_always_the_forwards():
    # profiling.md (b): "With the backward added the top kernel is a matmul too, but not always the
    # same one: for {sizes} a backward GEMM variant has more time"
    t = k.top_kernels(512)
    assert t.both_top.map(k.is_matmul).all()
    assert 0 < (~t.both_is_fwd_top).sum() < len(t)


def test_matmul_share_falls_with_the_optimizer_and_less_at_long_context():
    # profiling.md (d): "It falls: matmuls take ... of the forward's kernel time (inference) but ...
    # of a full training step" and "at context 1024 only from ..., because the optimizer's cost
    # does not depend on the context"
    c = k.kernel_cells()
    assert (c.step_matmul_share < c.fwd_matmul_share).all()
    for size, g in c.groupby("size"):
        g = g.set_index("context")
        drop = g.fb_matmul_share - g.step_matmul_share
        assert drop[1024] < drop[128], size
        assert g.opt_kernel_ms.max() < 1.05 * g.opt_kernel_ms.min(), size


def test_adamw_launches_a_whole_number_of_kernels_per_tensor():
    # profiling.md (d): "Our hand-written AdamW launches {n} kernels per parameter tensor"
    launches = k._cell("small", 512).opt_launches
    assert launches % p.parameter_tensors("small") == 0


def test_softmax_costs_far_more_per_flop_than_the_matmuls():
    # profiling.md (e): "per FLOP, softmax is ... times more expensive. It is memory-bound"
    r = k.attention_region_rows()
    assert (r.per_flop > 10).all()
    assert (r.flop_ratio < 0.05).all()


# ---- profiling/double-count.md ----------------------------------------------------------------------

def test_first_run_overcounted_and_the_rerun_fits():
    # double-count.md: "In our first H200 run it did ... The same cells, profiled again with the fix,
    # fit inside their ranges"
    m = a.marked_rows()
    assert len(m) > 0
    assert (m["first: kernels / range"] > 1).all()
    assert (m["re-run: kernels ms"] <= m["re-run: range ms"]).all()


def test_rerun_double_count_came_from_colliding_ids():
    # double-count.md: "No trace held an op listed twice or a device event listed twice; all of them
    # held colliding ids ... The old sum exceeds the unique count in {n} cells, ... and those are the
    # cells with the most collisions" and "every re-profiled cell lists exactly one forward SiLU
    # launch per layer and one optimizer `addcdiv` launch per parameter tensor."
    c = a.rerun_checks()
    assert c["check passed"].all()
    assert (c["CPU events listed twice"] == 0).all() and (c["device events listed twice"] == 0).all()
    assert (c["colliding CPU ids"] > 0).all()
    hit = a.inflated()
    assert len(hit) > 0
    assert hit["colliding CPU ids"].min() > c.drop(hit.index)["colliding CPU ids"].max()
    assert (c["SiLU launches / layers"] == 1).all() and (c["addcdiv launches / tensors"] == 1).all()
    assert len(a.silu_surplus()) > 0  # "The first run's rows seemed to point at the first kind"
