"""The direct call into Triton 3.6's C launcher (`direct_launch.RawLauncher`), with a stand-in of
that launcher on any machine: what it hands the C launcher, in which order, and when a descriptor's
tensor map is made again. The GPU test beside Triton's dispatch is in test_direct_launch.py."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from cs336_systems.attention.fast import direct_launch
from cs336_systems.attention.fast.direct_launch import RawLauncher, Tma


@pytest.fixture
def driver(monkeypatch):
    """A module laid out as Triton 3.6's nvidia driver: its C launcher's base-argument format and
    make_tensordesc_arg (here: records each expansion and returns a marker per pointer)."""
    module = types.ModuleType("fake_triton36_driver")
    module._BASE_ARGS_FORMAT = direct_launch.TRITON_36_BASE_ARGS
    module.expanded = []

    def make_tensordesc_arg(desc, meta):
        module.expanded.append((desc.base.data_ptr(), meta))
        return [("map", desc.base.data_ptr(), meta), *desc.shape, *desc.strides]

    module.make_tensordesc_arg = make_tensordesc_arg
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return module


def _launcher(driver, desc_positions=(0,), metas=("meta0",), scratch=0):
    """A CudaLauncher as 3.6 builds it: `launch` wraps the C launcher in a closure holding the
    descriptor positions and their metadata (or is the C launcher itself without descriptors)."""
    calls = []
    c_launch = type("CLaunch", (), {"__call__": lambda self, *args: calls.append(args)})()  # no closure, as C

    tensordesc_indices, tensordesc_meta, launcher = set(desc_positions), list(metas), c_launch

    def inner(*args):  # never called by RawLauncher: it reads the closure
        return launcher, tensordesc_indices, tensordesc_meta

    cls = type("CudaLauncher", (), {"__module__": driver.__name__})
    obj = cls()
    obj.launch = inner if desc_positions else c_launch
    obj.global_scratch_size = obj.profile_scratch_size = scratch
    obj.launch_cooperative_grid, obj.launch_pdl = False, True
    return obj, calls


def _tma(t):
    return Tma.rows(t, (16, t.shape[-1]), "layout")


def test_a_tma_argument_is_expanded_once_per_address(driver):
    launcher, calls = _launcher(driver)
    raw = RawLauncher.of(launcher, n_args=2)
    x, y = torch.zeros(4, 8), torch.zeros(4, 8)
    for t in (x, x, y, x):
        raw.launch(2, 1, 1, 77, "fn", "packed", (_tma(t), 5), ("BLOCK",))
    # one tensor map per address, made at its first sight; the geometry is the launch key's
    assert [p for p, _ in driver.expanded] == [x.data_ptr(), y.data_ptr()]
    # grid, stream, function, cooperative, PDL, no scratch, the packed metadata, no launch metadata
    # or hooks, then the descriptor as map, shape and strides, the other arguments and the constexprs
    assert calls[0] == (2, 1, 1, 77, "fn", False, True, None, None, "packed", None, None, None,
                        ("map", x.data_ptr(), "meta0"), 4, 8, 8, 1, 5, "BLOCK")
    assert calls[2][13] == ("map", y.data_ptr(), "meta0") and calls[3] == calls[0]


def test_other_descriptors_are_expanded_on_every_call(driver):
    # Triton's own descriptors (the teaching kernels' TMA) hold their tensor: never cached
    launcher, calls = _launcher(driver, metas=(None,))
    raw = RawLauncher.of(launcher, n_args=1)
    x = torch.zeros(4, 8)
    desc = types.SimpleNamespace(base=x, shape=(4, 8), strides=(8, 1))
    for _ in range(3):
        raw.launch(1, 1, 1, 0, "fn", "packed", (desc,), ())
    assert len(driver.expanded) == 3 and len(calls) == 3


def test_the_map_cache_is_bounded(driver):
    launcher, _ = _launcher(driver)
    raw = RawLauncher.of(launcher, n_args=1)
    buf = torch.zeros(direct_launch.MAPS_PER_ARGUMENT + 1, 16)
    for row in buf:  # a new address per launch
        raw.launch(1, 1, 1, 0, "fn", "packed", (Tma.rows(row[None], (1, 16), "layout"),), ())
    assert max(len(m) for m in raw.maps.values()) <= direct_launch.MAPS_PER_ARGUMENT


def test_a_launch_without_descriptors_calls_the_c_launcher_as_it_is(driver):
    launcher, calls = _launcher(driver, desc_positions=(), metas=())
    raw = RawLauncher.of(launcher, n_args=2)
    raw.launch(3, 2, 1, 9, "fn", "packed", (torch.zeros(1), 7), (True,))
    assert calls[0][:13] == (3, 2, 1, 9, "fn", False, True, None, None, "packed", None, None, None)
    assert calls[0][14:] == (7, True) and not driver.expanded


def test_other_launchers_are_called_as_they_are(driver):
    launcher, _ = _launcher(driver)
    launcher.global_scratch_size = 128  # Triton allocates it per launch
    assert RawLauncher.of(launcher, 1) is None
    del driver._BASE_ARGS_FORMAT  # another Triton's driver (3.9 passes the kernel's signature too)
    assert RawLauncher.of(_launcher(driver)[0], 1) is None
    assert RawLauncher.of(lambda *a: None, 1) is None  # a stand-in's run


def test_for_triton_makes_gluon_descriptors_of_the_same_view():
    pytest.importorskip("triton.experimental.gluon", reason="needs Triton's Gluon")
    from triton.experimental.gluon import language as gl

    x = torch.zeros(2, 3, 64, 128, dtype=torch.bfloat16)
    layout = gl.NVMMASharedLayout.get_default_for([64, 128], gl.bfloat16)
    desc, n = direct_launch.for_triton((Tma.rows(x, (64, 128), layout), 5))
    assert n == 5 and desc.base.data_ptr() == x.data_ptr()
    assert list(desc.shape) == [2 * 3 * 64, 128] and list(desc.strides) == [128, 1]
    assert list(desc.block_shape) == [64, 128] and desc.layout == layout
