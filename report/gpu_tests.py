"""The attention GPU tests as the committed pytest logs record them (results/attention/flash_gpu_tests).

A `-v` log under pytest-xdist names each test twice: when a worker starts it (the bare node id) and
when it ends ("[gw3] [ 56%] PASSED <node id>"). Without xdist a line is "<node id> PASSED [ 50%]",
and a test cut while it ran is left as its bare node id. Reading the logs in order and keeping each
test's last word gives the state of the suite across several GPU calls, including the tests a time
limit cut while they ran (started, never ended).
"""

from __future__ import annotations

import re

import pandas as pd

from report.results import REPO_ROOT

LOG_DIR = REPO_ROOT / "results" / "attention" / "flash_gpu_tests"
# The runs of the newest code, oldest first: the whole set, then any whole test file run again
# after a change to it alone (tests/claims/test_code.py holds the files changed since the first).
NEWEST_RUNS = ("nvidia-h200-82b5ddff372c.log",)
# The files those runs covered: the attention tests with GPU cases.
TEST_FILES = ("tests/test_flash_attention.py", "tests/test_model_attention_impls.py", "tests/test_weighted_sum.py",
              "tests/test_fwd_ws.py", "tests/test_onepass_ws.py", "tests/test_direct_launch.py",
              "tests/test_flash_precision.py", "tests/test_bwd128_ws.py", "tests/test_eager_lane.py")
OUTCOMES = ("PASSED", "SKIPPED", "FAILED", "ERROR", "XFAIL", "XPASS")
_WORD = "|".join(OUTCOMES)
_ENDED_XDIST = re.compile(rf"^\[gw\d+\] \[\s*\d+%\] ({_WORD}) (tests/\S+)")  # outcome, id
_ENDED_PLAIN = re.compile(rf"^(tests/\S+::\S+) ({_WORD})\b")  # id, outcome
_STARTED = re.compile(r"^(tests/\S+::\S+)\s*$")
_WHOLE_FILE = re.compile(r"(?<!\S)(tests/[\w/]+\.py)(?!\S)")  # a file the command ran whole (no ::)
_SUMMARY = re.compile(r"^=+ (warnings summary|short test summary info|FAILURES|ERRORS|\d+ \w+.* in [\d.]+s.*) =+$")


def log_git(log: str) -> str:
    """The commit a log's run tested (its header names it)."""
    return re.search(r"git ([0-9a-f]{12})", (LOG_DIR / log).read_text()).group(1)


def outcomes(logs: tuple[str, ...] = NEWEST_RUNS) -> pd.DataFrame:
    """One row per test id: its outcome in the last log that ran it ("UNFINISHED": started, cut
    before it ended) and that log. A log whose command names a whole test file replaces every
    earlier outcome of that file (its tests as they are now: a renamed case is not kept twice)."""
    last: dict[str, tuple[str, str]] = {}
    for log in logs:
        text = (LOG_DIR / log).read_text()
        whole = set(_WHOLE_FILE.findall(next((ln for ln in text.splitlines() if ln.startswith("# command:")), "")))
        last = {t: v for t, v in last.items() if t.split("::")[0] not in whole}
        for line in text.splitlines():
            if _SUMMARY.match(line):  # the run is over: what follows (warnings, failures) names
                break                 # tests without running them
            if m := _ENDED_XDIST.match(line):
                last[m.group(2)] = (m.group(1), log)
            elif m := _ENDED_PLAIN.match(line):
                last[m.group(1)] = (m.group(2), log)
            elif m := _STARTED.match(line):  # started (again, in a later run): unfinished until it ends
                last[m.group(1)] = ("UNFINISHED", log)
        if not any(g == log for _, g in last.values()):
            raise ValueError(f"{log}: no test outcome in it (was it run with -v?)")
    return pd.DataFrame([(t, o, g) for t, (o, g) in last.items()], columns=["test", "outcome", "log"])


def counts(logs: tuple[str, ...] = NEWEST_RUNS) -> dict[str, int]:
    """How many tests end in each outcome (zeros included), and the total."""
    o = outcomes(logs)
    c = o.outcome.value_counts()
    return {**{k: int(c.get(k, 0)) for k in (*OUTCOMES, "UNFINISHED")}, "total": len(o)}

