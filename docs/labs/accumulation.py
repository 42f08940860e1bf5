# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lab: accumulating in low precision
#
# Problem `mixed_precision_accumulation`, run live: the site build executes this notebook on the
# CPU (in about a second), so every number below was computed when the page was built, by the same
# package code that `just bench accumulation` runs on the GPU (see the
# [Mixed precision](../../mixed-precision/) chapter for the GPU rows and the discussion).
#
# Four loops add 0.01 to a running sum one thousand times; they differ only in the dtype of the
# accumulator and of the addend. The exact answer is 10.

# %%
import torch

from cs336_systems.profiling.mixed_precision import ADDEND, LOOPS, N_ADDS, accumulate, binade_walk

for name, (acc, add, cast) in LOOPS.items():
    s = float(accumulate(acc, add, cast))
    print(f"{name:26s} {s!r:22s} error {s - N_ADDS * ADDEND:+.6f}")

# %% [markdown]
# Every fp16 number is a multiple of its binade's ulp (the gap to the next representable number),
# so 0.01 itself is stored rounded, and each partial sum is rounded again to the grid of the binade
# it lands in:

# %%
def ulp(x: torch.Tensor) -> float:
    return (torch.nextafter(x, torch.tensor(float("inf"), dtype=x.dtype)) - x).item()


step16 = torch.tensor(ADDEND, dtype=torch.float16)
print(f"0.01 stored in fp16: {step16.item()!r}")
for v in (1.0, 4.0, 8.0, 10.0):
    print(f"ulp at {v:>4}: fp16 {ulp(torch.tensor(v, dtype=torch.float16)):.7f}   fp32 {ulp(torch.tensor(v)):.2e}")

# %% [markdown]
# The fp16 loop, binade by binade: how many of the thousand adds happened there and what one add
# really added. In [4, 8) each add rounds up (too much), in [8, 16) it rounds down to a single
# ulp (too little); the roundings are the same at every step of a binade, so they do not cancel.

# %%
for row in binade_walk():
    ulp_text = "-" if row["ulp"] is None else f"{row['ulp']:.7f}"
    print(f"{row['binade']:>22s}  ulp {ulp_text:>10s}  adds {row['adds']:4d}  added per add {row['added_per_add']:.7f}")

# %% [markdown]
# Keep adding in fp16 and the sum stops moving altogether: once half an ulp exceeds the addend,
# round-to-nearest returns the old sum.

# %%
s = torch.tensor(0, dtype=torch.float16)
for i in range(100 * N_ADDS):
    new = s + step16
    if new == s:
        print(f"the fp16 sum stops at {s.item()} after {i} additions (ulp there: {ulp(s)}, half of it > 0.01)")
        break
    s = new
