"""Choosing a parallelism: the handout's arithmetic for DP, FSDP, TP and FSDP+TP on one SwiGLU
FFN (costs.py, answers.py), the ring collectives simulated byte by byte (ring.py), named hardware
numbers (hardware.py), and a tensor-parallel FFN that runs (tp_ffn.py, tp_bench.py)."""
