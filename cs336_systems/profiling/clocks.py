"""GPU clocks, power and temperature beside a measurement, read with nvidia-smi.

A step time that drifts in stretches (as our first bf16 rows did) may be the GPU changing its SM
clock (power or thermal limits, idle down-clocking). Recording the clock next to the times tells.
Without nvidia-smi (a CPU machine) every reading is None and the sample list stays empty.
"""

from __future__ import annotations

import statistics
import subprocess
import threading
import time

FIELDS = ("clocks.sm", "clocks.max.sm", "power.draw", "temperature.gpu")
NAMES = ("sm_mhz", "max_sm_mhz", "power_w", "temperature_c")


def query_gpu(index: int = 0, timeout_s: float = 10.0) -> dict[str, float | None] | None:
    """{sm_mhz, max_sm_mhz, power_w, temperature_c} of GPU `index` now, or None without nvidia-smi."""
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(FIELDS)}", "--format=csv,noheader,nounits",
                              "-i", str(index)], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        return None
    values = [v.strip() for v in lines[0].split(",")]
    if len(values) != len(FIELDS):
        return None
    return {name: _number(v) for name, v in zip(NAMES, values)}


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


class ClockSampler:
    """Context manager: one reading before, one after, and one every `period_s` in between (a
    background thread calling nvidia-smi). `record()` gives the row fields."""

    def __init__(self, period_s: float = 0.25, index: int = 0):
        self.period_s, self.index = period_s, index
        self.before = self.after = None
        self.samples: list[list[float | None]] = []  # [seconds since start, sm, max sm, power, temp]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            reading = query_gpu(self.index)
            if reading is None:
                return
            self.samples.append([round(time.monotonic() - self._t0, 3), *reading.values()])

    def __enter__(self) -> ClockSampler:
        self.before = query_gpu(self.index)
        self._t0 = time.monotonic()
        if self.before is not None:
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)
        self.elapsed_s = time.monotonic() - self._t0
        self.after = query_gpu(self.index)

    def record(self) -> dict:
        sm = [s[1] for s in self.samples if s[1] is not None]
        power = [s[3] for s in self.samples if s[3] is not None]
        return {"clocks_before": self.before, "clocks_after": self.after, "clock_samples": self.samples,
                "clock_sample_columns": ["t_s", *NAMES], "sampled_s": getattr(self, "elapsed_s", None),
                "sm_mhz_min": min(sm) if sm else None, "sm_mhz_max": max(sm) if sm else None,
                "sm_mhz_median": statistics.median(sm) if sm else None,
                "power_w_median": statistics.median(power) if power else None}
