"""Load a module of Triton kernels for the mode this process runs in: compiled, or interpreted.

`@triton.jit` decides at decoration time whether a kernel is compiled for the GPU or run by the
interpreter (TRITON_INTERPRET=1, numpy on the CPU), and a kernel can only call helpers of its own
kind. So kernel modules are never imported at package import: `kernels(name)` executes the module
on first use under the mode the environment asks for *now*, and keeps one copy per mode. The same
code and the same tests then run on a GPU, and on a CPU-only machine under the interpreter,
whichever module imported what first.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from types import ModuleType

_TRUE = {"1", "true", "on", "yes"}


def interpreting() -> bool:
    """Whether Triton kernels run under the interpreter (TRITON_INTERPRET=1) in this process now."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in _TRUE


@functools.cache
def _load(module_name: str, interpret: bool) -> ModuleType:
    spec = importlib.util.find_spec(module_name)
    if spec is None or spec.loader is None:
        raise ImportError(f"no kernel module {module_name!r}")
    module = importlib.util.module_from_spec(spec)
    before = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1" if interpret else "0"
    try:
        spec.loader.exec_module(module)
    finally:
        if before is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = before
    return module


def kernels(module_name: str) -> ModuleType:
    """The kernel module `module_name` (dotted), executed for the current mode."""
    return _load(module_name, interpreting())


def next_power_of_2(n: int) -> int:
    return 1 << (max(int(n), 1) - 1).bit_length()
