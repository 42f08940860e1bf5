"""The speed work beside the teaching path: measured launch plans and faster kernels.

    plans.py, table.py, tuned_configs.py   what to launch per shape, and the measured table (data)
    tuned.py                               the table's plan for an input, built once per key
    launch.py, function.py                 run a plan; `FlashAttentionFast`, the tuned autograd Function
    eager_lane.py                          an eager call's Gluon launches prepared once per kind of input
    triton_launch.py, direct_launch.py     the teaching kernels launched without Triton's per-call dispatch
    op.py                                  the same kernels as a torch.library custom op (what the
                                           training step runs: compile and checkpoint policies see it)
    flash_bwd_onepass_kernel.py            the one-pass backward (dQ by fp32 atomics or TMA reductions)
    gluon/                                 the warp-specialised kernels in Gluon and their launchers
    tuning/                                the tuner that writes the table, and the offline compile report
    experiments/                           the A/B experiments behind the design choices

It imports the teaching kernels and launchers; the teaching path never imports it. Importing this
package imports no Triton: `FlashAttentionFast` loads on first access.
"""


def __getattr__(name: str):
    if name == "FlashAttentionFast":
        from .function import FlashAttentionFast

        return FlashAttentionFast
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["FlashAttentionFast"]
