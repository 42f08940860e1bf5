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

A launch site may pass a tensor descriptor as a `Tma` (the tensor, its 2-D view's shape and strides,
the box, the shared layout) instead of Triton's TensorDescriptor, whose checks cost microseconds per
call. On Triton 3.6 the direct call then hands the C launcher the expanded arguments itself, with
each descriptor's filled tensor map kept per data pointer: the map encodes only the address and the
geometry, and the geometry is in the launch key, so a map made for a pointer is the map of every
tensor later found at that address with that key (the cache holds addresses, never tensors). On
other Tritons the compiled launcher expands them, as for Triton's own descriptors.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import warnings
from typing import NamedTuple

import torch

from ..triton_loader import interpreting

# What the direct call reads: of the kernel (its parameters in order, their defaults) and of its
# compiled form (the launcher and what it is handed), as Triton 3.6 to 3.9 name them.
KERNEL_NEEDS = ("arg_names", "params")
COMPILED_NEEDS = ("run", "function", "packed_metadata")


class Tma(NamedTuple):
    """A tensor descriptor as a launch site hands it to `DirectKernel.launch`: what Gluon's
    TensorDescriptor holds, without its per-call checks (made where Triton's dispatch needs one)."""
    base: torch.Tensor
    shape: tuple[int, ...]  # of the view the kernel addresses, e.g. (Z * H * N, d)
    strides: tuple[int, ...]
    block_shape: tuple[int, ...]
    layout: object  # the NVMMA shared layout of a box
    padding: str = "zero"

    @classmethod
    def rows(cls, t: torch.Tensor, block_shape, layout) -> "Tma":
        """A contiguous tensor as (rows, last dim): the (Z * H * N, d) view of (Z, H, N, d)."""
        d = t.shape[-1]
        return cls(t, (t.numel() // d, d), (d, 1), tuple(block_shape), layout)

    def descriptor(self):
        """Gluon's TensorDescriptor of the same tile (Triton's dispatch specialises on its type)."""
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        view = self.base.as_strided(self.shape, self.strides)  # the view a launch site used to describe
        return TensorDescriptor.from_tensor(view, list(self.block_shape), self.layout, self.padding)


def for_triton(args: tuple) -> tuple:
    """`args` with every `Tma` as a TensorDescriptor: what `kernel[grid](*args)` takes."""
    return tuple(a.descriptor() if type(a) is Tma else a for a in args)


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
    base = arg.base  # a tensor descriptor (Triton's, Gluon's or a Tma)
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
            return self.kernel[grid](*for_triton(args), **constexprs)
        device, stream = _device_and_stream()
        key = (device, tuple(constexprs.items()), tuple(map(_spec, args)))
        found = self.compiled.get(key)
        if found is None:
            compiled = self.kernel[grid](*for_triton(args), **constexprs)  # compiles, or loads from Triton's cache
            found = self._direct_call(compiled, len(args), constexprs)
            if found is not None:
                self.compiled[key] = found
            return compiled
        _call_launcher(found, grid, stream, args)
        return None

    def bind(self, grid: tuple[int, ...], args: tuple, constexprs: dict):
        """Launch as `launch` does, then return a function of the arguments alone that launches later
        `args` of the same launch key without computing the key again (for a launch with ~15
        arguments, most of a direct launch's Python). The caller vouches that later arguments agree
        with these in everything the key holds (dtypes, 16-byte alignment, integer values,
        descriptor geometry), as a launch prepared for one shape, dtype and plan does. None where
        this launch took Triton's dispatch (the interpreter, a hook, `dispatch_only`, another
        Triton): the caller binds again at its next launch, so a first call under a hook does not
        keep the later ones off the direct path."""
        self.launch(grid, args, constexprs)
        if self.unavailable or self.interpreted or _DISPATCH_ONLY[0] or _hooked():
            return None
        device, _ = _device_and_stream()
        found = self.compiled.get((device, tuple(constexprs.items()), tuple(map(_spec, args))))
        if found is None:
            return None

        def launch(later: tuple):
            now, stream = _device_and_stream()
            if _DISPATCH_ONLY[0] or _hooked() or now != device:
                return self.launch(grid, later, constexprs)
            _call_launcher(found, grid, stream, later)
        return launch

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
        return compiled.run, compiled.function, compiled.packed_metadata, tail, RawLauncher.of(compiled.run, n_args)


def _call_launcher(found: tuple, grid: tuple[int, ...], stream: int, args: tuple) -> None:
    """One launch through what `DirectKernel._direct_call` found: the raw C launcher where there is
    one, else the compiled launcher (no launch metadata, no hooks)."""
    run, function, metadata, tail, raw = found
    g0, g1, g2 = (*grid, 1, 1)[:3]
    if raw is None:
        run(g0, g1, g2, stream, function, metadata, None, None, None, *args, *tail)
    else:
        raw.launch(g0, g1, g2, stream, function, metadata, args, tail)


# The leading arguments of Triton 3.6's C launcher (grid, stream, function, cooperative, PDL,
# scratch, metadata, hooks); another layout is another Triton's, launched as it is.
TRITON_36_BASE_ARGS = "iiiKKppOOOOOO"
MAPS_PER_ARGUMENT = 64  # filled tensor maps kept per descriptor argument of a launch (addresses seen)


class RawLauncher:
    """Triton 3.6's C launcher of one compiled kernel, called without its Python wrappers: the
    runtime arguments expanded here (a descriptor into its tensor map, shape and strides), the
    tensor maps of `Tma` arguments kept per data pointer. `of` finds the pieces, or None (another
    Triton, a launch that needs scratch memory): then the compiled launcher is called as it is."""

    def __init__(self, c_launch, cooperative, pdl, expand, metas: dict):
        self.c_launch, self.cooperative, self.pdl = c_launch, cooperative, pdl
        self.expand = expand  # Triton's make_tensordesc_arg(descriptor, its metadata) -> [map, *shape, *strides]
        self.metas = metas  # descriptor argument position -> its metadata (None: a host-side descriptor's)
        self.maps: dict[int, dict[int, list]] = {i: {} for i in metas}

    @classmethod
    def of(cls, launcher, n_args: int) -> "RawLauncher | None":
        driver = sys.modules.get(type(launcher).__module__)
        if getattr(driver, "_BASE_ARGS_FORMAT", None) != TRITON_36_BASE_ARGS or \
                not hasattr(driver, "make_tensordesc_arg"):
            return None  # not Triton 3.6's launcher (a stand-in, or another Triton)
        if getattr(launcher, "global_scratch_size", 1) or getattr(launcher, "profile_scratch_size", 1):
            return None  # Triton allocates scratch memory per launch
        inner = launcher.launch
        closure = getattr(inner, "__closure__", None)
        if closure is None:  # no descriptor arguments: the C launcher itself
            c_launch, indices, metas = inner, set(), []
        else:  # wrap_handle_tensordesc's closure around it
            cells = dict(zip(inner.__code__.co_freevars, (c.cell_contents for c in closure)))
            if not {"launcher", "tensordesc_indices", "tensordesc_meta"} <= cells.keys():
                return None
            c_launch, indices, metas = cells["launcher"], cells["tensordesc_indices"], cells["tensordesc_meta"]
        if any(i >= n_args for i in indices):
            return None  # a descriptor among the constexprs' positions: not a launch this class knows
        return cls(c_launch, launcher.launch_cooperative_grid, launcher.launch_pdl, driver.make_tensordesc_arg,
                   dict(zip(sorted(indices), metas)))

    def launch(self, g0, g1, g2, stream, function, metadata, args: tuple, tail: tuple):
        if self.metas:
            expanded = []
            for i, a in enumerate(args):
                if i in self.metas:
                    expanded += self._tensor_map(i, a)
                else:
                    expanded.append(a)
            args = expanded
        self.c_launch(g0, g1, g2, stream, function, self.cooperative, self.pdl, None, None, metadata, None, None,
                      None, *args, *tail)

    def _tensor_map(self, i: int, desc) -> list:
        """The expanded descriptor argument `i`: a `Tma`'s from the cache (its geometry is fixed by
        the launch key, so its address alone tells maps apart), any other descriptor's afresh."""
        if type(desc) is not Tma:
            return self.expand(desc, self.metas[i])
        maps = self.maps[i]
        ptr = desc.base.data_ptr()
        found = maps.get(ptr)
        if found is None:
            if len(maps) >= MAPS_PER_ARGUMENT:
                maps.clear()
            found = maps[ptr] = self.expand(desc, self.metas[i])
        return found


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
