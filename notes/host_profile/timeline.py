# ruff: noqa  (a one-off probe, as host_split.py)
"""One-off: when, within an eager fwd+bwd step of FlashAttentionFast, the host reaches each point
(the Function's forward and backward, each kernel launch), in µs from the step's start, medians
over 200 queued steps at 1 x 16 x 4,096, d = 128. do_bench's number at a host-bound cell is about
the host's time to the backward kernel's launch plus that kernel: this says where that time goes."""
import collections
import statistics
import time

import torch
from probe_common import steps

from cs336_systems.attention.fast import direct_launch, function as fn

MARKS = collections.defaultdict(list)
STEP = [0.0]


def mark(name):
    MARKS[name].append((time.perf_counter() - STEP[0]) * 1e6)


def around(obj, attr, label, static=False):
    f = getattr(obj, attr)

    def wrapper(*a, **kw):
        mark(label(a) + " enter")
        try:
            return f(*a, **kw)
        finally:
            mark(label(a) + " exit")
    setattr(obj, attr, staticmethod(wrapper) if static else wrapper)


around(fn.FlashAttentionFast, "forward", lambda a: "Function.forward", static=True)
around(fn.FlashAttentionFast, "backward", lambda a: "Function.backward", static=True)
around(direct_launch.DirectKernel, "launch", lambda a: "launch " + getattr(a[0].kernel, "__name__", "?"))

for causal in (True, False):
    q, k, v = [torch.randn(1, 16, 4096, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
    do = torch.randn_like(q)
    ours = steps(q, k, v, do, causal)[0]
    for _ in range(30):
        ours()
    torch.cuda.synchronize()
    MARKS.clear()
    ends = []
    for _ in range(200):
        STEP[0] = time.perf_counter()
        ours()
        ends.append((time.perf_counter() - STEP[0]) * 1e6)
    torch.cuda.synchronize()
    print(f"== 1x16x4096x128 causal={causal}: step {statistics.median(ends):.1f} us (median of 200, queued)")
    for name, ts in sorted(MARKS.items(), key=lambda kv: statistics.median(kv[1])):
        print(f"  {statistics.median(ts):8.1f} us  {name}  (x{len(ts) / 200:.0f} a step)")
