"""Claims of docs/ddp.md and docs/ddp/runs.md, asserted over the committed DDP results.

Each test quotes the sentence it guards. When new results make one fail, rewrite the sentence
(and the test); never make the page choose its own wording. "In every run" / "in one run" claims
are checked per run; the others on the medians over runs that the tables show.
"""

from __future__ import annotations

from report import ddp
from report.ddp_facts import hooked_hidden, one_allreduce_ms, sharding_ddp_step_ms

GPU, CPU = "nvidia-h200", "cpu"


def _at(device, label, column):
    return float(ddp.at(device, label)[column])


# ---- the setting note and the runs page ------------------------------------------------------------

def test_runs_move_more_than_a_step_varies_within_a_run():
    # ddp.md note: "Between runs a configuration's step moved by ... ms in the median ..., more than a
    # step typically varies within a run"; runs.md: "So the run-to-run variation is the larger noise"
    assert ddp.run_move_ms(GPU).median() > ddp.runs(GPU)["step_ms_std"].median()


def test_the_noisiest_and_the_most_moved_configurations():
    # runs.md: "The noisiest configurations within a run were the 10 MB cap in run 2 ... and the
    # per-parameter stage in run 1"
    runs = ddp.runs(GPU).sort_values("step_ms_std", ascending=False)
    assert [(r.label, r.run) for r in runs.head(2).itertuples()] == [("bucketed 10 MB", 2), ("overlap", 1)]
    # "The configuration that moved most between runs was the 1 MB cap"
    assert ddp.run_move_ms(GPU).idxmax() == "bucketed 1 MB"


def test_run_1_cost_more_over_compute_only_everywhere():
    # runs.md: "every data-parallel configuration cost more over its run's compute-only step there
    # than in run 2"
    over = ddp.per_run(GPU, "overhead_ms").drop(columns="compute-only")
    assert (over.loc[1] > over.loc[2]).all(), over


def test_the_sharding_benchmark_lands_between_the_runs():
    # runs.md: "at ... ms per step: ... from run 1's and ... from run 2's" (a cross-check; between
    # the two runs means the other benchmark agrees with this one's noise)
    step = ddp.per_run(GPU, "step_ms")["torch-ddp"]
    assert step.min() <= sharding_ddp_step_ms() <= step.max()


def test_predictions_on_the_runs_page():
    # runs.md 1: "Naive DDP makes one call per tensor, ... for xl. It held."
    assert _at(GPU, "naive", "allreduce_calls") == len(ddp.xl_tensor_bytes())
    # 3: "the best cap was the 100 MB one in run 1 ... and the 1000 MB one in run 2"
    step = ddp.per_run(GPU, "step_ms")
    caps = [c for c in step.columns if c.startswith("bucketed")]
    assert step.loc[1, caps].idxmin() == "bucketed 100 MB" and step.loc[2, caps].idxmin() == "bucketed 1000 MB"
    # "comes within a few percent of PyTorch's DDP. It held" (a few: under 3%)
    assert ddp.best_cap_vs_torch(GPU).abs().max() < 0.03


# ---- naive_ddp_benchmarking ------------------------------------------------------------------------

def test_on_nvlink_the_step_is_mostly_computation():
    # answer: "On NVLink the step is mostly computation." (naive's sync under a fifth of its step)
    assert _at(GPU, "naive", "sync_ms") / _at(GPU, "naive", "step_ms") < 0.2


def test_xls_average_tensor_sits_at_the_knee_and_the_two_terms_are_equal():
    # "the average call sits at the knee, and the two terms of t_naive ... are about equal"
    model = ddp.fitted_bucket_model(GPU)
    average = model.s / _at(GPU, "naive", "allreduce_calls")
    assert 0.8 < average / (model.o * model.w) < 1.25
    fixed, transfer = ddp.naive_terms_ms(GPU)
    assert 2 / 3 < fixed / transfer < 3 / 2


def test_norm_gains_are_the_smallest_tensors_and_carry_almost_nothing():
    # "Its ... smallest tensors, the norm gains, are ... of the calls and carry almost none of the bytes"
    sizes = ddp.xl_tensor_sizes()
    assert "norm" in sizes["example"].iloc[0] or "ln" in sizes["example"].iloc[0]
    assert sizes["share"].iloc[0] < 0.001


def test_cpu_share_is_far_larger_than_on_the_gpus():
    # CPU: "..., a far larger share than on the GPUs" (far: at least twice)
    cpu = _at(CPU, "naive", "sync_ms") / _at(CPU, "naive", "step_ms")
    gpu = _at(GPU, "naive", "sync_ms") / _at(GPU, "naive", "step_ms")
    assert cpu > 2 * gpu


# ---- minimal_ddp_flat_benchmarking -----------------------------------------------------------------

def test_flat_did_not_beat_naive_clearly():
    # answer: "did not beat naive clearly: flat was slower in one run and faster in the other"
    step = ddp.per_run(GPU, "step_ms")
    ahead = (step["naive"] - step["flat"]).tolist()  # > 0: flat faster
    assert len(ahead) == 2 and min(ahead) < 0 < max(ahead)
    assert not ddp.clearly_faster(GPU, "flat", "naive").any()


def test_what_flattening_saves_is_about_what_it_adds():
    # answer: "the fixed costs that flattening saves (about ... ms) are about as large as the copies
    # it adds (about ... ms)"
    saved, added = ddp.flat_saved_added_ms(GPU, one_allreduce_ms())
    assert 2 / 3 < saved / added < 3 / 2
    # "naive's ... calls cost less than as many isolated calls ... µs per call, where the fit's o is"
    per_call_s = saved / 1e3 / _at(GPU, "naive", "allreduce_calls")
    assert per_call_s < ddp.fitted_bucket_model(GPU).o


def test_cpu_flat_and_naive_cannot_be_told_apart():
    # CPU: "The difference is smaller than either step's standard deviation"
    gap = abs(_at(CPU, "flat", "step_ms") - _at(CPU, "naive", "step_ms"))
    assert gap < min(_at(CPU, "flat", "step_ms_std"), _at(CPU, "naive", "step_ms_std"))
    # "Over loopback the transfer is the bigger term (the crossover o w is below this model's
    # average tensor)"
    fixed, transfer = ddp.naive_terms_ms(CPU)
    model = ddp.fitted_bucket_model(CPU)
    assert fixed < transfer
    assert model.o * model.w < model.s / _at(CPU, "naive", "allreduce_calls")


# ---- ddp_overlap_individual_parameters_benchmarking ------------------------------------------------

def test_hooks_hide_the_wait_but_the_step_is_clearly_faster_in_one_run_only():
    # (a): "Its wait in finish_gradient_synchronization falls to ... ms (naive ...)" -- in every run
    sync = ddp.per_run(GPU, "sync_ms")
    assert (sync["overlap"] < sync[["naive", "flat"]].min(axis=1)).all()
    # "yet its step was clearly faster than naive's in one run only"
    clear = ddp.clearly_faster(GPU, "overlap", "naive")
    assert clear.sum() == 1


def test_the_time_moved_into_backward():
    # (a): "outside finish, the overlapped step costs ... ms more than compute-only, where naive and
    # flat cost nothing" (nothing: within 3 ms, the typical standard deviation of a step) -- every run
    outside = ddp.per_run(GPU, "outside_ms")
    assert (outside[["naive", "flat"]].abs() < 3).all().all()
    assert (outside["overlap"] > 10).all()


def test_the_trace_shows_overlap_happening_and_not():
    # (b): "for naive and flat ... 0% ... In the overlapped stage they run underneath backward"
    hidden = ddp.hidden(GPU)
    assert hidden["naive"] == 0 and hidden["flat"] == 0
    assert hooked_hidden(GPU).min() > 0.5  # "hide from ... to ... of their communication": most


def test_cpu_overlap_waits_less_and_leads_but_its_comm_alone_is_longer():
    # CPU: "The overlapped stage waited ... ms in finish, against ... (naive) and ... (flat), and its
    # step is shorter than both by more than one step's standard deviation"
    assert _at(CPU, "overlap", "sync_ms") < min(_at(CPU, "naive", "sync_ms"), _at(CPU, "flat", "sync_ms"))
    lead = min(_at(CPU, "naive", "step_ms"), _at(CPU, "flat", "step_ms")) - _at(CPU, "overlap", "step_ms")
    assert lead > _at(CPU, "overlap", "step_ms_std")
    # "Timed alone, though, its communication (...) took longer than naive's"
    assert _at(CPU, "overlap", "comm_alone_ms") > _at(CPU, "naive", "comm_alone_ms")
    # "naive's fixed costs together come to about ... ms, about a third of its communication alone"
    fixed, _ = ddp.naive_terms_ms(CPU)
    assert 0.25 < fixed / _at(CPU, "naive", "comm_alone_ms") < 0.45


def test_cpu_per_parameter_stage_hides_less_than_1_mb_buckets_and_about_as_much_as_10_mb():
    # CPU: "The per-parameter stage hides less (...) than the 1 MB buckets (...) and about as much as
    # the 10 MB ones" (about: within 10 points)
    h = ddp.hidden(CPU)
    assert h["overlap"] < h["bucketed 1 MB"]
    assert abs(h["overlap"] - h["bucketed 10 MB"]) < 0.10


# ---- ddp_bucketed_benchmarking ---------------------------------------------------------------------

def test_the_bucket_curve_is_flat_from_10_mb_up():
    # (a): "From 10 MB up the curve is flat: its spread, ... ms, is less than any of those caps
    # moved between runs"
    b = ddp.bucketed(GPU)
    big = b[b["bucket_size_mb"] >= 10]
    spread = big["step_ms"].max() - big["step_ms"].min()
    moved = ddp.run_move_ms(GPU)[big["label"]]
    assert spread < moved.min()


def test_the_1_mb_cap_was_slowest_in_one_run_only():
    # (a): "The 1 MB cap, one bucket per tensor, was the slowest in one run only."
    step = ddp.per_run(GPU, "step_ms")
    caps = [c for c in step.columns if c.startswith("bucketed")]
    assert (step[caps].idxmax(axis=1) == "bucketed 1 MB").sum() == 1
    # runs.md 4: "The 1 MB cap looked like an outlier in run 1 alone"
    assert step.loc[1, caps].idxmax() == "bucketed 1 MB"
    assert _at(GPU, "bucketed 1 MB", "allreduce_calls") == _at(GPU, "naive", "allreduce_calls")


def test_a_floor_no_bucket_size_removes():
    # (a): "every data-parallel configuration pays a floor over compute-only that no bucket size
    # removes"; "overlapping saved at most ... ms of naive's ... ms of overhead in either run"
    saved = ddp.overlap_saved_ms(GPU)
    naive = ddp.per_run(GPU, "overhead_ms")["naive"]
    assert (saved < naive / 2).all()
    # "The bucketed stage leaves only ... ms in finish; the other ... ms of its overhead are spent
    # during backward" (the larger part)
    b = ddp.bucketed(GPU)
    assert (b["outside_ms"] > b["sync_ms"]).all()


def test_the_model_underestimates_and_does_not_fall_like_the_measurement():
    # (b): "The measured overheads are ... times the model's" (all above it)
    df = ddp.model_vs_measured(GPU)
    assert (df["measured_ms"] > df["model_ms"]).all()
    # "From 10 MB up the measured overheads barely fall, where the model's fall several-fold"
    big = df[df["cap_mb"] >= 10]
    assert big["measured_ms"].iloc[-1] >= 0.8 * big["measured_ms"].iloc[0]
    assert big["model_ms"].iloc[0] > 3 * big["model_ms"].iloc[-1]
    # "What does fall with the bucket size ... is the time left in finish"
    assert list(df["sync_ms"]) == sorted(df["sync_ms"], reverse=True)


def test_cpu_step_grows_with_the_cap_by_about_one_steps_noise():
    # CPU: "The step time grows with the cap, from 1 MB to 1000 MB, but the fastest and the slowest cap
    # differ by only ... ms, about the typical standard deviation of one step" (about: within 1.5x)
    b = ddp.bucketed(CPU).sort_values("bucket_size_mb")
    assert b["step_ms"].is_monotonic_increasing
    noise = b["step_ms_std"].median()
    assert b["step_ms"].max() - b["step_ms"].min() < 1.5 * noise
    # "our best cap differs from PyTorch's DDP ... by less than that noise"
    assert abs(b["step_ms"].min() - _at(CPU, "torch-ddp", "step_ms")) < noise
    # "the 100 and 1000 MB caps both make one bucket"
    assert set(b[b["bucket_size_mb"] >= 100]["allreduce_calls"]) == {1}


def test_cpu_model_lies_below_and_ranks_the_caps_differently():
    # CPU: "The measured overheads lie above the model"; "the model puts 10 MB first, the measurement
    # 1 MB, and the measured overhead grows with the cap"
    df = ddp.model_vs_measured(CPU)
    assert (df["measured_ms"] > df["model_ms"]).all()
    caps = ddp.bucketed(CPU).sort_values("bucket_size_mb")["bucket_size_mb"].tolist()
    assert caps[df["model_ms"].idxmin()] == 10 and caps[df["measured_ms"].idxmin()] == 1
    assert df["measured_ms"].is_monotonic_increasing
