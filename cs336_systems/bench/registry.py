"""Every benchmark the project can run, by the name `just bench NAME` takes.

Each entry names a module with a `main(argv: list[str] | None) -> int` function (argparse inside).
`gpu` marks the ones `just bench-all` runs on a GPU node, in this order; `bench_all_args` are the
arguments it adds (`--allow-oom` where the site shows cells that run out of the H200's memory);
`timed` names the results files whose rows time its cells, each with the fields that identify a
cell, from which `just bench-all` estimates how long the benchmark takes (bench_all.py).
"""

from __future__ import annotations

from dataclasses import dataclass

OOM_CELLS = ("--allow-oom",)  # the site's tables hold cells that do not fit: measure their OOM


@dataclass(frozen=True)
class Benchmark:
    module: str
    about: str
    gpu: bool = True
    timed: tuple[tuple[str, tuple[str, ...]], ...] = ()
    bench_all_args: tuple[str, ...] = ()


BENCHMARKS: dict[str, Benchmark] = {
    # The machine's ceilings (matmul rate, copy bandwidth): every "% of peak" on the site uses them
    "ceilings": Benchmark("cs336_systems.bench.ceilings", "dense matmul TFLOP/s per dtype and copy TB/s",
                          timed=(("ceilings", ("op", "dtype", "n")),)),
    # Part 1: profiling, mixed precision, memory (docs/profiling.md, mixed-precision.md, memory.md)
    "model": Benchmark("cs336_systems.profiling.benchmark",
                       "one end-to-end run of the LM: --size, --mode, --dtype, --compile, ...", gpu=False),
    "end-to-end": Benchmark("cs336_systems.profiling.sweeps", "5 sizes x fwd/fwd+bwd/train, warm-up study, fp32 vs bf16, compiled",
                            timed=(("end-to-end/timings", ("size", "context", "mode", "dtype", "warmup", "steps")),
                                   ("end-to-end/warmup", ("size", "context", "mode", "dtype")),
                                   ("end-to-end/compile", ("size", "context", "mode", "dtype", "compile")),
                                   ("end-to-end/phases", ("size", "context", "mode", "dtype", "warmup", "steps")))),
    "kernels": Benchmark("cs336_systems.profiling.kernel_sweep", "torch.profiler kernel tables, 5 sizes x 4 contexts",
                         timed=(("profiling/kernel_cells", ("size", "context", "mode", "dtype")),)),
    "memory": Benchmark("cs336_systems.profiling.memory_sweep", "2.7B memory peaks and timelines",
                        timed=(("memory/peaks", ("size", "context", "mode", "dtype")),), bench_all_args=OOM_CELLS),
    "checkpointing": Benchmark("cs336_systems.profiling.checkpoint_bench",
                               "xl peak memory and step time per checkpoint block size k, and inside a block",
                               timed=(("memory/checkpointing", ("size", "context", "batch", "mode", "dtype", "attention",
                                                                "checkpoint_every", "warmup", "steps")),),
                               bench_all_args=OOM_CELLS),
    "accumulation": Benchmark("cs336_systems.profiling.mixed_precision", "the four accumulation loops and the autocast dtype table", gpu=False),
    # Attention (docs/attention.md, docs/flash-attention.md)
    "attention": Benchmark("cs336_systems.attention.benchmarks.pytorch_sweep", "naive attention sweep, eager vs torch.compile",
                           timed=(("attention/pytorch_attention", ("impl", "batch", "d", "seq")),), bench_all_args=OOM_CELLS),
    "attention-oom": Benchmark("cs336_systems.profiling.attention_oom",
                               "the allocator checks of the seq 32768 OOM (reserved peak, max_split_size_mb)",
                               timed=(("attention/oom_checks", ("batch", "d", "seq", "alloc_conf")),)),
    "flash-leaderboard": Benchmark("cs336_systems.attention.benchmarks.leaderboard", "leaderboard case: ours vs cuDNN/flash/flex/naive",
                                   timed=(("attention/flash_leaderboard", ("impl", "mode")),)),
    "flash-sweep": Benchmark("cs336_systems.attention.benchmarks.flash_sweep", "flash_benchmarking grid, ours vs PyTorch",
                             timed=(("attention/flash_sweep", ("impl", "dtype", "d", "seq", "mode")),)),
    "flash-grid": Benchmark("cs336_systems.attention.benchmarks.grid_sweep",
                            "bf16, d 64/128, causal or not, seq 1k-32k: ours vs cuDNN, SDPA-flash, flex",
                            timed=(("attention/flash_grid", ("batch", "heads", "seq", "d", "causal", "impl", "mode")),)),
    "flash-host": Benchmark("cs336_systems.attention.benchmarks.host_overhead", "host time per attention call, GPU kept busy",
                            timed=(("attention/host_overhead", ("piece", "batch", "seq", "d", "calls")),)),
    # The speed work's tuner and A/B experiments (docs/flash-attention/faster-than-cudnn.md): each needs
    # a GPU and arguments of its own, so `just bench-all` leaves them out (gpu=False)
    "flash-tune": Benchmark("cs336_systems.attention.fast.tuning.tune",
                            "(GPU) time launch plans per shape (tune), regenerate the table (write-table)", gpu=False),
    "flash-ab-dkdv": Benchmark("cs336_systems.attention.fast.experiments.ab_dkdv",
                               "(GPU) versions of the dK/dV kernel, timed round-robin", gpu=False),
    "flash-ab-onepass": Benchmark("cs336_systems.attention.fast.experiments.ab_onepass",
                                  "(GPU) ablations of the one-pass backward, timed round-robin", gpu=False),
    "flash-reduce-probe": Benchmark("cs336_systems.attention.fast.experiments.reduce_probe",
                                    "(GPU) the one-pass backward's dQ adds alone: atomics vs TMA vs stores", gpu=False),
    "flash-onepass-ws": Benchmark("cs336_systems.attention.fast.experiments.ab_onepass_ws",
                                  "(GPU) the Gluon backward's variants and ablations beside the tuned Triton one", gpu=False),
    "flash-ab-bwd128": Benchmark("cs336_systems.attention.fast.experiments.ab_bwd128",
                                 "(GPU) versions and ablations of the d = 128 Gluon backward, timed round-robin", gpu=False),
    "flash-d128-probe": Benchmark("cs336_systems.attention.fast.experiments.d128_probe",
                                  "(GPU) head dim 128: the Gluon forward's settings and the table's kernels vs cuDNN", gpu=False),
    # Distributed (docs/collectives.md, ddp.md, sharding.md)
    "collectives": Benchmark("cs336_systems.distributed.collectives_bench", "all-reduce sizes x backends x world sizes", gpu=False),
    "ddp": Benchmark("cs336_systems.distributed.ddp_bench", "the DDP stages vs torch DDP", gpu=False),
    "sharding": Benchmark("cs336_systems.sharding.sharding_bench", "sharded optimizers: memory and time", gpu=False),
    "fsdp": Benchmark("cs336_systems.distributed.fsdp_bench", "DDP, sharded optimizer, ZeRO-1, our FSDP, FSDP2: time and memory", gpu=False),
    "tp-ffn": Benchmark("cs336_systems.parallelism.tp_bench", "tensor-parallel SwiGLU vs unsharded, and its all-reduce alone (2 GPUs)", gpu=False),
    # The 2026 leaderboard's training step (cs336_systems/training_step/): its two fused pieces run on
    # one GPU at the step's shapes by default; the step itself takes arguments per machine (the GPUs
    # it has, the variants to compare), so `just bench-all` leaves it out
    "fused-ce": Benchmark("cs336_systems.training_step.ce_bench",
                          "fused LM head + cross-entropy vs PyTorch: time and peak memory",
                          timed=(("training_step/fused_ce", ("impl", "positions", "vocab", "d_model", "dtype", "chunk_size")),)),
    "fused-adamw": Benchmark("cs336_systems.training_step.adamw_bench",
                             "one AdamW step: ours vs torch fused/foreach",
                             timed=(("training_step/fused_adamw", ("impl", "size", "dtype", "shard")),)),
    "training-step": Benchmark("cs336_systems.training_step.bench",
                               "the 2026 leaderboard: one 8B training step, ours vs stock PyTorch", gpu=False),
}
