"""Which tests prove which chapter: one pytest marker per chapter, as `pytest -m ddp`.

Each chapter of the site names its marker; `tests/conftest.py` puts the marker on every test whose
file matches the chapter's globs (a file may prove several chapters). The claims tests of a
chapter's page (tests/claims/test_<page>.py) belong to it too.
"""

from __future__ import annotations

from fnmatch import fnmatch

# marker -> (what it proves, test-file globs relative to tests/)
CHAPTERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "profiling": ("Profiling and benchmarking", ("test_benchmark_cli.py", "test_profiling.py",
                                                 "test_phase_timing.py", "test_context_probe.py",
                                                 "test_report_profiling.py", "test_ceilings.py",
                                                 "claims/test_profiling.py", "claims/test_reproducing.py")),
    "mixed_precision": ("Mixed precision", ("test_profiling.py", "test_phase_timing.py",
                                            "claims/test_mixed_precision.py")),
    "memory": ("Memory and gradient checkpointing", ("test_checkpointing.py", "test_sharding_accounting.py", "test_residuals.py",
                                                     "claims/test_memory.py", "claims/test_checkpointing.py")),
    "model": ("The Transformer LM under every chapter", ("test_model.py", "test_model_attention_impls.py")),
    "attention": ("Attention and torch.compile", ("test_model_attention_impls.py", "claims/test_attention.py")),
    "flash": ("FlashAttention-2 in Triton", ("test_flash_*.py", "test_online_softmax.py", "test_weighted_sum.py",
                                             "test_kernel_inputs.py", "test_fwd_ws.py", "test_onepass_ws.py", "test_bwd128_ws.py",
                                             "test_gluon_fallback.py", "test_direct_launch.py",
                                             "test_ab_*.py", "test_reduce_probe.py", "test_report_flash*.py", "test_report_gpu_tests.py",
                                             "test_without_triton.py", "test_attention_op.py", "claims/test_flash.py",
                                             "claims/test_flash_grid.py")),
    "collectives": ("Collectives", ("test_launch.py", "test_distributed_benches.py", "claims/test_collectives.py")),
    "ddp": ("Data-parallel training", ("test_ddp_*.py", "test_bucket*.py", "test_buckets.py", "test_preset_accounting.py",
                                       "test_report_distributed.py", "claims/test_ddp.py")),
    "comm_accounting": ("Communication accounting", ("test_communication_accounting.py",
                                                     "claims/test_communication_accounting.py")),
    "sharding": ("Optimizer state sharding", ("test_sharded_optimizer.py", "test_sharding_*.py", "test_preset_accounting.py",
                                              "claims/test_sharding.py")),
    "fsdp": ("Fully sharded data parallel", ("test_fsdp*.py", "test_adapters_2026.py", "test_preset_accounting.py",
                                             "claims/test_fsdp.py")),
    "parallelism": ("Choosing a parallelism", ("test_parallelism_*.py", "test_tp_ffn.py",
                                               "claims/test_parallelism.py")),
    "training_step": ("The 2026 leaderboard's training step", ("test_training_step*.py", "test_fused_*.py",
                                                               "test_attention_op.py", "test_keep_blocks.py",
                                                               "test_two_gpu_runs.py",
                                                               "claims/test_training_step.py")),
    "results": ("How every number was measured", ("test_store.py", "test_cli_bad_args.py", "test_docs.py",
                                                  "test_snippets.py", "test_imports.py", "test_chapters.py", "test_lint.py", "claims/test_reproducing.py")),
}


def chapters_of(relative_path: str) -> list[str]:
    """The chapter markers of a test file, given its path relative to tests/ (posix)."""
    return [m for m, (_, globs) in CHAPTERS.items() if any(fnmatch(relative_path, g) for g in globs)]
