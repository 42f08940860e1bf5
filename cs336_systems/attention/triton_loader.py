"""Load Triton kernel modules on first use, and say whether the interpreter is on.

Kernel modules are never imported at package import, so `import cs336_systems.attention` does not
import triton. Triton fixes at its own import whether `@triton.jit` functions (its library's
`tl.sum`, `tl.max` included) are compiled for the GPU or run by the interpreter
(TRITON_INTERPRET=1: numpy on the CPU), so that variable must be set before triton is imported;
tests/conftest.py does so on machines without a GPU.
"""

from __future__ import annotations

import functools
import importlib
import os
from types import ModuleType

_TRUE = {"1", "true", "on", "yes"}


def interpreting() -> bool:
    """Whether Triton kernels run under the interpreter (TRITON_INTERPRET=1) in this process."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in _TRUE


class TritonNotInstalled(ImportError):
    """A Triton path was called in a process that cannot import triton."""


NO_TRITON = ("the Triton kernels need the `triton` package, which is not installed here: `pip install triton` "
             "(Triton ships wheels for Linux); without it use the PyTorch FlashAttention-2 "
             "(flash_attention(..., impl=\"pytorch\"), FlashAttentionPyTorch)")


def kernels(module_name: str) -> ModuleType:
    """The module `module_name` (dotted: one of our kernel modules, or a triton module), imported on
    first use; TritonNotInstalled, saying what to install, when triton cannot be imported."""
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        if (e.name or "").split(".")[0] != "triton":  # a missing module of ours is a different bug
            raise
        raise TritonNotInstalled(f"{module_name}: {NO_TRITON}") from e
    # Whatever the mode: asking the environment for it costs more than the patch, which is applied
    # once and changes nothing where the interpreter never runs; this is called on every launch.
    _squeeze_scalar_index()
    return module


@functools.cache
def _squeeze_scalar_index() -> None:
    """Let Triton 3.6's interpreter use a scalar argument as a loop bound under numpy >= 2.4.

    The interpreter holds a scalar argument (`n_keys`, `n_vocab`) as a numpy array of shape (1,)
    and turns it into a Python int with `int(array)`, which numpy 2.4 refuses ("only 0-dimensional
    arrays can be converted to Python scalars"): every `range(0, n_keys, BLOCK_N)` fails. Triton
    3.7+ squeezes the array first; this does the same after 3.6 patches its tensors. Nothing
    changes on a GPU (the patched function is the interpreter's) or on other Triton versions. Once
    per process."""
    import triton

    if not triton.__version__.startswith("3.6"):
        return
    from triton.runtime import interpreter

    patch = getattr(interpreter, "_patch_lang_tensor", None)
    if patch is None or getattr(patch, "squeezes_index", False):
        return

    def patch_and_squeeze(tensor, scope):
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    patch_and_squeeze.squeezes_index = True
    interpreter._patch_lang_tensor = patch_and_squeeze


def next_power_of_2(n: int) -> int:
    return 1 << (max(int(n), 1) - 1).bit_length()
