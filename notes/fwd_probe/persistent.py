# ruff: noqa  (a one-off probe, as notes/host_profile's)
"""One-off: the d = 128 Gluon forward with one program per SM looping over the query tiles
(`persistent`) against one program per tile, beside cuDNN's forward, in interleaved rounds
(do_bench medians, ms), at the table's plan for each shape. O and L of both forms must be the same
bits (each tile's arithmetic is the same)."""
import statistics

import torch

from cs336_systems.attention.fast.function import _plan
from cs336_systems.attention.fast.experiments.harness import cudnn_attention
from cs336_systems.attention.fast.gluon.fwd_ws import launch_fwd_ws
from cs336_systems.bench.timing import gpu_bench

SHAPES = [(16, 4096, False), (32, 4096, False), (16, 8192, False), (32, 8192, False), (32, 32768, False),
          (16, 4096, True), (32, 8192, True), (32, 32768, True)]
for heads, n, causal in SHAPES:
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, heads, n, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    gp = _plan("fwd", q, k, causal).gluon
    run = lambda persistent: launch_fwd_ws(q, k, v, causal, gp.block_n, gp.stages, gp.warpgroups,
                                           persistent=persistent)
    (o1, L1), (o0, L0) = run(True), run(False)
    same = torch.equal(o1, o0) and torch.equal(L1, L0)
    cells = {"persistent": lambda: run(True), "per tile": lambda: run(False), "cudnn": lambda: cudnn_attention(q, k, v, causal)}
    times = {name: [] for name in cells}
    for _ in range(3):
        for name, f in cells.items():
            times[name].append(gpu_bench(f, warmup_ms=25, rep_ms=100))
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"1x{heads}x{n}x128 {'causal' if causal else 'full':6s} plan {gp}: same bits {same}; " + "  ".join(
        f"{name} {ms:.3f} ms ({med['cudnn'] / ms:.3f}x cuDNN)" for name, ms in med.items()), flush=True)
