"""report/gpu_tests.py on made-up `-v` xdist logs: the last word per test across runs."""

from __future__ import annotations

import pytest

from report import gpu_tests

FIRST = """# header, git 0123456789ab
tests/t.py::a[1]
tests/t.py::b
[gw0] [ 33%] PASSED tests/t.py::a[1]
tests/t.py::c
[gw1] [ 66%] FAILED tests/t.py::b
tests/t.py::d
[gw0] [100%] SKIPPED tests/t.py::d
"""
SECOND = """# header, git ba9876543210
tests/t.py::b
[gw0] [ 50%] PASSED tests/t.py::b
tests/t.py::c
""" + """=============================== warnings summary ===============================
tests/t.py::a[1]
  a warning: the summary names a test without running it
"""


def test_last_outcome_per_test_and_cut_tests_unfinished(tmp_path, monkeypatch):
    (tmp_path / "1.log").write_text(FIRST)
    (tmp_path / "2.log").write_text(SECOND)
    monkeypatch.setattr(gpu_tests, "LOG_DIR", tmp_path)
    first = gpu_tests.outcomes(("1.log",)).set_index("test").outcome.to_dict()
    assert first == {"tests/t.py::a[1]": "PASSED", "tests/t.py::b": "FAILED", "tests/t.py::c": "UNFINISHED",
                     "tests/t.py::d": "SKIPPED"}
    both = gpu_tests.outcomes(("1.log", "2.log")).set_index("test")
    assert both.outcome["tests/t.py::b"] == "PASSED" and both.log["tests/t.py::b"] == "2.log"
    assert both.outcome["tests/t.py::c"] == "UNFINISHED" and both.log["tests/t.py::c"] == "2.log"
    assert gpu_tests.counts(("1.log", "2.log")) == {"PASSED": 2, "SKIPPED": 1, "FAILED": 0, "ERROR": 0, "XFAIL": 0,
                                                    "XPASS": 0, "UNFINISHED": 1, "total": 4}
    assert gpu_tests.log_git("2.log") == "ba9876543210"


PLAIN = """# header, git 00000000000c
tests/t.py::c PASSED                                                      [ 50%]
tests/t.py::e XFAIL (a reason)                                            [100%]
tests/t.py::f
"""


def test_a_log_without_xdist_reads_the_same_and_one_without_outcomes_is_refused(tmp_path, monkeypatch):
    (tmp_path / "1.log").write_text(FIRST)
    (tmp_path / "3.log").write_text(PLAIN)
    (tmp_path / "quiet.log").write_text("# header\n....F.s [100%]\n")
    monkeypatch.setattr(gpu_tests, "LOG_DIR", tmp_path)
    got = gpu_tests.outcomes(("1.log", "3.log")).set_index("test").outcome
    assert got["tests/t.py::c"] == "PASSED" and got["tests/t.py::e"] == "XFAIL" and got["tests/t.py::f"] == "UNFINISHED"
    assert gpu_tests.counts(("1.log", "3.log"))["total"] == 6
    with pytest.raises(ValueError, match=r"quiet.log: no test outcome in it \(was it run with -v\?\)"):
        gpu_tests.outcomes(("1.log", "quiet.log"))


WHOLE = """# header, git 00000000000d
# command: python3 -m pytest -v -n 4 tests/t.py
[gw0] [ 50%] PASSED tests/t.py::a[2]
[gw1] [100%] PASSED tests/t.py::b
"""
SOME = """# header, git 00000000000e
# command: python3 -m pytest -v tests/t.py::b
tests/t.py::b PASSED                                                      [100%]
"""


def test_a_log_of_a_whole_file_replaces_that_files_earlier_outcomes(tmp_path, monkeypatch):
    # a later run of the whole file is the file as it is now: a renamed case (a[1] -> a[2]) is not
    # kept twice; a run of some of a file's tests replaces only theirs
    for name, text in (("1.log", FIRST), ("3.log", WHOLE), ("4.log", SOME)):
        (tmp_path / name).write_text(text)
    monkeypatch.setattr(gpu_tests, "LOG_DIR", tmp_path)
    assert set(gpu_tests.outcomes(("1.log", "3.log")).test) == {"tests/t.py::a[2]", "tests/t.py::b"}
    some = gpu_tests.outcomes(("1.log", "4.log")).set_index("test")
    assert set(some.index) == {"tests/t.py::a[1]", "tests/t.py::b", "tests/t.py::c", "tests/t.py::d"}
    assert some.log["tests/t.py::b"] == "4.log" and some.log["tests/t.py::a[1]"] == "1.log"
