"""What a launch asks about its GPU, asked once per device: the answer never changes in a process.

`torch.cuda.get_device_capability(device)` looks the device's properties up on every call (a few
microseconds of host time, asked by several checks of every attention call); `capability` asks it
once per device. The cache is keyed on the function asked as well, so that a stand-in GPU (a test
patching `torch.cuda.get_device_capability`) is asked afresh rather than answered from the real one.
"""

from __future__ import annotations

import functools

import torch


def capability(device) -> tuple[int, int]:
    """(major, minor) compute capability of a CUDA `device` (a torch.device, index or "cuda:N")."""
    return _asked(torch.cuda.get_device_capability, device)


@functools.cache
def _asked(ask, device) -> tuple[int, int]:
    return tuple(ask(device))
