# ruff: noqa  (a one-off probe, as host_split.py)
"""One-off: is the eager fwd+bwd step at 1 x 16 x 4,096, d = 128 bound by the host, the GPU, or a
synchronisation between them? Per step: the host time of 300 queued steps (the queue fills, so
this is the slower of the two), the host time of 10 queued steps (too few to fill the queue: the
host's own time), the GPU's kernel time (torch.profiler, summed per step, with the kernels listed),
and any synchronising call (torch.cuda.set_sync_debug_mode). Ours beside SDPA."""
import warnings

import torch
from probe_common import host_us, steps
from torch.profiler import ProfilerActivity, profile


for causal in (True, False):
    q, k, v = [torch.randn(1, 16, 4096, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
    do = torch.randn_like(q)
    ours, sdpa, _ = steps(q, k, v, do, causal)
    for name, f in (("ours", ours), ("sdpa", sdpa)):
        full = host_us(f)
        few = min(host_us(f, n=10, warmup=0) for _ in range(5))
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                f()
            torch.cuda.synchronize()
        rows = [(e.key, e.device_time_total / 20, e.count / 20) for e in prof.key_averages() if e.device_time_total > 0]
        gpu = sum(r[1] for r in rows)
        print(f"== {name} causal={causal}: {full:7.1f} us/step queued x300, {few:7.1f} us/step queued x10, "
              f"GPU kernels {gpu:7.1f} us/step", flush=True)
        for key, us, n in sorted(rows, key=lambda r: -r[1])[:8]:
            print(f"   {us:8.1f} us  x{n:.0f}  {key[:90]}")
        torch.cuda.set_sync_debug_mode(1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            f()
        torch.cuda.set_sync_debug_mode(0)
        print(f"   synchronising calls in one step: {len(caught)}", *[str(w.message)[:120] for w in caught[:3]], sep="\n   ")
