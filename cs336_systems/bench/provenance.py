"""Where a number came from: device, library versions, git commit, time.

Every results row carries these fields, so a table on the site can say which machine and which
code measured it.
"""

from __future__ import annotations

import datetime as _dt
import functools
import os
import platform
import re
import subprocess

import torch


def device_name(device: str | torch.device | None = None) -> str:
    """Human name of the device a benchmark runs on: 'NVIDIA H200', or the CPU model."""
    dev = torch.device(device) if device is not None else _default_device()
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return platform.processor() or platform.machine() or "cpu"


def device_slug(device: str | torch.device | None = None) -> str:
    """File-name form of the device class: 'nvidia-h200' on that GPU, 'cpu' on any CPU.

    Results are stored per device class, so a CPU run can never overwrite GPU results.
    """
    dev = torch.device(device) if device is not None else _default_device()
    if dev.type != "cuda":
        return "cpu"
    return re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name(dev).lower()).strip("-")


def _default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


# Changes under results/ are rows that earlier runs wrote, not code: they do not make the tree dirty.
_CODE_PATHSPEC = (":(top)", ":(top,exclude)results")


@functools.cache
def git_commit() -> str:
    """The commit the code came from, with '-dirty' if tracked files outside results/ differ from it.

    The GPU machine gets a copy of the tree whose .git may be stale, so the launcher passes the
    commit in CS336_GIT_COMMIT, and that is trusted as given."""
    if env := os.environ.get("CS336_GIT_COMMIT"):
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            capture_output=True, text=True, timeout=5, check=True, cwd=here,
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", *_CODE_PATHSPEC],
            capture_output=True, text=True, timeout=5, check=True, cwd=here,
        ).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def traceable(commit: str) -> bool:
    """Whether rows stamped with `commit` can be traced to code someone can check out."""
    return commit != "unknown" and not commit.endswith("-dirty")


def provenance(device: str | torch.device | None = None) -> dict[str, str]:
    """The provenance fields every results row carries."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:  # macOS / Windows: no triton wheel
        triton_version = "none"
    return {
        "device": device_name(device),
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda or "none",
        "git": git_commit(),
        "time_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


PROVENANCE_FIELDS = ("device", "torch", "triton", "cuda", "git", "time_utc")
