# ruff: noqa  (shared by the one-off host probes beside it)
"""What the host probes share: the host µs of a call queued back to back (no sync inside the loop),
and a trivial autograd.Function, the floor any Python Function pays on CUDA tensors."""
import time

import torch


def host_us(f, n=300, warmup=30):
    for _ in range(warmup):
        f()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        f()
    us = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return us


class Trivial(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g


def steps(q, k, v, do, causal):
    """(ours, SDPA's, a trivial Function's) eager forward+backward steps on these inputs."""
    import torch.nn.functional as F

    from cs336_systems.attention.fast.function import FlashAttentionFast

    x = torch.randn(8, device=q.device, requires_grad=True)
    gx = torch.randn(8, device=q.device)

    def ours():
        FlashAttentionFast.apply(q, k, v, causal).backward(do)
        q.grad = k.grad = v.grad = None

    def sdpa():
        F.scaled_dot_product_attention(q, k, v, is_causal=causal).backward(do)
        q.grad = k.grad = v.grad = None

    def trivial():
        Trivial.apply(x).backward(gx)
        x.grad = None

    return ours, sdpa, trivial
