"""Load Triton kernel modules on first use, and say whether the interpreter is on.

Kernel modules are never imported at package import, so `import cs336_systems.attention` does not
import triton. Triton fixes at its own import whether `@triton.jit` functions (its library's
`tl.sum`, `tl.max` included) are compiled for the GPU or run by the interpreter
(TRITON_INTERPRET=1: numpy on the CPU), so that variable must be set before triton is imported;
tests/conftest.py does so on machines without a GPU.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

_TRUE = {"1", "true", "on", "yes"}


def interpreting() -> bool:
    """Whether Triton kernels run under the interpreter (TRITON_INTERPRET=1) in this process."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in _TRUE


def kernels(module_name: str) -> ModuleType:
    """The kernel module `module_name` (dotted), imported on first use."""
    return importlib.import_module(module_name)


def next_power_of_2(n: int) -> int:
    return 1 << (max(int(n), 1) - 1).bit_length()
