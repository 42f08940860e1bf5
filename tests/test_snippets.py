"""Every script in snippets/ runs: a docs example that stops working fails the suite.

A snippet that needs hardware this machine lacks says so in a first-lines comment
`# requires: cuda` (or `# requires: distributed`), and is skipped with that reason.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SNIPPETS = sorted((ROOT / "snippets").glob("*.py"))


def _requires(path: Path) -> set[str]:
    head = path.read_text().splitlines()[:10]
    return {word.strip() for line in head if line.startswith("# requires:")
            for word in line.split(":", 1)[1].split(",")}


@pytest.mark.parametrize("path", SNIPPETS, ids=[p.name for p in SNIPPETS])
def test_snippet_runs(path: Path):
    if "cuda" in _requires(path) and not torch.cuda.is_available():
        pytest.skip(f"{path.name} needs a CUDA GPU (it says '# requires: cuda')")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(path)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, f"{path.name} failed:\n{proc.stdout}\n{proc.stderr}"
