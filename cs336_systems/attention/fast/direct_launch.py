"""Launching a compiled kernel without Triton's per-call dispatch: the speed path's launches.

`kernel[grid](*args, **constexprs)` goes through `JITFunction.run` on every call: it binds the
arguments, specialises each one (dtype, 16-byte alignment, integers equal to 1 or divisible by 16),
hashes that into a cache key, reads Triton's settings from the environment and only then finds
the compiled kernel and calls its launcher. For one launch site, shape, dtype and plan the answers
never change, so `DirectKernel` asks Triton once (the first call compiles or loads the kernel) and
later calls with the same `key` hand their arguments straight to that kernel's launcher. The
host-overhead benchmark (`just bench flash-host`) times both ways.

A launch is known by everything Triton specialises on: the constexprs and launch options, and per
runtime argument its dtype and 16-byte alignment (tensors), its value (integers: shapes and
strides), or its dtype, shape, strides, box and layout (tensor descriptors). Under the Triton
interpreter, or while a launch hook is installed (a profiler's), every call takes Triton's path.
"""

from __future__ import annotations

import functools

import torch

from ..triton_loader import interpreting


def _spec(arg):
    """What Triton may compile differently for this argument (its launch key's share)."""
    if isinstance(arg, torch.Tensor):  # aligned pointers get vectorised loads
        return arg.dtype, arg.data_ptr() % 16 == 0
    if arg is None or isinstance(arg, (bool, int, float)):
        return type(arg), arg  # the type too: True == 1 in a dict key, but Triton types them apart
    base = arg.base  # a tensor descriptor (Triton's or Gluon's)
    return (base.dtype, base.data_ptr() % 16 == 0, tuple(arg.shape), tuple(arg.strides), tuple(arg.block_shape),
            getattr(arg, "layout", None), getattr(arg, "padding", None))


@functools.cache
def direct(kernel) -> "DirectKernel":
    """The one DirectKernel of `kernel`: every launch site of a kernel shares its compiled launches."""
    return DirectKernel(kernel)


class DirectKernel:
    """`DirectKernel(kernel).launch(grid, args, constexprs)`: `kernel[grid](*args, **constexprs)`,
    the first time per launch key through Triton, afterwards through the compiled kernel's launcher.
    `args` are the runtime arguments (tensors, descriptors, numbers), the kernel's leading
    parameters in order; `constexprs` the rest by name, with the launch options (num_warps,
    num_stages, maxnreg)."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.compiled: dict = {}  # launch key -> (compiled kernel, the constexpr parameters' values in order)

    def launch(self, grid: tuple[int, ...], args: tuple, constexprs: dict):
        from triton import knobs

        if interpreting() or _hooked(knobs.runtime.launch_enter_hook) or _hooked(knobs.runtime.launch_exit_hook):
            return self.kernel[grid](*args, **constexprs)
        device, stream = _device_and_stream()
        key = (device, tuple(constexprs.items()), tuple(_spec(a) for a in args))
        found = self.compiled.get(key)
        if found is None:
            compiled = self.kernel[grid](*args, **constexprs)  # compiles, or loads from Triton's cache
            names = self.kernel.arg_names[len(args):]
            defaults = {p.name: p.default for p in self.kernel.params}
            tail = tuple(constexprs[n] if n in constexprs else defaults[n] for n in names)
            self.compiled[key] = (compiled, tail)
            return compiled
        compiled, tail = found
        g0, g1, g2 = (*grid, 1, 1)[:3]
        compiled.run(g0, g1, g2, stream, compiled.function,
                     compiled.packed_metadata, None, None, None, *args, *tail)  # no launch metadata, no hooks
        return compiled


def _device_and_stream() -> tuple[int, int]:
    """The current device and its current stream, as Triton's dispatch finds them."""
    from triton.runtime import driver

    device = driver.active.get_current_device()
    return device, driver.active.get_current_stream(device)


def _hooked(hook) -> bool:
    """Whether a launch hook is installed: Triton 3.6 keeps an always-present chain of hooks (empty
    unless a profiler added one); other versions may keep None."""
    return hook is not None and bool(getattr(hook, "calls", True))
