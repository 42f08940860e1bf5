# ruff: noqa  (a one-off probe, as notes/host_profile's)
"""One-off: the d = 128 Gluon forward at other (warpgroups, block_n, stages) settings than the
table's plan, at the large size class's shapes (1 x 16 / 1 x 32 heads x 4k .. 32k, both masks;
`huge`: 1 x 32 x 16k / 32k), or (`groups`) at other head groups (`fwd_ws.heads_per_group`), beside cuDNN's forward, in interleaved rounds (do_bench medians, ms). The kernel alone
(`launch_fwd_ws`), so the ratios carry no host latency. Each setting's O is compared with the
table plan's (max |diff|, a sanity check: the key tiles sum in another order)."""
import statistics
import sys

import torch

from cs336_systems.attention.fast.function import _plan
from cs336_systems.attention.fast.experiments.harness import cudnn_attention
from cs336_systems.attention.fast.gluon.fwd_ws import launch_fwd_ws
from cs336_systems.bench.timing import gpu_bench

SETTINGS = [(2, 128, 3), (2, 128, 2), (2, 64, 4), (2, 64, 3), (3, 64, 3), (3, 64, 4), (3, 128, 2)]
SHAPES = [(16, 4096), (32, 4096), (16, 8192), (32, 8192), (16, 16384), (16, 32768)]
MODE = sys.argv[1] if len(sys.argv) > 1 else "large"
if MODE == "huge":
    SHAPES = [(32, 16384), (32, 32768)]
if MODE == "groups":
    SHAPES = [(16, 4096), (32, 4096), (16, 8192)]
if MODE == "groups-long":
    SHAPES = [(16, 16384), (32, 16384), (16, 32768)]
for causal in (False, True):
    for heads, n in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(1, heads, n, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        gp = _plan("fwd", q, k, causal).gluon
        table = (gp.warpgroups, gp.block_n, gp.stages)
        if MODE.startswith("groups"):  # (warpgroups, block_n, stages, group) at the table's settings
            SETTINGS = [table + (g,) for g in ((1, 2, 4, 8, heads) if MODE == "groups" else (1, 2, 3, 4, 8))]
            table = SETTINGS[-1]
        run = lambda s: launch_fwd_ws(q, k, v, causal, s[1], s[2], s[0], group=s[3] if len(s) > 3 else None)
        ref = run(table)[0]
        diff = {s: (run(s)[0].float() - ref.float()).abs().max().item() for s in SETTINGS}
        cells = {s: (lambda s=s: run(s)) for s in SETTINGS} | {"cudnn": lambda: cudnn_attention(q, k, v, causal)}
        times = {name: [] for name in cells}
        for _ in range(3):
            for name, f in cells.items():
                times[name].append(gpu_bench(f, warmup_ms=25, rep_ms=100))
        med = {name: statistics.median(t) for name, t in times.items()}
        best = min(SETTINGS, key=lambda s: med[s])
        print(f"1x{heads}x{n}x128 {'causal' if causal else 'full':6s} table {table} {med[table]:.3f} ms "
              f"({med['cudnn'] / med[table]:.3f}x cuDNN {med['cudnn']:.3f}); best {best} {med[best]:.3f} ms "
              f"({med['cudnn'] / med[best]:.3f}x)", flush=True)
        print("   " + "  ".join(f"{s}: {med[s]:.3f} (diff {diff[s]:.1e})" for s in SETTINGS), flush=True)
