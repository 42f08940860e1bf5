"""report/flash_ab.py on made-up inputs: clock samples matched to the leaderboard rows they cover,
the A/B and ablation tables, the probe's cells."""

import pandas as pd
import pytest

from report import flash_ab as diagnostics

HEADER = "timestamp, clocks.current.sm [MHz], clocks.current.memory [MHz], power.draw [W], temperature.gpu\n"


def _csv(samples):
    return HEADER + "".join(f"2026/11/29 17:00:{s:06.3f}, {mhz} MHz, 3201 MHz, {w} W, 50\n" for s, mhz, w in samples)


def test_each_row_gets_the_samples_of_its_own_window(tmp_path, monkeypatch):
    clocks = tmp_path / "results" / "attention" / "clocks"
    clocks.mkdir(parents=True)
    # 0-10 s: busy at 1900 MHz; 10-20 s: busy at 1700 MHz; idle samples (low power) in between are ignored
    samples = [(s + 0.5, 1900, 690) for s in range(10)] + [(10.2, 345, 80)] + [(s + 0.5, 1700, 695) for s in range(10, 20)] + [(21.0, 345, 80)]
    (clocks / "nvidia-h200-20261129T170000Z.csv").write_text(_csv(samples))
    rows = pd.DataFrame([
        {"run": "r", "impl": "cudnn", "mode": "fwd", "mean_ms": 1.0, "time_utc": "2026-11-29T17:00:10Z"},
        {"run": "r", "impl": "ours", "mode": "fwd", "mean_ms": 1.1, "time_utc": "2026-11-29T17:00:20Z"},
        {"run": "elsewhen", "impl": "ours", "mode": "fwd", "mean_ms": 9.9, "time_utc": "2026-11-30T00:00:00Z"},
    ])
    monkeypatch.setattr(diagnostics, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(diagnostics, "leaderboard_rows", lambda: rows)
    got = diagnostics.leaderboard_clock_rows().set_index("implementation")
    assert list(got.index) == ["SDPA cuDNN", "ours"]  # the row outside the samples is left out
    assert got.loc["SDPA cuDNN", "SM MHz (median, busy)"] == 1900
    assert got.loc["ours", "SM MHz (median, busy)"] == 1700
    assert got.loc["ours", "samples"] == 10  # the idle sample is not counted


def test_ab_median_names_a_missing_cell(monkeypatch):
    monkeypatch.setattr(diagnostics, "ab_rows", lambda: pd.DataFrame(
        [{"variant": "a", "block_m1": 64, "block_n1": 64, "num_warps1": 4, "num_stages1": 3, "tma": True,
          "no_tail": True, "median_ms": 2.0}]))
    assert diagnostics.ab_median("a", True, True) == 2.0
    with pytest.raises(KeyError, match="no A/B row"):
        diagnostics.ab_median("a", False, True)


def test_onepass_ablation_steps_are_differences_of_the_chain(monkeypatch):
    """'step ms' is each version's median minus the previous version's in the chain
    no_dq -> no_add -> full, per tiling and loads; dp_first stands aside."""
    def rows(tma, base):
        return [{"run": "r", "variant": v, "block_m1": 64, "block_n1": 64, "num_warps1": 4, "num_stages1": 3,
                 "tma": tma, "median_ms": base + dt, "min_ms": 0.0, "max_ms": 0.0, "rounds": 3}
                for v, dt in (("full", 1.5), ("no_dq", 0.0), ("dp_first", 1.7), ("no_add", 0.5))]
    monkeypatch.setattr(diagnostics, "onepass_ab_rows", lambda: pd.DataFrame(rows(True, 2.0) + rows(False, 3.0)))
    monkeypatch.setattr(diagnostics, "load_results", lambda *a, **k: pd.DataFrame())
    lines = [line for line in diagnostics.onepass_ab_table().splitlines() if line.startswith("| 64x64")]
    steps = [line.split("|")[5].strip() for line in lines]
    assert steps == ["", "+0.500", "+1.000", ""] * 2
    assert "TMA" in lines[0] and "pointers" in lines[4]  # TMA rows first


def test_probe_keeps_the_newest_row_and_names_a_missing_cell(monkeypatch):
    def row(mode, ms):
        return {"mode": mode, "block_m": 64, "block_n": 64, "bh": 16, "seq": 16384, "d": 64, "ms": ms,
                "gbytes": 8.6, "gb_per_s": 8.6 / ms * 1e3, "status": "ok"}
    rows = pd.DataFrame([row("tma", 3.0), row("tma", 2.0)]).assign(time_utc=["2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"])
    monkeypatch.setattr(diagnostics, "load_results", lambda *a, **k: rows)
    assert diagnostics.probe_ms("tma") == 2.0  # a re-run replaces the cell
    with pytest.raises(KeyError, match="no reduce_probe row"):
        diagnostics.probe_ms("atomics")
