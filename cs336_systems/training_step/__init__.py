"""The 2026 leaderboard's full training step: the 8B model, batch 2 x context 32,768, bf16, one
step (forward, loss, backward, AdamW) timed by triton.testing.do_bench; ours against stock PyTorch.

    arithmetic.py       parameters, model FLOPs, MFU (the H200's datasheet peak), by formula
    memory_budget.py    bytes per GPU by formula: refuses what cannot fit before anything starts
    heads.py            the LM head and the loss as one module: full logits, chunked, fused
    lm_loss.py          the LM and its loss as one module (the plain model; the head swapped in,
                        per-block activation checkpointing)
    train_step.py       TrainingStep (what do_bench times), the seeded weights and batch
    checkpoint_plan.py  per block none / selective / full: the --checkpoint plan's syntax
    selective.py        running each block under its mode: the selective policy (the attention
                        op's outputs, chosen matmul outputs), inside the compiled region
    plan_search.py      the plans --sweep tries for a memory, from the memory arithmetic
    sharding.py         none, torch DDP, FSDP2, our FSDP
    local_shards.py     an optimizer of plain tensors on FSDP2's local shards
    variants.py         plain, stock, ours: what each turns on, and building one on a rank
    timing.py           do_bench on one GPU; its procedure with counts agreed over ranks on several
    bench.py            `just bench training-step`: the CLI, one row per variant and plan
    run_variants.py     running them on a rank (build, first step, time or profile, write the row)
    annotate.py         named ranges in the step (record_function and NVTX) for the profile
    breakdown.py        a profiled step's kernel time by category (matmul, attention, ..., idle)
    step_profile.py     --profile: one step under torch.profiler, its breakdown as rows

    fused_ce.py         fused_linear_cross_entropy: LM head + cross-entropy, chunked, Triton
    fused_adamw.py      FusedAdamW: torch.optim.AdamW's step in one Triton kernel per tensor
    ce_bench.py, adamw_bench.py    `just bench fused-ce`, `just bench fused-adamw`

Importing the package imports no submodule (and so no Triton); the Triton pieces load on first use.
"""
