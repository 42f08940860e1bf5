"""report/flash_grid.py on made-up rows and a made-up table: how the grid's rows become the ratio
tables, the comparisons the page quotes, and the plan each cell is said to run."""

import pandas as pd
import pytest

from report import flash_grid
from report.figures import svg


def _rows() -> pd.DataFrame:
    """Two cells (d 64, causal, 1 x 16, seq 1,024 and 8,192): ours at 0.5x then 2x cuDNN's speed,
    flash at 0.8x then 0.5x; flex timed at 8,192 only, out of memory there (one failed row)."""
    rows = []
    for seq, ours, flash in ((1024, 0.5, 0.8), (8192, 2.0, 0.5)):
        for impl, speed in (("cudnn", 1.0), ("ours", ours), ("flash", flash)):
            for mode in ("fwd", "fwd_bwd"):
                rows.append({"batch": 1, "heads": 16, "seq": seq, "d": 64, "causal": True, "impl": impl,
                             "mode": mode, "median_ms": 1.0 / speed, "speed_vs_cudnn": speed, "status": "ok"})
    rows.append({"batch": 1, "heads": 16, "seq": 8192, "d": 64, "causal": True, "impl": "flex", "mode": "fwd_bwd",
                 "status": "oom", "error": "OutOfMemoryError: Tried to allocate 2.00 GiB."})
    return pd.DataFrame(rows).assign(device="NVIDIA H200", git="abc", time_utc="2026-12-01T00:00:00Z")


@pytest.fixture
def rows(monkeypatch):
    df = _rows()
    monkeypatch.setattr(flash_grid, "_read", lambda bench: df)
    return df


def test_speed_table_puts_seq_in_columns_and_a_failed_row_in_every_mode_it_left_empty(rows):
    table = flash_grid.speed_table("ours", "fwd_bwd")
    assert "| 64 | causal | 1 x 16 | 0.50 | 2.00 |" in table
    assert "†" not in table  # one run: no cell and no note marked as an earlier run's
    for mode in ("fwd", "fwd_bwd"):  # the sweep writes one failed row, whichever mode failed
        assert "| 64 | causal | 1 x 16 | OOM |" in flash_grid.speed_table("flex", mode)


def test_met_misses_and_comparisons(rows):
    assert list(flash_grid.met("fwd_bwd").index.get_level_values("seq")) == [8192]
    assert flash_grid.beats_from("flash") == 8192  # loses to flash at 1,024, wins from 8,192


def test_the_figure_draws_a_line_per_cell_group(rows):
    assert "<svg" in svg(flash_grid.grid_figure())


def test_plan_label_follows_the_lookup_rule(monkeypatch):
    table = {"fwd": {"bf16-d64-causal-large": {"gluon_ws": True}, "bf16-d128-causal-medium": {}}, "bwd": {}}
    monkeypatch.setattr(flash_grid, "TUNED", table)
    assert flash_grid.plan_label("fwd", 64, True, 16, 8192) == "large, Gluon"
    assert flash_grid.plan_label("fwd", 64, True, 16, 1024) == "large, Gluon"  # medium borrows large
    assert flash_grid.plan_label("fwd", 128, True, 16, 8192) == "medium, Triton"  # large borrows medium; Gluon is d = 64 only
    assert flash_grid.plan_label("fwd", 64, False, 16, 8192) == "heuristic tiles"
    assert flash_grid.plan_label("bwd", 64, True, 16, 8192) == "heuristic tiles"


def test_a_remeasured_cell_counts_by_its_newest_row_and_the_rest_are_marked_earlier(monkeypatch):
    """`flash-grid --remeasure` appends a newer run: each cell counts by its newest row, cells the
    newer run did not reach are the earlier run's (marked †), and each run's speeds stay readable."""
    old = _rows()
    again = old[(old.seq == 8192) & (old.status == "ok")].assign(
        git="def", time_utc="2026-12-02T00:00:00Z",
        speed_vs_cudnn=lambda d: d.speed_vs_cudnn.where(d.impl != "ours", 3.0))
    df = pd.concat([old, again], ignore_index=True)
    monkeypatch.setattr(flash_grid, "_read", lambda bench: df)
    assert flash_grid.newest_git() == "def"
    assert flash_grid.speeds().tolist() == [0.5, 3.0]  # 1,024 from "abc", 8,192 re-measured by "def"
    assert list(flash_grid.earlier_cells()) == [(64, "causal", "1 x 16", 1024)]
    assert flash_grid.run_gits() == ["abc", "def"]
    assert flash_grid.speeds(git="abc").tolist() == [0.5, 2.0]  # the "abc" run's own ratios
    assert flash_grid.speeds(git="def").tolist() == [3.0]
    table = flash_grid.speed_table("ours", "fwd_bwd")
    assert "| 64 | causal | 1 x 16 | 0.50 † | 3.00 |" in table and "earlier run (git abc)" in table
    assert flash_grid.plans().fwd.loc[(64, "causal", "1 x 16", 1024)] == "earlier table †"
