"""Claims of docs/mixed-precision.md and docs/mixed-precision/bf16-timings.md over the committed results."""

from __future__ import annotations

import pytest
import torch

from report import bf16_timings as bt
from report import mixed_precision as mp
from report.profiling import SIZES

# ---- mixed_precision_accumulation -------------------------------------------------------------------

def test_fp32_is_nearly_exact_and_fp16_is_not():
    # mixed-precision.md: "The fp32 loop gives ..., nearly exact; the fp16 loop gives ..."
    acc = mp.accumulation()
    for device in ("cuda", "cpu"):
        fp32, fp16 = acc.loc[(device, "fp32 += fp32"), "error"], acc.loc[(device, "fp16 += fp16"), "error"]
        assert abs(fp32) < 1e-3 < abs(fp16)


def test_mixed_loops_err_only_by_the_rounded_addend():
    # "Both mixed loops ... give ...: 0.01 rounded once to fp16 is ..., a thousand of those are ...,
    # and the fp32 accumulation adds no error of its own." and "CPU and GPU give bit-identical results"
    acc = mp.accumulation()
    rounded = mp.N_ADDS * float(torch.tensor(mp.ADDEND, dtype=torch.float16))
    for device in ("cuda", "cpu"):
        a, b = acc.loc[(device, "fp32 += fp16"), "value"], acc.loc[(device, "fp32 += fp16.type(fp32)"), "value"]
        assert a == b
        # exact: the fp16 addend has 11 significant bits and its lowest set bit is 2^-17; every
        # partial sum below 16 is a multiple of 2^-17 under 2^4, i.e. at most 21 bits: fp32 (24) holds it
        assert a == rounded
    assert (acc.xs("cuda").value == acc.xs("cpu").value).all()



def test_fp16_rounds_up_to_three_ulps_then_down_to_one():
    # "In [4, 8) ... each add rounds up to 3 ulps ... In [8, 16) ... each of the ... adds there rounds
    # *down* to one ulp"; "the loop never leaves [8, 16)" is implied by the table's last row
    b = mp.binades()
    assert b.loc["[4, 8)", "added_per_add"] / b.loc["[4, 8)", "ulp"] == pytest.approx(3, abs=0.01)
    assert b.loc["[8, 16)", "added_per_add"] == b.loc["[8, 16)", "ulp"]
    assert b.index[-1] == "[8, 16)"


def test_fp32_error_is_the_sum_of_its_systematic_roundings():
    # "the per-binade roundings add up to ..., the whole of the fp32 loop's error"
    err = mp.accumulation().loc[("cuda", "fp32 += fp32"), "error"]
    assert mp.fp32_systematic_error() == pytest.approx(err, rel=1e-6)


# ---- benchmarking_mixed_precision -------------------------------------------------------------------

def test_autocast_dtypes_as_the_answer_and_the_prose_say():
    # (a) and its prose: parameters, loss and gradients fp32; linear outputs in the low type;
    # layer norm fp32 on the GPU. (b): "autocast on the CPU keeps it in the low-precision type"
    for low, name in (("fp16", "float16"), ("bf16", "bfloat16")):
        gpu, cpu = mp.autocast_dtypes("cuda", low), mp.autocast_dtypes("cpu", low)
        for t in ("parameters (inside autocast)", "loss", "gradients"):
            assert gpu[t] == cpu[t] == "float32"
        assert gpu["fc1 output"] == gpu["logits"] == name
        assert gpu["layer-norm output"] == "float32"
        assert cpu["layer-norm output"] == name


def test_bf16_speedup_grows_with_size_in_every_mode():
    # (c): "The speed-up grows with model size in every mode: from ...x for the small training step
    # (no gain ...) to ...x for the 2.7B forward"
    s = mp.speedups()
    for mode in mp.MODES:
        assert s[mode].is_monotonic_increasing, mode
    assert s.loc["small", "train"] < 1.05
    assert s.loc["2.7B"].min() > 2


def test_bf16_is_noisier_than_fp32():
    # (c): "The bf16 times are noisier than the fp32 ones"
    cv = mp.spread()
    assert cv.xs("bf16", level="dtype").max() > cv.xs("fp32", level="dtype").max()


# ---- mixed-precision/bf16-timings.md ----------------------------------------------------------------

def test_remeasured_cells_moved_while_the_clock_held():
    # "the means moved by ...", "the SM clock read ... against its ... maximum. Down-clocking does not
    # explain the spread." and the chapter: "The bf16 cells of the large, xl and 2.7B models were
    # measured twice"
    r = bt.remeasured_rows()
    assert set(r["size"]) == {"large", "xl", "2.7B"} and set(r["dtype"]) == {"bf16"}
    assert r.change.abs().max() > 0.2
    assert r.sm_min.min() >= 0.95 * r.sm_top.max()


def test_first_runs_break_the_large_forward_ordering():
    # "with the first run of each re-measured cell instead of the newest, the large forward's speed-up
    # would not rise over the medium one's"
    s = bt.first_run_speedups()["forward"]
    assert s["large"] <= s["medium"]


def test_fp32_cells_reproduce_across_sweeps():
    # "The large, xl and 2.7B cells agree within ...; only the launch-bound small model moves more"
    f = bt.fp32_repeats()
    big = f[f["size"].isin(["large", "xl", "2.7B"])].difference.abs().max()
    assert big < 0.02
    assert f[f["size"] == "small"].difference.abs().max() > big
    assert set(f["size"]) == set(SIZES)


def test_launching_an_fp32_forward_takes_about_as_long_as_the_bf16_forward():
    # "just launching the kernels of an fp32 forward at context 512 takes about as long as the bf16
    # forwards measured": same order of magnitude (within 3x either way)
    e = bt.launch_estimate()
    for col in ("bf16 forward, first run ms", "bf16 forward, re-run ms"):
        ratio = e[col] / e["launch time ms (estimate)"]
        assert ratio.between(1 / 3, 3).all(), col
