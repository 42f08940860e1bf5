"""Head dim 128 at the 8B step's attention (1 x 32 x 32,768, causal): what each change to the Gluon
kernels bought, every version beside cuDNN in its own run (results/attention/d128_probe and
ab_bwd128, `just bench flash-d128-probe` and `flash-ab-bwd128`)."""

from __future__ import annotations

import functools
import importlib

import pandas as pd

from .flash import where
from .registry import register
from .results import load_results, markdown_table, provenance_line, with_source
from .units import span

PROBE, AB = "attention/d128_probe", "attention/ab_bwd128"
STEP = {"batch": 1, "heads": 32, "seq": 32768, "causal": True}
CELL = ["batch", "heads", "seq", "causal"]
# the A/B runs of the register operands against the shared-memory ones (causal, not causal)
REGS_CAUSAL, REGS_FULL = "20261201T224133", "20261201T224247"

# (what changed, bench, run, our forward's impl, our backward's impl): the versions in the order
# they were made; None where the row's kernel is the previous row's (not timed again)
VERSIONS = (
    ("the table's Triton kernels", PROBE, "20261201T155333", "table", "table"),
    ("Gluon forward: 2 consumer warpgroups, 128-key tiles, 3 stages", PROBE, "20261201T155333",
     "gluon_ws nw2 bn128 st3", None),
    ("Gluon backward for d = 128 (loader warp, two math warpgroups)", PROBE, "20261201T160342", None,
     "gluon_bwd128 st2 sl1"),
    ("the same backward, timed again beside its ablations", AB, "20261201T160722", None, "full st2 sl1"),
    ("the same backward without dQ's adds (ablation: dQ wrong)", AB, "20261201T160722", None, "no_reduce st2 sl1"),
    ("the same backward without dQ at all (ablation: dQ wrong)", AB, "20261201T160722", None, "no_dq st2 sl1"),
    ("the programs of one head run together (both kernels)", PROBE, "20261201T161804",
     "gluon_ws nw2 bn128 st3 g1", "gluon_bwd128 st2 sl1 g1"),
    ("P^T and dS^T as register operands of dV's and dK's products", AB, REGS_CAUSAL, None, "dv_rs+dk_rs st2 sl1"),
    ("the same with three Q/dO stages, which now fit", AB, "20261201T224225", None, "dv_rs+dk_rs st3 sl1"),
    ("causal: dQ's product under dK's (the kernel since)", AB, "20261202T011412", None, "dq_first st3 sl1 g0"),
)
FIRST_BWD, AGAIN, NO_ADDS, NO_DQ, GROUPED, REGS, REGS_ST3, DQ_UNDER_DK = (v[0] for v in VERSIONS[2:10])

# dQ under dK ("dq_first") against the kernel before ("full") at nine shapes, one run each, at the head
# groups of the code that ran (group 0: by the L2 budget alone) and at those the launcher picks now
ORDER_GIT = "9dbb70626573"
ORDER_SETTINGS = {True: (3, 1), False: (2, 2)}  # the table's (stages, slots) per mask


def _x(value: float) -> str:
    """A speed ratio as the tables write it; "—" where it was not timed."""
    return "—" if pd.isna(value) else f"{value:.2f}x"


@functools.cache
def _ab() -> pd.DataFrame:
    """The A/B rows that ran, read once (the results do not change during a build)."""
    return load_results(AB, status="ok")


def _rows(bench: str, run: str) -> pd.DataFrame:
    return where(load_results(bench, status="ok"), run=run, **STEP)


def _median(bench: str, run: str, impl: str, part: str) -> float:
    """Median ms of one implementation's `part` ("fwd", "bwd", "fwd+bwd") in one run."""
    df = _rows(bench, run)
    if bench == PROBE:
        hit = where(df, impl=impl, **{"pass": part})
    elif impl.startswith("cudnn"):
        hit = where(df, impl="cudnn fwd" if part == "fwd" else "cudnn fwd+bwd")
    else:  # "VERSION stS slL [gG]": a version of the Gluon backward (heads per group G; 0: the launcher's rule)
        version, stages, slots, *group = impl.split()
        hit = where(df, impl="gluon bwd128", version=version, stages=int(stages[2:]), slots=int(slots[2:]),
                    **({"group": int(group[0][1:])} if group else {}))
    if hit.empty:
        raise ValueError(f"{bench}: no {impl} {part} rows in run {run}")
    return float(hit.ms.median())


def versions() -> pd.DataFrame:
    """Per version (index: what changed): our forward and backward ms and each against cuDNN's, same run."""
    out = []
    for what, bench, run, fwd, bwd in VERSIONS:
        c_fwd = _median(bench, run, "cudnn", "fwd")
        c_bwd = _median(bench, run, "cudnn", "fwd+bwd") - c_fwd
        f = _median(bench, run, fwd, "fwd") if fwd else float("nan")
        b = _median(bench, run, bwd, "bwd") if bwd else float("nan")
        out.append({"change": what, "forward ms": f, "forward vs cuDNN": c_fwd / f, "backward ms": b,
                    "backward vs cuDNN": c_bwd / b})
    return pd.DataFrame(out).set_index("change")


def versions_table() -> str:
    used = pd.concat([_rows(bench, run) for _, bench, run, _, _ in VERSIONS])
    return (markdown_table(versions().reset_index(), formats={"forward ms": ".1f", "backward ms": ".1f",
                                                              "forward vs cuDNN": _x, "backward vs cuDNN": _x})
            + "\n\n" + provenance_line(used, "results/attention/d128_probe, ab_bwd128")
            + " *Medians of three interleaved rounds; cuDNN timed in the same run as each version (its backward:"
            " forward+backward less forward). — : that kernel was not timed again in that run.*")


def _step(name: str, col: str = "backward ms") -> float:
    return versions().loc[name, col]


def vs_kernel(version: str, ids, settings: tuple | str | None = "table", at: tuple | str = "table",
              kernel: str = "full") -> pd.Series:
    """Per cell (batch, heads, seq, causal) of the A/B runs `ids` (run ids or commits): the kernel's
    ms at `at` over `version`'s at `settings` ((stages, slots); "table": the table's for the cell's
    mask; "same": the version's; None: the version's fastest timed). Version "cuDNN": its backward,
    forward+backward less forward. Above 1: the version is faster; cells without it are left out."""
    ids = [ids] if isinstance(ids, str) else list(ids)
    if version == "rotated":  # the rotation's commit calls the rotated kernel "full" and the kernel's order "unrotated"
        version, kernel = "full", "unrotated"
    out = {}
    for cell, rows in _ab()[_ab().git.isin(ids) | _ab().run.isin(ids)].groupby(CELL):
        ms = where(rows, impl="gluon bwd128").groupby(["version", "stages", "slots"]).ms.median()
        table = ORDER_SETTINGS[bool(cell[3])]
        mine = table if settings == "table" else settings
        if version == "cuDNN":
            theirs = _cudnn_bwd_ms(rows)
        elif settings is None:
            theirs = ms[version].min()
        elif (version, *mine) in ms.index:
            theirs = ms[(version, *mine)]
        else:
            continue
        out[cell] = ms[(kernel, *(table if at == "table" else mine if at == "same" else at))] / theirs
    return pd.Series(out, dtype=float).rename_axis(CELL)


def _cudnn_bwd_ms(rows: pd.DataFrame) -> float:
    """cuDNN's backward in these rows (one cell of a run): its forward+backward less its forward."""
    return float(where(rows, impl="cudnn fwd+bwd").ms.median() - where(rows, impl="cudnn fwd").ms.median())


def _masked(s: pd.Series, causal: bool) -> pd.Series:
    return s[s.index.get_level_values("causal") == causal]


def _columns(s: pd.Series, by: str = "mask") -> dict:
    """One row of an A/B table: its ratios by mask or by cell ("1 x 32 x 8,192"), each a range ("—": none)."""
    if by == "mask":
        parts = {"causal": _masked(s, True), "not causal": _masked(s, False)}
    else:
        parts = {f"{b} x {h} x {n:,}": s.loc[[(b, h, n, c)]] for b, h, n, c in s.index}
    return {name: span(part, ".2f", "x") if len(part) else "—" for name, part in parts.items()}


# The A/B tables (`just bench flash-ab-bwd128 --versions ...`), each version beside the kernel in the
# same run, one run a cell: name -> (the kernel's settings as vs_kernel's `at` takes them, columns by
# "mask" or "cell", the note, the rows: (version, its settings as vs_kernel takes them, runs or
# commits, what it changes))
DQ_RUNS, DQ_FIRST_RUNS = ("20261201T204017", "20261201T204111"), ("20261201T204724", "20261201T204812")
FULL_RUNS = ("20261202T033105", "20261202T033148")  # 1 x 32 x 8,192 and 32,768 without the mask
AB_TABLES = {
    # after grouping: reorders and splits of dQ's chain, against the kernel of the time
    "d128_dq_attempts": ("same", "mask", "That kernel's time over each version's, both in one run at 1 x 32 x"
                         " 32,768 x 128 (stages 2, dS^T slots 1; above 1.00x the version is faster).", (
        ("red2", (2, 1), DQ_RUNS, "two dQ staging buffers per warpgroup"),
        ("dq_next", (2, 1), DQ_RUNS, "tile i's dQ product in flight behind tile i + 1's S^T"),
        ("dq_next+red2", (2, 1), DQ_RUNS, "both"),
        ("dq_first", (2, 1), DQ_FIRST_RUNS, "dQ's product before dK's, its adds behind dK's"),
        ("dq_first+red2", (2, 1), DQ_FIRST_RUNS[:1], "that, with two staging buffers"),
        ("dq_own", (2, 1), DQ_FIRST_RUNS, "each warpgroup adds its own keys' share of dQ (twice the adds)"))),
    # P^T and dS^T from registers, against the shared-memory kernel at the same settings
    "d128_register_operands": ("same", "mask", "The shared-memory version's time over each version's, both in one"
                               " run at 1 x 32 x 32,768 x 128 at the version's Q/dO stages,dS^T slots.", tuple(
        (v, (2, sl), (REGS_CAUSAL, REGS_FULL), what) for v, what in (
            ("dv_rs", "P^T from registers, as dV's left operand"), ("dk_rs", "dS^T from registers, as dK's left operand"),
            ("dv_rs+dk_rs", "both (the kernel since)")) for sl in (1, 2))),
    # the non-causal backward at the two cells furthest behind
    "d128_non_causal_versions": ("table", "cell", "The kernel's time at two Q/dO stages and two dS^T slots over each"
                                 " version's at its stages,slots, both in one run per cell (not causal; above 1.00x"
                                 " the version is faster).", (
        ("full", (2, 2), FULL_RUNS, "the kernel, at the table's two dS^T slots"),
        ("full", (2, 1), FULL_RUNS, "the kernel, one slot"),
        ("no_reduce", (2, 2), FULL_RUNS, "ablation: no dQ adds (dQ wrong)"),
        ("red2", (2, 2), FULL_RUNS, "two dQ staging buffers a warpgroup: a tile's adds drain behind the next"),
        ("delta_early", (2, 2), FULL_RUNS, "Delta loaded beside L, behind S^T's product"),
        ("stats_first", (2, 2), FULL_RUNS, "L and Delta loaded before the wait for Q and dO"),
        ("dq_under_dk", (2, 2), FULL_RUNS, "dQ's product between dV's and dK's, its adds under dK's (the causal order)"),
        ("cuDNN", (2, 2), FULL_RUNS, "its backward (forward+backward less forward)"))),
    # everything else, each in the runs of one commit
    "d128_tried": ("table", "mask", "The kernel's time at the table's settings over each version's (above 1.00x the"
                   " version is faster), both in one run per cell, at the version's stages,slots where named, else"
                   " at the table's (`k_rs`, `v_rs`, `rotated`, `no_store`) or its fastest; a range spans the cells"
                   " timed.", (
        ("k_rs", "table", "968fba65dc4b", "K_W held in registers, the left operand of every S^T product"),
        ("v_rs", "table", "968fba65dc4b", "V_W held in registers, the left operand of every dP^T product"),
        ("full", (2, 3), "5e654f81865b", "a third dS^T slot (two Q/dO stages)"),
        ("full", (2, 1), "4bf534ee2832", "two Q/dO stages, which spill less"),
        ("stats_first", (2, 1), "4bf534ee2832", "L and Delta loaded before the wait for Q and dO, two stages: fewest spills"),
        ("stats_first", (3, 1), "4bf534ee2832", "the same at three stages, spilling as much as the kernel"),
        ("rotated", "table", "95f54a5f34eb", "each program starts at its own share of the query tiles, wrapping around"),
        ("atomics", None, "0deea3d95d21", "dQ added from registers by vector atomics: no staging, many more L2 requests"),
        ("solo", None, "a014d9b69103", "one warpgroup of 64 keys a program, two programs an SM"),
        ("no_bulk", None, "73d8519606f3", "ablation: the staging without the bulk reduction (dQ wrong)"),
        ("no_staging", None, "73d8519606f3", "ablation: the bulk reduction without the staging (dQ wrong)"),
        ("no_store", "table", "4fc7478d3b1e", "ablation: the staging without its store, fence and barriers kept (dQ wrong)"),
        ("add_next", None, "73d8519606f3", "each tile's add issued in the next tile, under its first two products"),
        ("dk_split", None, "1fcca49f1c9f", "dK's product in two column halves, the add under the second"))),
}


def ab(table: str, version: str, settings: tuple | str | None = "table") -> pd.Series:
    """vs_kernel for the row of an A/B table with this version and settings."""
    at, _, _, rows = AB_TABLES[table]
    return vs_kernel(version, next(r[2] for r in rows if r[:2] == (version, settings)), settings, at)


def ab_table(table: str) -> str:
    at, by, note, rows = AB_TABLES[table]
    named = len({r[1] for r in rows}) > 1  # name a row's settings where they differ between rows
    shown = [{"version": v if v == "cuDNN" else f"`{v}`" + (f" {s[0]},{s[1]}" if named and isinstance(s, tuple) else ""),
              "what it changes": what, **_columns(vs_kernel(v, ids, s, at), by)} for v, s, ids, what in rows]
    ids = {i for *_, r, _ in rows for i in ([r] if isinstance(r, str) else r)}
    dash = " — : not run." if any(v == "—" for row in shown for v in row.values()) else ""
    return with_source(pd.DataFrame(shown), AB, _ab()[_ab().git.isin(ids) | _ab().run.isin(ids)],
                       note=f"{note} Medians of three interleaved rounds.{dash}")


def tried(version: str, settings: tuple | str | None = "table") -> pd.Series:
    return ab("d128_tried", version, settings)


def _non_causal_adds_cost() -> bool:
    """Without dQ's adds over 10% faster at both cells and ahead of cuDNN's backward, which is
    ahead of the kernel at both, and no candidate faster than the kernel by over 2% (noise)."""
    t = {r[:2]: ab("d128_non_causal_versions", *r[:2]) for r in AB_TABLES["d128_non_causal_versions"][3]}
    adds, cudnn = t.pop(("no_reduce", (2, 2))), t.pop(("cuDNN", (2, 2)))
    return bool(adds.min() > max(1.1, cudnn.max()) and cudnn.min() > 1.0 and max(s.max() for s in t.values()) < 1.02)


def order_and_groups() -> pd.DataFrame:
    """Per shape of the sweep: the backward's ms before, with dQ under dK, at the groups the launcher
    picks now (NaN where not timed), and cuDNN's backward."""
    import torch

    from cs336_systems.attention.fast.gluon.bwd128_ws import heads_per_group, reread_bytes_per_head

    out = []
    # causal first, then by seq and heads
    cells = sorted(where(_ab(), git=ORDER_GIT).groupby(CELL), key=lambda c: (not c[0][3], c[0][2], c[0][1]))
    for (b, h, n, causal), cell in cells:
        st, sl = ORDER_SETTINGS[bool(causal)]
        ms = lambda version, group: where(cell, impl="gluon bwd128", version=version, stages=st, slots=sl,  # noqa: E731
                                          group=group).ms.median()
        group = heads_per_group(b * h, reread_bytes_per_head(n, 128, torch.bfloat16))
        out.append({"cell": f"{b} x {h} x {n:,}", "mask": "causal" if causal else "none",
                    "before": ms("full", 0), "dQ under dK": ms("dq_first", 0), "heads per group": group,
                    "now": ms("dq_first" if causal else "full", group), "cuDNN": _cudnn_bwd_ms(cell)})
    return pd.DataFrame(out)


def order_and_groups_table() -> str:
    ms = {c: "#.3g" for c in ("before", "dQ under dK", "now", "cuDNN")}
    return with_source(order_and_groups(), AB, where(_ab(), git=ORDER_GIT), formats=ms,
                       note="The d = 128 backward's ms at the table's settings (causal: three Q/dO stages, one dS^T"
                       " slot; without the mask two and two), one run per shape, medians of three interleaved rounds;"
                       " before and dQ under dK at the old head groups; now: the kernel since (without the mask the"
                       " old order) at the groups the launcher picks now; cuDNN: its forward+backward less forward."
                       " — : not timed.")


def _order_gains(causal: bool) -> pd.Series:
    t = order_and_groups()
    t = t[t["mask"] == ("causal" if causal else "none")]
    return t["before"] / t["dQ under dK"]


def _over_now(cell: str, column: str = "cuDNN") -> float:
    """At a causal cell of the sweep ("1 x 16 x 4,096"): a column's ms over ours now (cuDNN's: above
    1, ours faster; "dQ under dK" at the old head groups: what the groups now bought)."""
    row = order_and_groups().set_index(["cell", "mask"]).loc[(cell, "causal")]
    return float(row[column] / row["now"])


register("flash", facts={
    "gluon_triton": lambda: importlib.import_module("cs336_systems.attention.fast.gluon.requirements").GLUON_TRITON,
    "d128_dq_share": lambda: f"{1 - _step(NO_DQ) / _step(AGAIN):.0%}",  # what leaving out all of dQ saves
    "d128_order_gain": lambda: span(_order_gains(True), ".2f", "x"),
}, tables={"d128_order_and_groups": order_and_groups_table, "d128_versions": versions_table,
           **{name: functools.partial(ab_table, name) for name in AB_TABLES}}, claims={
    "d128_kv_in_registers_slower": lambda: all(len(t := tried(v)) == 2 and t.max() < 0.9 for v in ("k_rs", "v_rs")),
    # both register operands together beat the shared-memory kernel by over 5% at one slot, causal
    # and not, and by more than either alone; the backward still behind cuDNN's
    "d128_register_operands_helped": lambda: bool(
        (both := ab("d128_register_operands", "dv_rs+dk_rs", (2, 1))).min() > 1.05
        and _masked(both, True).max() > max(ab("d128_register_operands", v, (2, 1)).max() for v in ("dv_rs", "dk_rs"))
        and _step(REGS_ST3, "backward vs cuDNN") < 1.0),
    "d128_non_causal_adds_cost_reorders_do_not": _non_causal_adds_cost,
    "d128_three_slots_slower": lambda: len(t := tried("full", (2, 3))) == 2 and t.max() < 0.97,
    # the versions that spill less (stats_first; two stages) all slower than the kernel beyond noise
    "d128_fewer_spills_not_faster": lambda: all(
        vs_kernel(v, "4bf534ee2832", (st, 1)).iloc[0] < 0.99
        for v in ("full", "stats_first", "dq_after_dk") for st in (2, 3) if (v, st) != ("full", 3)),
    "d128_staging_and_l2_trades_slower": lambda: all(len(t := tried(v, None)) == 4 and t.max() < 0.9
                                                     for v in ("atomics", "solo")),
    # without the mask each half of the add alone costs over 5% (under it leaving either out is
    # slower); moving the add under other products is no faster than noise (2%) at any cell
    "d128_add_halves_cost_moving_them_does_not_help": lambda: bool(
        all(len(_masked(t := tried(v, None), False)) == 2 and _masked(t, False).min() > 1.05
            and _masked(t, True).max() < 1.0 for v in ("no_staging", "no_bulk"))
        and max(tried("add_next", None).max(), tried("dk_split", None).max()) < 1.02
        and len(tried("dk_split", None)) == 4),
    # leaving out only the staging's store buys over 5%, within 2% of leaving out the whole staging
    "d128_staging_cost_is_its_store": lambda: bool(
        len(t := tried("no_store")) == 2 and (t > 1.05).all()
        and ((vs_kernel("no_staging", "4fc7478d3b1e") / t - 1).abs() < 0.02).all()),
    "d128_rotation_no_gain": lambda: bool(len(t := tried("rotated")) == 3 and ((t - 1).abs() < 0.02).all()),
    # none gained causal, none beyond noise (2%) without the mask
    "d128_dq_reorders_did_not_help": lambda: all(
        (_masked(t := ab("d128_dq_attempts", r[0], r[1]), True) <= 1.0).all() and (_masked(t, False) < 1.02).all()
        for r in AB_TABLES["d128_dq_attempts"][3]),
    # dQ under dK: faster at every causal shape, by over 3% at the median, more at 4k and 8k than at
    # 32k; without the mask no faster than noise (1%) anywhere and slower at 32,768
    "d128_dq_under_dk_helps_causal": lambda: bool(
        _order_gains(True).min() > 1.0 and _order_gains(True).median() > 1.03
        and _order_gains(True).iloc[:4].min() > _order_gains(True).iloc[4:].max()
        and _order_gains(False).max() < 1.01 and _order_gains(False).iloc[-1] < 1.0),
    # the dividing groups: no causal cell slower beyond noise (2%), both 8k cells faster by over 5%; with
    # them ours ahead of cuDNN's backward at 1 x 16 x 4,096 and 8,192 causal, behind at the step's cell
    "d128_dividing_groups_help": lambda: bool(
        min(_over_now(c, "dQ under dK") for c in order_and_groups().query("mask == 'causal'").cell) > 0.98
        and min(_over_now("1 x 16 x 8,192", "dQ under dK"), _over_now("1 x 32 x 8,192", "dQ under dK")) > 1.05
        and min(_over_now("1 x 16 x 4,096"), _over_now("1 x 16 x 8,192")) > 1.0 > _over_now("1 x 32 x 32,768")),
    "d128_dq_is_over_a_quarter": lambda: (_step(NO_DQ) < 0.75 * _step(AGAIN)
                                          and _step(AGAIN) > _step(NO_ADDS) > _step(NO_DQ)),
    "d128_grouping_helped_both": lambda: (_step(GROUPED) < 0.95 * _step(FIRST_BWD)
                                          and _step(GROUPED, "forward vs cuDNN") > 1.0 > _step(GROUPED, "backward vs cuDNN")),
})
