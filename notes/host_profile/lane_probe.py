# ruff: noqa  (a one-off probe, as host_split.py)
"""One-off: the eager lane (fast/eager_lane.py) against the general path in one run, at the grid's
host-bound cells (1 x 16 x 4,096 and 1 x 32 x 4,096, d = 128, both masks): do_bench of the forward
and forward+backward as the grid times them (ours through the general path, ours through the lane,
cuDNN), the host's time per queued step, and when the host reaches each C launch within a step
(µs from the step's start, medians of 200 queued steps). Then what one launch costs on this host:
the bound launch, Triton's C launcher handed tensors or integer pointers, and a kernel with one
argument, each timed alone (the GPU idle before each call; medians of 300)."""
import collections
import statistics
import time

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from probe_common import host_us, steps
from torch.nn.attention import SDPBackend, sdpa_kernel

from cs336_systems.attention.fast import direct_launch, eager_lane, function as fn
from cs336_systems.bench.timing import gpu_bench

MARKS = collections.defaultdict(list)
STEP = [0.0, 0]


def mark(name):
    MARKS[name].append((time.perf_counter() - STEP[0]) * 1e6)


def wrap_c_launches():
    raw_launch = direct_launch.RawLauncher.launch

    def launch(self, *a):
        STEP[1] += 1
        mark(f"C launch {STEP[1]} enter")
        raw_launch(self, *a)
        mark(f"C launch {STEP[1]} exit")
    direct_launch.RawLauncher.launch = launch
    return lambda: setattr(direct_launch.RawLauncher, "launch", raw_launch)


def each_us(f, n=300):
    """Median host µs of one call, the GPU idle before it (no queue to fill)."""
    for _ in range(30):
        f()
    ts = []
    for _ in range(n):
        torch.cuda.synchronize()
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    torch.cuda.synchronize()
    return statistics.median(ts) * 1e6


def general(*a):
    return None


def timeline(ours, label):
    for _ in range(30):
        ours()
    torch.cuda.synchronize()
    MARKS.clear()
    undo = wrap_c_launches()
    ends = []
    for _ in range(200):
        STEP[0], STEP[1] = time.perf_counter(), 0
        ours()
        ends.append((time.perf_counter() - STEP[0]) * 1e6)
    torch.cuda.synchronize()
    undo()
    print(f"   timeline {label}: step {statistics.median(ends):.1f} us;", "  ".join(
        f"{name.replace('C launch ', 'L')} {statistics.median(ts):.0f}"
        for name, ts in sorted(MARKS.items(), key=lambda kv: statistics.median(kv[1]))), flush=True)


lane_for = fn.lane_for
for heads in (16, 32):
    for causal in (True, False):
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = [torch.randn(1, heads, 4096, 128, device="cuda", dtype=torch.bfloat16, generator=g,
                               requires_grad=True) for _ in range(3)]
        do = torch.randn(q.shape, device="cuda", dtype=torch.bfloat16, generator=g)
        print(f"== 1x{heads}x4096x128 causal={causal}: lane {type(lane_for(q, k, v, causal)).__name__}", flush=True)
        ours = lambda: fn.FlashAttentionFast.apply(q, k, v, causal)

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        times = collections.defaultdict(list)
        for rnd in range(3):  # interleaved rounds: the clock moves between them
            for name, f, lane in (("general", ours, general), ("lane", ours, lane_for), ("cudnn", cudnn, lane_for)):
                fn.lane_for = lane
                times[name, "fwd"].append(gpu_bench(f, warmup_ms=50, rep_ms=200))
                times[name, "fwd_bwd"].append(gpu_bench(lambda: f().backward(do), warmup_ms=50, rep_ms=200))
        fn.lane_for = lane_for
        for mode in ("fwd", "fwd_bwd"):
            c = statistics.median(times["cudnn", mode])
            print(f"   {mode:7s} " + "  ".join(f"{n} {statistics.median(times[n, mode]) * 1e3:7.1f} us "
                                              f"({c / statistics.median(times[n, mode]):.2f}x)"
                                              for n in ("general", "lane", "cudnn")), flush=True)
        step, sdpa, trivial = steps(q, k, v, do, causal)
        for name, lane in (("general", general), ("lane", lane_for)):
            fn.lane_for = lane
            print(f"   host {name}: {host_us(step):.1f} us/step queued x300, "
                  f"{min(host_us(step, n=10, warmup=0) for _ in range(5)):.1f} x10", flush=True)
            timeline(step, name)
        fn.lane_for = lane_for
        print(f"   host sdpa {host_us(sdpa):.1f}, trivial Function {host_us(trivial):.1f} us/step", flush=True)


# what one launch costs: the lane's backward launch with its arguments built once
q, k, v, do = [torch.randn(1, 16, 4096, 128, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
lane = eager_lane.lane_for(q, k, v, True)
o, L = lane.forward(q, k, v)
delta = lane.pre.run(o, do)
bwd = lane.bwd
dq, dk, dv, args = bwd.outputs_and_args(q, k, v, do, L, delta)
bwd.run(q, k, v, do, L, delta)
found = next(iter(bwd.direct.compiled.values()))
run, function, metadata, tail, raw = found
stream = torch.cuda.current_stream().cuda_stream
expanded = []
for i, a in enumerate(args):
    expanded += raw._tensor_map(i, a) if i in raw.metas else [a]
ints = [a.data_ptr() if isinstance(a, torch.Tensor) else a for a in expanded]
c = raw.c_launch
base = (bwd.grid[0], bwd.grid[1], 1, stream, function, raw.cooperative, raw.pdl, None, None, metadata, None, None, None)


@triton.jit
def one_arg(x):
    pass


x = torch.zeros(16, device="cuda")
one_arg[(1,)](x)
small = one_arg[(1,)](x)
pieces = {
    "lane backward (pre + bwd launches, allocations, cast)": lambda: lane.backward(q, k, v, o, L, do),
    "bwd.run": lambda: bwd.run(q, k, v, do, L, delta),
    "bwd outputs_and_args": lambda: bwd.outputs_and_args(q, k, v, do, L, delta),
    "bound launch (args built)": lambda: bwd._launch(args),
    "raw.launch (args built)": lambda: raw.launch(*base[:3], stream, function, metadata, args, tail),
    "C launcher, tensors": lambda: c(*base, *expanded, *tail),
    "C launcher, integer pointers": lambda: c(*base, *ints, *tail),
    "one-argument kernel, Triton dispatch": lambda: one_arg[(1,)](x),
    "_device_and_stream": direct_launch._device_and_stream,
    "_hooked": direct_launch._hooked,
    "torch.zeros dQ fp32": lambda: torch.zeros(q.shape, dtype=torch.float32, device=q.device),
    "torch.empty_like x2": lambda: (torch.empty_like(k), torch.empty_like(v)),
    "dq fp32 -> bf16": lambda: dq.to(torch.bfloat16),
}
print("== launch costs, 1x16x4096x128 causal backward, host us of one call (median of 300)")
for name, f in pieces.items():
    print(f"   {each_us(f):8.1f} us  {name}", flush=True)
