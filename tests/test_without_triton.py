"""A machine without Triton (a student's Mac): the suite still collects and runs, the Triton tests
skip with the reason, and calling a Triton path says what to install.

Triton is hidden from a fresh interpreter by `sys.modules["triton"] = None` (then `import triton`
raises ImportError and `importlib.util.find_spec("triton")` returns None, as when it is not
installed), set before pytest imports anything.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cs336_systems.attention import flash_attention
from cs336_systems.attention.triton_loader import TritonNotInstalled, kernels

ROOT = Path(__file__).parents[1]
WITHOUT_TRITON = "import sys; sys.modules['triton'] = None; import pytest; sys.exit(pytest.main(sys.argv[1:]))"
# Each subprocess imports torch and the package afresh, and collects or runs many modules.
pytestmark = pytest.mark.slow


def pytest_without_triton(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WITHOUT_TRITON, "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
                           *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_the_whole_suite_collects_without_triton():
    out = pytest_without_triton("--collect-only", "tests")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "error" not in out.stdout.strip().splitlines()[-1], out.stdout[-3000:]  # "N tests collected in ..."


def test_flash_attention_tests_pass_or_skip_without_triton():
    out = pytest_without_triton("-m", "not slow", "-rs", "tests/test_flash_attention.py")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "needs the triton package" in out.stdout  # the Triton tests say why they skipped
    assert " passed" in out.stdout  # and the PyTorch FA2's ran


def test_a_triton_path_without_triton_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", None)
    monkeypatch.delitem(sys.modules, "cs336_systems.attention.flash_fwd_kernel", raising=False)
    monkeypatch.delitem(sys.modules, "cs336_systems.attention.tile_io", raising=False)
    with pytest.raises(TritonNotInstalled, match=r"pip install triton.*impl=\"pytorch\""):
        kernels("cs336_systems.attention.flash_fwd_kernel")
    q = torch.randn(1, 2, 16, 16)
    with pytest.raises(TritonNotInstalled, match="pip install triton"):
        flash_attention(q, q, q, impl="triton")
    assert isinstance(TritonNotInstalled("x"), ImportError)  # code that falls back on ImportError still does
