"""The one chapter map: each chapter's pages, the tests that prove it, its benchmarks and results.

Three readers: `tests/conftest.py` puts a chapter's marker on every test whose file matches the
chapter's globs (`pytest -m ddp`; a file may prove several chapters), the claims test marks each
claim with the chapter of the page that uses it, and the home page renders the map
(snippets/chapter_map.py). `tests/test_chapters.py` checks that every glob matches a file and that
every test file, results folder and page of the site has a chapter.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatch


@dataclass(frozen=True)
class Chapter:
    marker: str  # `pytest -m marker`
    title: str
    pages: tuple[str, ...]  # under docs/; the first is the chapter's own (none: no page of its own)
    tests: tuple[str, ...]  # test-file globs under tests/
    benches: tuple[str, ...] = ()  # `just bench NAME` (cs336_systems/bench/registry.py)
    modules: tuple[str, ...] = ()  # under cs336_systems/, dotted, besides the ones its pages include
    results: tuple[str, ...] = ()  # bench globs under results/


# Results folders whose pages already say "not yet measured" (with a claim that turns false when
# rows arrive): their globs may match no file until the run is made.
NOT_YET_MEASURED: tuple[str, ...] = ()

CHAPTERS = (
    Chapter("profiling", "Profiling and benchmarking", ("profiling.md", "profiling/double-count.md"),
            ("test_benchmark_cli.py", "test_profiling.py", "test_report_profiling.py", "test_ceilings.py",
             "test_phase_timing.py", "test_context_probe.py"),
            ("model", "end-to-end", "kernels"),
            ("profiling.benchmark", "profiling.steps", "profiling.nvtx", "profiling.torch_profile", "profiling.sweeps",
             "profiling.kernel_sweep", "profiling.kernel_attribution", "profiling.clocks", "bench.timing"),
            ("end-to-end/warmup", "end-to-end/timings", "end-to-end/phases", "profiling/*")),
    Chapter("mixed_precision", "Mixed precision",
            ("mixed-precision.md", "mixed-precision/bf16-timings.md", "labs/accumulation.py"),
            ("test_profiling.py", "test_phase_timing.py"), ("accumulation", "end-to-end"), ("profiling.mixed_precision", "profiling.sweeps"),
            ("mixed-precision/*", "end-to-end/timings", "end-to-end/phases")),
    Chapter("memory", "Memory and gradient checkpointing", ("memory.md", "memory/checkpointing.md", "memory/runs.md"),
            ("test_checkpointing.py", "test_sharding_accounting.py", "test_residuals.py"),
            ("memory", "checkpointing"), ("profiling.memory", "profiling.memory_sweep", "profiling.checkpoint_theory"),
            ("memory/*",)),
    Chapter("model", "The Transformer LM under every chapter", (), ("test_model.py", "test_model_attention_impls.py"),
            modules=("model.transformer", "model.config")),
    Chapter("attention", "Attention and torch.compile", ("attention.md", "attention/runs.md"),
            ("test_model_attention_impls.py",), ("attention", "attention-oom"),
            ("attention.reference", "attention.benchmarks.pytorch_sweep", "model.attention", "profiling.attention_oom"),
            ("attention/pytorch_attention", "attention/oom_checks", "end-to-end/compile")),
    Chapter("flash", "FlashAttention-2 in Triton",
            ("flash-attention.md", "flash-attention/faster-than-cudnn.md", "flash-attention/grid.md",
             "flash-attention/history.md"),
            ("test_flash_*.py", "test_online_softmax.py", "test_weighted_sum.py", "test_kernel_inputs.py",
             "test_fwd_ws.py", "test_onepass_ws.py", "test_bwd128_ws.py", "test_gluon_fallback.py",
             "test_attention_op.py", "test_direct_launch*.py", "test_ab_*.py", "test_reduce_probe.py",
             "test_fast_triton_launch.py", "test_fast_host_caches.py", "test_eager_lane.py", "test_compile_report.py",
             "test_device_facts.py", "test_report_flash*.py", "test_report_gpu_tests.py", "test_without_triton.py",
             "claims/test_code.py"),
            ("flash-sweep", "flash-leaderboard", "flash-host", "flash-d128-probe", "flash-ab-bwd128"),
            ("attention.weighted_sum", "attention.online_softmax", "attention.flash_pytorch", "attention.flash_triton",
             "attention.flash_fwd_kernel", "attention.flash_bwd_kernel", "attention.tile_io", "attention.flash_launch",
             "attention.tiles", "attention.api", "attention.benchmarks.flash_sweep", "attention.benchmarks.leaderboard",
             "attention.fast.function", "attention.fast.table", "attention.fast.tuning.tune",
             "attention.fast.experiments.ab_dkdv", "attention.fast.experiments.ab_onepass",
             "attention.fast.flash_bwd_onepass_kernel", "attention.fast.experiments.reduce_probe",
             "attention.fast.gluon.flash_bwd_ws_kernel", "attention.fast.gluon.onepass_ws", "attention.fast.direct_launch"),
            ("attention/flash_*", "attention/dkdv_ab", "attention/onepass_*", "attention/reduce_probe",
             "attention/host_overhead", "attention/ab_*", "attention/d128_probe")),
    Chapter("collectives", "Collectives", ("collectives.md",), ("test_launch.py", "test_distributed_benches.py"),
            ("collectives",), ("distributed.collectives_bench", "distributed.launch"), ("collectives/*",)),
    Chapter("ddp", "Data-parallel training", ("ddp.md", "ddp/runs.md"),
            ("test_ddp_*.py", "test_bucket*.py", "test_report_distributed.py", "test_preset_accounting.py"), ("ddp",),
            ("distributed.ddp", "distributed.ddp.naive", "distributed.ddp.flat", "distributed.ddp.overlap",
             "distributed.ddp.buckets", "distributed.ddp.bucketed", "distributed.step_trace"), ("ddp/*",)),
    Chapter("comm_accounting", "Communication accounting", ("communication-accounting.md",),
            ("test_communication_accounting.py",), (), ("sharding.communication_accounting",)),
    Chapter("sharding", "Optimizer state sharding", ("sharding.md", "sharding/runs.md"),
            ("test_sharded_optimizer.py", "test_sharding_*.py", "test_preset_accounting.py"), ("sharding",),
            ("sharding.sharded_optimizer", "sharding.zero1", "sharding.accounting", "sharding.sharding_bench"),
            ("sharding/*",)),
    Chapter("fsdp", "Fully sharded data parallel", ("fsdp.md", "fsdp/runs.md"),
            ("test_fsdp*.py", "test_adapters_2026.py", "test_preset_accounting.py", "claims/test_code.py"),
            ("fsdp",), ("distributed.fsdp.shard_layout", "distributed.fsdp.layers", "distributed.fsdp.comm", "distributed.fsdp.fsdp",
             "distributed.fsdp.gather"), ("fsdp/*",)),
    Chapter("parallelism", "Choosing a parallelism", ("parallelism.md", "parallelism/runs.md"), ("test_parallelism_*.py", "test_tp_ffn.py"),
            ("tp-ffn",), ("parallelism.ring", "parallelism.costs", "parallelism.answers", "parallelism.tp_ffn"),
            ("parallelism/*",)),
    Chapter("training_step", "The 2026 leaderboard: an 8B training step", ("training-step.md", "training-step/runs.md"),
            ("test_training_step*.py", "test_fused_*.py", "test_attention_op.py", "test_keep_blocks.py",
             "test_two_gpu_runs.py"), ("training-step", "fused-ce", "fused-adamw"),
            ("training_step.arithmetic", "training_step.memory_budget", "training_step.fused_ce",
             "training_step.fused_adamw", "training_step.variants", "training_step.rows", "training_step.bench",
             "training_step.run_variants"),
            ("training-step", "training-step-profile", "training_step/*")),
    Chapter("results", "How every number was measured", ("reproducing.md", "index.md"),
            ("test_store.py", "test_cli_bad_args.py", "test_docs.py", "test_snippets.py", "test_imports.py",
             "test_chapters.py", "test_lint.py", "claims/test_claims.py"),
            ("ceilings",), ("bench.store", "bench.provenance", "bench.registry", "bench.ceilings"), ("ceilings",)),
)


def chapters_of(relative_path: str) -> list[str]:
    """The chapter markers of a test file, given its path relative to tests/ (posix)."""
    return [c.marker for c in CHAPTERS if any(fnmatch(relative_path, g) for g in c.tests)]


def chapter_of_page(page: str) -> Chapter:
    """The chapter a page (relative to docs/) belongs to."""
    hit = [c for c in CHAPTERS if page in c.pages]
    if len(hit) != 1:
        raise KeyError(f"docs/{page} belongs to {len(hit)} chapters in tests/chapters.py (want one)")
    return hit[0]
