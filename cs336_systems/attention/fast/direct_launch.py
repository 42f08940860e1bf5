"""Launching a compiled kernel without Triton's per-call dispatch: the speed path's launches.

`kernel[grid](*args, **constexprs)` goes through `JITFunction.run` on every call: it binds the
arguments, specialises each one (dtype, 16-byte alignment, integers equal to 1 or divisible by 16),
hashes that into a cache key, reads Triton's settings from the environment and only then finds
the compiled kernel and calls its launcher. For one launch site, shape, dtype and plan the answers
never change, so `DirectKernel` asks Triton once (the first call compiles or loads the kernel) and
later calls with the same `key` hand their arguments straight to that kernel's launcher. The
host-overhead benchmark (`just bench flash-host`) times both ways (`dispatch_only`).

A launch is known by everything Triton specialises on: the constexprs and launch options, and per
runtime argument its dtype and 16-byte alignment (tensors), its value (integers: shapes and
strides), or its dtype, shape, strides, box and layout (tensor descriptors). Under the Triton
interpreter, or while a launch hook is installed (a profiler's), every call takes Triton's path.
So does every call of a kernel whose compiled form lacks what the direct call needs (another
Triton's internals: written against 3.6, the GPU's, and 3.9): a one-time warning says so.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import warnings

import torch

from ..triton_loader import interpreting

# What the direct call reads: of the kernel (its parameters in order, their defaults) and of its
# compiled form (the launcher and what it is handed), as Triton 3.6 to 3.9 name them.
KERNEL_NEEDS = ("arg_names", "params")
COMPILED_NEEDS = ("run", "function", "packed_metadata")


def _spec(arg):
    """What Triton may compile differently for this argument (its launch key's share). Per call of
    a launch with ~36 arguments this is most of the direct path's host time, so the commonest
    argument, an integer (shapes and strides), is tested for first and keyed by its value alone."""
    kind = type(arg)
    if kind is int:
        return arg
    if isinstance(arg, torch.Tensor):  # aligned pointers get vectorised loads
        return arg.dtype, arg.data_ptr() % 16 == 0
    if arg is None or kind is bool or kind is float:
        return kind, arg  # the type too: True == 1 == 1.0 in a dict key, but Triton types them apart
    base = arg.base  # a tensor descriptor (Triton's or Gluon's)
    return (base.dtype, base.data_ptr() % 16 == 0, tuple(arg.shape), tuple(arg.strides), tuple(arg.block_shape),
            getattr(arg, "layout", None), getattr(arg, "padding", None))


@functools.cache
def direct(kernel) -> "DirectKernel":
    """The one DirectKernel of `kernel`: every launch site of a kernel shares its compiled launches."""
    return DirectKernel(kernel)


_DISPATCH_ONLY = [False]  # set by `dispatch_only`: every launch through Triton's dispatch


@contextlib.contextmanager
def dispatch_only():
    """Within: every DirectKernel launches through `kernel[grid]` (to time the difference)."""
    before, _DISPATCH_ONLY[0] = _DISPATCH_ONLY[0], True
    try:
        yield
    finally:
        _DISPATCH_ONLY[0] = before


class DirectKernel:
    """`DirectKernel(kernel).launch(grid, args, constexprs)`: `kernel[grid](*args, **constexprs)`,
    the first time per launch key through Triton, afterwards through the compiled kernel's launcher.
    `args` are the runtime arguments (tensors, descriptors, numbers), the kernel's leading
    parameters in order; `constexprs` the rest by name, with the launch options (num_warps,
    num_stages, maxnreg)."""

    def __init__(self, kernel):
        self.kernel = kernel
        # launch key -> (launcher, compiled function, packed metadata, the constexpr parameters' values in order)
        self.compiled: dict = {}
        self.unavailable: str | None = None  # why this kernel cannot be launched directly, once known
        # Triton fixed at its import whether its kernels are compiled or interpreted (TRITON_INTERPRET),
        # so the kernel's mode is asked once, not from the environment on every launch.
        self.interpreted = interpreting() or type(kernel).__name__ == "InterpretedFunction"

    def launch(self, grid: tuple[int, ...], args: tuple, constexprs: dict):
        if self.unavailable or self.interpreted or _DISPATCH_ONLY[0] or _hooked():
            return self.kernel[grid](*args, **constexprs)
        device, stream = _device_and_stream()
        key = (device, tuple(constexprs.items()), tuple(map(_spec, args)))
        found = self.compiled.get(key)
        if found is None:
            compiled = self.kernel[grid](*args, **constexprs)  # compiles, or loads from Triton's cache
            found = self._direct_call(compiled, len(args), constexprs)
            if found is not None:
                self.compiled[key] = found
            return compiled
        run, function, metadata, tail = found
        g0, g1, g2 = (*grid, 1, 1)[:3]
        run(g0, g1, g2, stream, function, metadata, None, None, None, *args, *tail)  # no launch metadata, no hooks
        return None

    def _direct_call(self, compiled, n_args: int, constexprs: dict) -> tuple | None:
        """What later launches hand the launcher, read from the kernel and the compiled form that
        Triton's first launch returned; None, once and for all with a warning, where they lack it."""
        missing = [f"kernel.{a}" for a in KERNEL_NEEDS if not hasattr(self.kernel, a)]
        missing += [f"compiled.{a}" for a in COMPILED_NEEDS if not hasattr(compiled, a)]
        if not missing:
            names = self.kernel.arg_names[n_args:]
            defaults = {p.name: p.default for p in self.kernel.params if p.default is not inspect.Parameter.empty}
            missing = [f"a value for parameter {n}" for n in names if n not in constexprs and n not in defaults]
        if missing:
            import triton

            self.unavailable = f"no {', '.join(missing)} in Triton {triton.__version__}"
            warnings.warn(f"direct launch of {getattr(self.kernel, '__name__', self.kernel)!r} is unavailable "
                          f"({self.unavailable}); launching through Triton's dispatch, which costs more host time "
                          "per call", stacklevel=3)
            return None
        tail = tuple(constexprs[n] if n in constexprs else defaults[n] for n in names)
        return compiled.run, compiled.function, compiled.packed_metadata, tail


@functools.cache
def _triton_runtime():
    """(Triton's active driver holder, its runtime settings), imported once: this module imports no
    Triton until a launch."""
    from triton import knobs
    from triton.runtime import driver

    return driver, knobs.runtime


def _device_and_stream() -> tuple[int, int]:
    """The current device and its current stream, as Triton's dispatch finds them."""
    active = _triton_runtime()[0].active
    device = active.get_current_device()
    return device, active.get_current_stream(device)


def _hooked() -> bool:
    """Whether a launch hook is installed (a profiler's)."""
    runtime = _triton_runtime()[1]
    return _is_hook(runtime.launch_enter_hook) or _is_hook(runtime.launch_exit_hook)


def _is_hook(hook) -> bool:
    """Triton 3.6 keeps an always-present chain of hooks (empty unless a profiler added one);
    other versions may keep None."""
    return hook is not None and bool(getattr(hook, "calls", True))
