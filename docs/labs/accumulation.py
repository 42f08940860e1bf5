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
# Problem `mixed_precision_accumulation`. This page is a notebook that the site build executes
# (on CPU, in seconds), so every number below was computed when the site was built.
#
# Four loops add 0.01 to a running sum one thousand times; they differ only in the dtype of the
# accumulator and of the addend. The exact answer is 10.

# %%
import torch

N, STEP = 1000, 0.01


def accumulate(acc_dtype: torch.dtype, addend_dtype: torch.dtype, cast: bool = False) -> float:
    """Sum STEP N times with an accumulator of acc_dtype and addends of addend_dtype."""
    s = torch.tensor(0, dtype=acc_dtype)
    for _ in range(N):
        x = torch.tensor(STEP, dtype=addend_dtype)
        s += x.type(torch.float32) if cast else x
    return s.item()


loops = {
    "fp32 accumulator, fp32 addend": accumulate(torch.float32, torch.float32),
    "fp16 accumulator, fp16 addend": accumulate(torch.float16, torch.float16),
    "fp32 accumulator, fp16 addend": accumulate(torch.float32, torch.float16),
    "fp32 accumulator, fp16 addend cast to fp32": accumulate(torch.float32, torch.float16, cast=True),
}
for name, value in loops.items():
    print(f"{name:45s} {value:.6f}   error {value - N * STEP:+.6f}")

# %% [markdown]
# Where the fp16 error comes from, read off the dtype itself: 0.01 is not representable, so every
# addend is already rounded, and the spacing between neighbouring fp16 numbers (one ulp) near the
# final sum bounds how much each addition can be rounded again.

# %%
def ulp(x: torch.Tensor) -> float:
    return (torch.nextafter(x, torch.tensor(float("inf"), dtype=x.dtype)) - x).item()


step16 = torch.tensor(STEP, dtype=torch.float16)
print(f"0.01 stored in fp16: {step16.item():.10f}")
print(f"fp16 ulp at 10: {ulp(torch.tensor(10.0, dtype=torch.float16))}; fp32 ulp at 10: "
      f"{ulp(torch.tensor(10.0))}")

# %% [markdown]
# Keep adding in fp16 and the sum eventually stops moving: once half an ulp exceeds the addend,
# round-to-nearest returns the old sum.

# %%
s = torch.tensor(0, dtype=torch.float16)
for i in range(100 * N):
    new = s + step16
    if new == s:
        print(f"the fp16 sum stops at {s.item()} after {i} additions (ulp there: {ulp(s)})")
        break
    s = new
