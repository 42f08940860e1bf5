"""Suite-wide test setup."""

from __future__ import annotations

import os

import torch

# -- Triton interpreter on CPU-only machines ----------------------------------------------------
# Triton decides at *import* time whether @triton.jit functions (its own tl.sum / tl.max among them)
# are compiled or interpreted, so TRITON_INTERPRET must be set before anything imports triton.
# On a machine without a GPU we set it here, first thing, and the Triton tests run their kernels on
# the CPU (fp32); with a GPU nothing changes and the same tests run the compiled kernels.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
