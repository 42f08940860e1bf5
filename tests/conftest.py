"""Suite-wide test setup."""

from __future__ import annotations

import multiprocessing
import os
import subprocess

import pytest
import torch

# -- Triton interpreter on CPU-only machines ----------------------------------------------------
# Triton decides at *import* time whether @triton.jit functions (its own tl.sum / tl.max among them)
# are compiled or interpreted, so TRITON_INTERPRET must be set before anything imports triton.
# On a machine without a GPU we set it here, first thing, and the Triton tests run their kernels on
# the CPU (fp32); with a GPU nothing changes and the same tests run the compiled kernels.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


# -- one marker per chapter (`pytest -m flash`): tests/chapters.py says which files prove which ----
def pytest_configure(config):
    from tests.chapters import CHAPTERS

    for chapter in CHAPTERS:
        config.addinivalue_line("markers", f"{chapter.marker}: proves the chapter '{chapter.title}'")


def pytest_collection_modifyitems(config, items):
    from pathlib import Path

    import pytest

    from tests.chapters import chapters_of

    root = Path(__file__).parent
    for item in items:
        try:
            rel = Path(item.path).relative_to(root).as_posix()
        except ValueError:
            continue
        for marker in chapters_of(rel):
            item.add_marker(getattr(pytest.mark, marker))


@pytest.fixture
def no_new_processes(monkeypatch):
    """Starting a process (ranks, a child sweep) fails the test instead of happening: a bad argument
    must be refused before any process starts."""
    def refuse(*args, **kwargs):
        raise AssertionError("a process was started before the arguments were checked")

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse)
    monkeypatch.setattr(subprocess, "Popen", refuse)
