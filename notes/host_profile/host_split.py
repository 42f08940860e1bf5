# ruff: noqa  (a one-off probe, as host_profile.py)
"""One-off: where the host time of an eager fwd+bwd of FlashAttentionFast goes, without a profiler's
distortion: each piece of the real call path wrapped by a perf_counter timer (inclusive µs per
step), the step itself timed plain, beside SDPA and a trivial autograd.Function. Shapes: the grid's
1 x 16 x 4,096, d = 128, causal (Gluon both ways) and 1 x 32 x 1,024 (Triton backward). Prints a table."""
import collections
import functools
import threading
import time

import torch
from probe_common import host_us, steps

from cs336_systems.attention.fast import direct_launch, function as fn, launch
from cs336_systems.attention.fast.gluon import bwd128_ws, fwd_ws

TOTAL = collections.defaultdict(float)
COUNT = collections.Counter()
THREADS = collections.Counter()


def timed(name, f):
    @functools.wraps(f)
    def wrapper(*a, **kw):
        t = time.perf_counter()
        try:
            return f(*a, **kw)
        finally:
            TOTAL[name] += time.perf_counter() - t
            COUNT[name] += 1
            THREADS[(name, threading.current_thread() is threading.main_thread())] += 1
    return wrapper


def patch(obj, attr, name=None, static=False):
    f = getattr(obj, attr)
    w = timed(name or attr, f)
    setattr(obj, attr, staticmethod(w) if static else w)




for Z, H, N, causal in ((1, 16, 4096, True), (1, 32, 1024, True)):
    q, k, v = [torch.randn(Z, H, N, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
    do = torch.randn_like(q)
    ours, sdpa, trivial = steps(q, k, v, do, causal)

    def ours_fwd_graph():
        fn.FlashAttentionFast.apply(q, k, v, causal)

    print(f"== {Z}x{H}x{N}x128 causal={causal}: plans {fn._plan('fwd', q, k, causal)} / {fn._plan('bwd', q, k, causal)}")
    for name, f in (("trivial Function fwd+bwd", trivial), ("SDPA fwd+bwd", sdpa), ("ours fwd+bwd", ours),
                    ("ours forward (graph kept)", ours_fwd_graph)):
        print(f"{name:40s} {host_us(f):8.1f} us/step (plain)", flush=True)

pieces = [
    (fn.FlashAttentionFast, "forward", "Function.forward", True),
    (fn.FlashAttentionFast, "backward", "Function.backward", True),
    (fn, "checked_inputs", None, False), (fn, "_plan", None, False), (fn, "save_attention_state", None, False),
    (fn, "load_attention_state", None, False), (fn, "launch_fwd", None, False), (fn, "launch_bwd", None, False),
    (launch, "_gluon_inputs", None, False), (launch, "_verdict", None, False), (launch, "launch_gluon_bwd", None, False),
    (launch, "launch_preprocess", None, False), (launch, "launch_triton_bwd", None, False),
    (launch, "launch_triton_fwd", None, False), (fwd_ws, "launch_fwd_ws", None, False),
    (bwd128_ws, "launch_bwd128_ws", None, False), (bwd128_ws, "_descriptors", "bwd128 _descriptors", False),
    (bwd128_ws, "bwd128_supported", None, False), (fwd_ws, "fwd_ws_supported", None, False),
    (fwd_ws, "heads_per_group", None, False),
    (direct_launch.DirectKernel, "launch", "DirectKernel.launch", False),
    (direct_launch.RawLauncher, "launch", "RawLauncher.launch", False),
    (direct_launch.RawLauncher, "_tensor_map", "RawLauncher._tensor_map", False),
    (direct_launch.Tma, "rows", "Tma.rows", False),
    (direct_launch, "_device_and_stream", None, False), (direct_launch, "_hooked", None, False),
    (fwd_ws, "_launch_spec", "fwd _launch_spec", False), (bwd128_ws, "_launch_spec", "bwd128 _launch_spec", False),
    (torch, "empty_like", "torch.empty_like", False), (torch, "empty", "torch.empty", False),
    (torch, "zeros", "torch.zeros", False),
]
# inside the compiled launcher (Triton 3.6's names): where DirectKernel.launch's time goes
try:
    import triton
    import triton.backends.nvidia.driver as nvd

    pieces += [(nvd, "make_tensordesc_arg", "triton make_tensordesc_arg", False),
               (nvd.CudaLauncher, "__call__", "triton CudaLauncher.__call__", False)]
    utils = triton.runtime.driver.active.utils
    utils.fill_tma_descriptor = timed("triton fill_tma_descriptor", utils.fill_tma_descriptor)
except Exception as e:
    print("no launcher patches:", e)
for obj, attr, name, static in pieces:
    patch(obj, attr, name, static)
_real_from_tensor = None
try:
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    _real_from_tensor = TensorDescriptor.from_tensor
    TensorDescriptor.from_tensor = staticmethod(timed("TensorDescriptor.from_tensor", _real_from_tensor))
except Exception as e:
    print("no TensorDescriptor patch:", e)

for Z, H, N, causal in ((1, 16, 4096, True), (1, 32, 1024, True)):
    q, k, v = [torch.randn(Z, H, N, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
    do = torch.randn_like(q)
    ours = steps(q, k, v, do, causal)[0]
    for _ in range(30):
        ours()
    torch.cuda.synchronize()
    TOTAL.clear(); COUNT.clear(); THREADS.clear()
    n = 300
    t = time.perf_counter()
    for _ in range(n):
        ours()
    step = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    print(f"== wrapped, {Z}x{H}x{N}x128 causal={causal}: {step:.1f} us/step with the timers")
    for name in sorted(TOTAL, key=TOTAL.get, reverse=True):
        print(f"  {name:32s} {TOTAL[name] / n * 1e6:8.1f} us/step  ({COUNT[name] / n:.0f} calls/step)")
    print("  pieces run off the main thread (calls):", {k[0]: v for k, v in THREADS.items() if not k[1]} or "all on the main thread")
