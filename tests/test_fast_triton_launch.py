"""The speed path's launches of the teaching kernels (`fast.triton_launch`) pass what the teaching
launchers (`flash_launch`) pass, launch by launch; and the direct launcher hands each real kernel's
parameters to the compiled launcher in the kernel's own order. On any machine: the kernels are
stood in for by recorders, nothing runs."""

from __future__ import annotations

import inspect
import types

import pytest
import torch

from cs336_systems.attention import flash_launch
from cs336_systems.attention.fast import direct_launch, triton_launch
from cs336_systems.attention.tiles import BwdConfig, FwdConfig
from tests.triton_mode import NO_TRITON

triton = pytest.importorskip("triton", reason=NO_TRITON)

OPTIONS = ("num_warps", "num_stages", "maxnreg")  # launch options: Triton's, not the kernel's parameters


class Recorder:
    """Stands in for a kernel module: `module.name[grid](*args, **kw)` records the launch."""

    def __init__(self):
        self.launches: list[tuple] = []

    def __getattr__(self, name: str):
        launches = self.launches

        class Launch:
            def __getitem__(self, grid):
                return lambda *args, **kw: launches.append((name, tuple(grid), args, kw))
        return Launch()


def _canonical(launch: tuple, inputs: tuple) -> tuple:
    """A launch with its tensors named: an input by its place, a new tensor by its shape, strides
    and dtype, a descriptor by its base and box."""
    name, grid, args, kw = launch

    def arg(a):
        if isinstance(a, torch.Tensor):
            found = [i for i, t in enumerate(inputs) if t is a]
            return ("input", found[0]) if found else ("new", tuple(a.shape), a.stride(), a.dtype)
        if hasattr(a, "block_shape"):
            return ("descriptor", arg(a.base), tuple(a.shape), tuple(a.strides), tuple(a.block_shape))
        return (type(a), a)
    return name, grid, tuple(map(arg, args)), sorted(kw.items())


@pytest.fixture
def recorded(monkeypatch):
    """(teaching recorder, fast recorder); the direct launcher takes Triton's dispatch (the recorder)."""
    teaching, fast = Recorder(), Recorder()
    monkeypatch.setattr(flash_launch, "kernels", lambda module: teaching if "attention.flash_" in module
                        else __import__("importlib").import_module(module))
    monkeypatch.setattr(triton_launch, "kernels", lambda module: fast)
    monkeypatch.setattr(direct_launch, "interpreting", lambda: True)
    return teaching, fast


def _inputs(n_q=48, n_k=40, d=32, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    q, do, o = (torch.randn(1, 2, n_q, d, generator=g, dtype=dtype) for _ in range(3))
    k, v = (torch.randn(1, 2, n_k, d, generator=g, dtype=dtype) for _ in range(2))
    L = torch.randn(1, 2, n_q, generator=g)
    return q, k, v, o, L, do


BWD_TILES = [BwdConfig(16, 16, 16, 16), BwdConfig(16, 32, 32, 16, fused=True), BwdConfig(16, 16, 16, 16, tma1=True),
             BwdConfig(16, 16, 32, 16, fused=True, tma1=True, tma2=True), BwdConfig(16, 16, 16, 16, tma2=True)]


@pytest.mark.parametrize("tma", [False, True], ids=["pointers", "tma"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_forward_launch_is_the_teaching_launch(recorded, tma, dtype, causal):
    teaching, fast = recorded
    q, k, v, *_ = inputs = _inputs(dtype=dtype)
    c = FwdConfig(16, 16, tma=tma)
    flash_launch.launch_fwd(q, k, v, causal, c)
    triton_launch.launch_fwd(q, k, v, causal, c)
    assert [_canonical(x, inputs) for x in fast.launches] == [_canonical(x, inputs) for x in teaching.launches]
    assert len(fast.launches) == 1


@pytest.mark.parametrize("c", BWD_TILES, ids=["two-pass", "fused", "tma1", "fused-tma", "tma2"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("n_q", [48, 40], ids=["n_q-48", "n_q-40"])  # 40: a ragged last query tile (NO_TAIL)
def test_backward_launches_are_the_teaching_launches(recorded, c, causal, n_q):
    teaching, fast = recorded
    q, k, v, o, L, do = inputs = _inputs(n_q=n_q)
    flash_launch.launch_bwd(q, k, v, o, L, do, causal, c)
    triton_launch.launch_bwd(q, k, v, o, L, do, causal, c)
    # delta is a new tensor in each: it is named by its shape, the same in both
    assert [_canonical(x, inputs) for x in fast.launches] == [_canonical(x, inputs) for x in teaching.launches]
    assert [x[0] for x in fast.launches] == (["bwd_preprocess_kernel", "bwd_fused_kernel"] if c.fused else
                                            ["bwd_preprocess_kernel", "bwd_dkdv_kernel", "bwd_dq_kernel"])


def test_fp32_launches_follow_the_matmul_setting_each_call(recorded):
    # the constexprs are built once per shape and plan: the precision is part of what they are built from
    _, fast = recorded
    q, k, v, *_ = _inputs()
    matmul = torch.backends.cuda.matmul
    before = matmul.fp32_precision
    try:
        for setting in ("ieee", "tf32", "ieee"):
            matmul.fp32_precision = setting
            triton_launch.launch_fwd(q, k, v, True, FwdConfig(16, 16))
    finally:
        matmul.fp32_precision = before
    assert [x[3]["INPUT_PRECISION"] for x in fast.launches] == ["ieee", "tf32", "ieee"]


class Compiling:
    """A real kernel's signature on a stand-in: `[grid](*args, **kw)` records the launch and returns
    a compiled form whose launcher records what the direct call hands it."""

    def __init__(self, real):
        self.real = real
        self.arg_names = real.arg_names
        self.params = [types.SimpleNamespace(name=n, default=p.default)
                       for n, p in inspect.signature(real.fn).parameters.items()]
        self.dispatched, self.direct = [], []
        self.compiled = types.SimpleNamespace(function="fn", packed_metadata="meta",
                                              run=lambda *launch: self.direct.append(launch))

    def __getitem__(self, grid):
        return lambda *args, **kw: self.dispatched.append((args, kw)) or self.compiled


KERNELS = ("flash_fwd_kernel", "bwd_preprocess_kernel", "bwd_fused_kernel", "bwd_dkdv_kernel", "bwd_dq_kernel")


@pytest.mark.parametrize("which", ["fwd", "bwd-fused", "bwd-two-pass"])
def test_the_direct_call_hands_every_parameter_in_the_kernels_order(monkeypatch, which):
    # What Triton's binder makes of (args, kw): bound to the kernel's signature, defaults filled in,
    # launch options dropped. The direct call must hand the launcher exactly those values, in order.
    from cs336_systems.attention.triton_loader import kernels

    stand_ins: dict[str, Compiling] = {}

    def module(name):
        real = kernels(name)
        return types.SimpleNamespace(**{a: stand_ins.setdefault(a, Compiling(getattr(real, a)))
                                        for a in KERNELS if hasattr(real, a)})

    directs: dict = {}
    monkeypatch.setattr(triton_launch, "kernels", module)
    monkeypatch.setattr(triton_launch, "direct", lambda k: directs.setdefault(id(k), direct_launch.DirectKernel(k)))
    monkeypatch.setattr(direct_launch, "interpreting", lambda: False)
    monkeypatch.setattr(direct_launch, "_hooked", lambda: False)
    monkeypatch.setattr(direct_launch, "_device_and_stream", lambda: (0, 77))
    q, k, v, o, L, do = _inputs()
    for _ in range(2):  # the first launch per key through the dispatch, the second directly
        if which == "fwd":
            triton_launch.launch_fwd(q, k, v, True, FwdConfig(16, 16, tma=True))
        else:
            triton_launch.launch_bwd(q, k, v, o, L, do, True,
                                     BwdConfig(16, 16, 16, 16, fused=which == "bwd-fused", tma1=True))
    launched = [s for s in stand_ins.values() if s.dispatched]
    assert len(launched) == (1 if which == "fwd" else 2 if which == "bwd-fused" else 3)
    for kernel in launched:
        assert len(kernel.dispatched) == 1 and len(kernel.direct) == 1
        args, kw = kernel.dispatched[0]
        bound = inspect.signature(kernel.real.fn).bind(*args, **{n: x for n, x in kw.items() if n not in OPTIONS})
        bound.apply_defaults()
        launch = kernel.direct[0]
        assert launch[3:9] == (77, "fn", "meta", None, None, None)  # stream, function, no metadata or hooks
        passed, expected = launch[9:], tuple(bound.arguments.values())
        assert len(passed) == len(expected)
        # the runtime arguments: this call's own tensors (new outputs: compared by kind), the same numbers
        assert [_kind(a) for a in passed[:len(args)]] == [_kind(a) for a in expected[:len(args)]]
        assert passed[len(args):] == expected[len(args):]  # constexprs and defaults, in the kernel's order


def _kind(a):
    if isinstance(a, torch.Tensor):
        return "tensor", tuple(a.shape), a.dtype
    if hasattr(a, "block_shape"):
        return "descriptor", tuple(a.shape), tuple(a.block_shape)
    return type(a), a


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: the compiled kernels")
@pytest.mark.parametrize("tma", [False, True], ids=["pointers", "tma"])
@pytest.mark.parametrize("fused", [False, True], ids=["two-pass", "fused"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_gpu_direct_launches_give_the_teaching_launches_bits(tma, fused, dtype):
    """The same kernels with the same arguments: launched directly (the second call of each key;
    the first goes through Triton's dispatch) they give the teaching launchers' bits. Every kernel
    here is deterministic (no atomics: each output tile has one program)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(2, 3, 384, 64, device="cuda", dtype=dtype, generator=g) for _ in range(4))
    fwd = FwdConfig(64, 32, 4, 2, tma=tma)
    bwd = BwdConfig(32, 64, 64, 32, 4, 2, 4, 2, fused=fused, tma1=tma, tma2=tma)
    o_ref, L_ref = flash_launch.launch_fwd(q, k, v, True, fwd)
    grads_ref = flash_launch.launch_bwd(q, k, v, o_ref, L_ref, do, True, bwd)
    for _ in range(2):
        o, L = triton_launch.launch_fwd(q, k, v, True, fwd)
        grads = triton_launch.launch_bwd(q, k, v, o, L, do, True, bwd)
    assert torch.equal(o, o_ref) and torch.equal(L, L_ref)
    assert all(torch.equal(a, b) for a, b in zip(grads, grads_ref))
    # and they were launched directly: each kernel has a compiled launch on record
    from cs336_systems.attention.triton_loader import kernels

    for name in ("flash_fwd_kernel",):
        assert direct_launch.direct(getattr(kernels(flash_launch.FWD), name)).compiled
    for name in ("bwd_preprocess_kernel", "bwd_fused_kernel" if fused else "bwd_dq_kernel"):
        assert direct_launch.direct(getattr(kernels(flash_launch.BWD), name)).compiled
