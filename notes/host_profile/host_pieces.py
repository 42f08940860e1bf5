# ruff: noqa  (a one-off probe, as host_profile.py)
"""One-off: the host µs of each piece of an eager fwd+bwd of FlashAttentionFast at 1 x 32 x 1,024,
d = 128, causal, beside the floor any Python autograd.Function pays on CUDA tensors (a trivial one)
and SDPA's whole step. No profiler: each piece called 300 times, timed with perf_counter, no sync
inside the loop (what the host spends queuing). Run inside scripts/on_device.sh; prints a table."""
import torch
from probe_common import host_us, steps
from cs336_systems.attention.fast import function as fn
from cs336_systems.attention.fast.launch import launch_bwd, launch_fwd
from cs336_systems.attention.fast.triton_launch import launch_preprocess

Z, H, N, D = 1, 32, 1024, 128
q, k, v = [torch.randn(Z, H, N, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
do = torch.randn_like(q)
qd, kd, vd = (t.detach() for t in (q, k, v))
fwd_plan, bwd_plan = fn._plan("fwd", qd, kd, True), fn._plan("bwd", qd, kd, True)
o, L = launch_fwd(qd, kd, vd, True, fwd_plan)
o32 = o.float()


step, sdpa, trivial = steps(q, k, v, do, True)


pieces = {
    "trivial autograd.Function fwd+bwd (CUDA)": trivial,
    "SDPA (cuDNN) fwd+bwd": sdpa,
    "ours fwd+bwd (FlashAttentionFast.apply)": step,
    "ours forward only, no grad": lambda: fn.FlashAttentionFast.apply(qd, kd, vd, True),
    "checked_inputs": lambda: fn.checked_inputs(qd, kd, vd, True),
    "two plan lookups": lambda: (fn._plan("fwd", qd, kd, True), fn._plan("bwd", qd, kd, True)),
    "launch_fwd (Gluon, direct)": lambda: launch_fwd(qd, kd, vd, True, fwd_plan),
    "launch_preprocess": lambda: launch_preprocess(o, do),
    "launch_bwd (its plan)": lambda: launch_bwd(qd, kd, vd, o, L, do, True, bwd_plan),
    "torch.zeros (dQ fp32)": lambda: torch.zeros((Z, H, N, D), dtype=torch.float32, device="cuda"),
    "torch.empty_like x2": lambda: (torch.empty_like(kd), torch.empty_like(vd)),
    "fp32 -> bf16 .to": lambda: o32.to(torch.bfloat16),
}
print(f"bwd plan: {bwd_plan}")
for name, f in pieces.items():
    print(f"{name:45s} {host_us(f):8.1f} us", flush=True)
