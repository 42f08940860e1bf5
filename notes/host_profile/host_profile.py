# ruff: noqa  (kept as call 30 ran it, one-off style)
"""One-off: where an eager fwd+bwd of FlashAttentionFast spends host time (cProfile), beside SDPA."""
import cProfile, io, os, pstats, time
import torch
import torch.nn.functional as F
from cs336_systems.attention.fast.function import FlashAttentionFast
out = os.environ["OUT"]
for d in (128, 64):
    q, k, v = [torch.randn(1, 32, 1024, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
    do = torch.randn_like(q)
    def ours():
        FlashAttentionFast.apply(q, k, v, True).backward(do)
    def sdpa():
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(do)
    for name, fn in (("ours", ours), ("sdpa", sdpa)):
        for _ in range(30): fn()
        torch.cuda.synchronize()
        for rep in range(2):
            t = time.perf_counter()
            for _ in range(200): fn()
            host = (time.perf_counter() - t) / 200 * 1e6
            torch.cuda.synchronize()
            wall = (time.perf_counter() - t) / 200 * 1e6
            print(f"d={d} {name}: host {host:.0f} us/call, wall {wall:.0f} us/call", flush=True)
    pr = cProfile.Profile(); pr.enable()
    for _ in range(200): ours()
    pr.disable(); torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(45)
    pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(70)
    open(f"{out}/host_profile_d{d}.txt", "w").write(s.getvalue())
