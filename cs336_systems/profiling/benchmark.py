"""End-to-end benchmark of the LM (problem benchmarking_script): `just bench model --size small ...`.

Builds the model from a preset or explicit hyperparameters, makes a random batch, runs --warmup
untimed steps, then times --steps steps of forward, forward-backward or train, synchronising after
each (bench.timing.time_steps: timeit.default_timer + torch.cuda.synchronize). Prints mean and std
per step, tokens/s and MFU, and appends one row to results/end-to-end/runs/<device>.jsonl.

Runs on CPU with --size tiny (that is how the tests exercise it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

from cs336_systems.bench import fit
from cs336_systems.bench.cli import Parser, check_cuda, open_store, results_root, seed
from cs336_systems.bench.device import peak_flops
from cs336_systems.bench.provenance import device_name
from cs336_systems.bench.store import DEFAULT_ROOT
from cs336_systems.bench.sweep import is_oom
from cs336_systems.bench.timing import synchronize, time_steps
from cs336_systems.model import count_parameters, flops_per_token, get_config, use_attention
from cs336_systems.model.attention import ATTENTION_IMPLS
from cs336_systems.model.config import PRESETS, PRESETS_EXTRA, ModelConfig

from .nvtx import MEASURED, annotated_attention, range_factory
from .steps import DTYPES, MODES, bf16_supported, build_model, make_optimizer, make_step, phase_ranges, random_batch

BENCH = "end-to-end/runs"
KEY = ("size", "d_model", "num_layers", "num_heads", "d_ff", "vocab_size", "context", "batch",
       "mode", "dtype", "compile", "attention", "warmup", "steps")


# --8<-- [start:throughput]
def throughput(cfg: ModelConfig, *, context: int, batch: int, mode: str, seconds: float,
               dtype: str, device: str | torch.device, peak_tflops: float | None = None) -> dict:
    """tokens/s, achieved TFLOP/s and MFU of one step that took `seconds`.

    FLOPs per token: 2N + 4·L·d·ctx forward, three times that with the backward (model.flops_per_token).
    The peak is the datasheet's dense figure for the dtype (fp32: no TF32), unless overridden.
    """
    tokens = batch * context
    flops = flops_per_token(cfg, context, training=mode != "forward") * tokens
    peak = peak_tflops * 1e12 if peak_tflops else peak_flops(device_name(device), dtype)
    achieved = flops / seconds
    return {"tokens_per_s": tokens / seconds, "tflops": achieved / 1e12,
            "peak_tflops": peak / 1e12 if peak else None, "mfu": achieved / peak if peak else None}
# --8<-- [end:throughput]


def measure(model: torch.nn.Module, cfg: ModelConfig, *, mode: str, dtype: str, batch: int,
            context: int, warmup: int, steps: int, device: str | torch.device,
            compiled: torch.nn.Module | None = None, range_kind: str | None = None,
            peak_tflops: float | None = None, snapshot=None, seed: int = 0) -> dict[str, Any]:
    """Time `steps` steps after `warmup`; returns the metrics of one results row.

    The first step is timed on its own (it pays for compilation, cuBLAS set-up, allocator growth),
    so `first_step_ms` is reported whatever the warm-up. `snapshot` is an optional context manager
    (memory.record_snapshot) entered around the measured steps only.
    """
    dev = torch.device(device)
    x, y = random_batch(cfg, batch, context, dev, seed)
    optimizer = make_optimizer(model, mode)
    rng = range_factory(range_kind)
    marker = None
    if snapshot is not None:
        from .memory import phase_marker as marker
    step = make_step(compiled if compiled is not None else model, x, y, mode=mode, dtype=dtype, optimizer=optimizer,
                     phase=phase_ranges(rng, marker=marker))
    first = time_steps(step, warmup=0, steps=1, device=dev).times[0] if warmup > 0 else None
    for _ in range(max(warmup - 1, 0)):
        step()
    synchronize(dev)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    with (snapshot or _null()), rng(MEASURED):
        times = time_steps(step, warmup=0, steps=steps, device=dev)
    peak_mem = torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else None
    if first is None:
        first = times.times[0]
    out = {"mean_ms": times.mean * 1e3, "std_ms": times.std * 1e3, "median_ms": times.median * 1e3,
           "times_ms": [t * 1e3 for t in times.times], "first_step_ms": first * 1e3,
           "peak_mem_gib": peak_mem / 2**30 if peak_mem is not None else None}
    out.update(throughput(cfg, context=context, batch=batch, mode=mode, seconds=times.mean,
                          dtype=dtype, device=dev, peak_tflops=peak_tflops))
    del optimizer
    return out


def _null():
    import contextlib

    return contextlib.nullcontext()


def build_parser() -> Parser:
    p = Parser(prog="model", description=__doc__.splitlines()[0])
    sizes = [*PRESETS, *PRESETS_EXTRA]
    p.add_argument("--size", default="small", help=f"preset: {', '.join(sizes)} (default small)")
    for name in ("vocab-size", "d-model", "num-layers", "num-heads", "d-ff"):
        p.add_argument(f"--{name}", type=int, help="override the preset's value")
    p.add_argument("--rope-theta", type=float)
    p.add_argument("--context-length", type=int, help="tokens per sequence (default: the preset's, 512)")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--mode", default="forward-backward", help=f"one of {', '.join(MODES)}")
    p.add_argument("--dtype", default="fp32", help="fp32, or bf16 (autocast)")
    p.add_argument("--compile", action="store_true", help="torch.compile the whole model")
    p.add_argument("--attention", default="naive", help=f"one of {', '.join(ATTENTION_IMPLS)}")
    p.add_argument("--memory-snapshot", type=Path, metavar="PATH",
                   help="record allocator history over the measured steps; write PATH, a pickle that "
                        "pytorch.org/memory_viz opens")
    p.add_argument("--profile", help="nvtx (ranges for nsys) or torch (torch.profiler tables + trace)")
    p.add_argument("--trace", type=Path, help="Chrome trace path for --profile torch")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--peak-tflops", type=float, help="override the datasheet peak used for MFU")
    p.add_argument("--results-dir", type=results_root, default=None, help=f"results root (default {DEFAULT_ROOT})")
    p.add_argument("--seed", type=seed, default=0)
    fit.add_allow_oom(p)
    return p


def parse_config(p: Parser, args: argparse.Namespace) -> ModelConfig:
    """The model config from --size plus any explicit hyperparameter; errors are one line."""
    try:
        cfg = get_config(args.size)
        overrides = {k: getattr(args, k) for k in
                     ("vocab_size", "d_model", "num_layers", "num_heads", "d_ff", "rope_theta")
                     if getattr(args, k) is not None}
        if args.context_length is not None:
            overrides["context_length"] = args.context_length
        for name, value in overrides.items():
            if not 0 < value < float("inf"):
                p.error(f"--{name.replace('_', '-')} must be > 0 and finite, got {value}")
        return ModelConfig(**{**cfg.as_dict(), **overrides})
    except ValueError as exc:
        p.error(str(exc))


def validate(p: Parser, args: argparse.Namespace) -> None:
    if args.steps < 1:
        p.error(f"--steps must be >= 1, got {args.steps}")
    if args.warmup < 0:
        p.error(f"--warmup must be >= 0, got {args.warmup}")
    if args.batch_size < 1:
        p.error(f"--batch-size must be >= 1, got {args.batch_size}")
    if args.mode not in MODES:
        p.error(f"--mode must be one of {', '.join(MODES)}, got {args.mode!r}")
    if args.dtype not in DTYPES:
        p.error(f"--dtype must be one of {', '.join(DTYPES)}, got {args.dtype!r}")
    if args.attention not in ATTENTION_IMPLS:
        p.error(f"--attention must be one of {', '.join(ATTENTION_IMPLS)}, got {args.attention!r}")
    if args.profile not in (None, "nvtx", "torch"):
        p.error(f"--profile must be nvtx or torch, got {args.profile!r}")
    if args.profile and args.attention != "naive":
        p.error("--profile annotates the naive attention; use it with --attention naive")
    if args.trace and args.profile != "torch":
        p.error("--trace names the Chrome trace of --profile torch; add --profile torch")
    if args.peak_tflops is not None and not 0 < args.peak_tflops < float("inf"):
        p.error(f"--peak-tflops must be > 0 and finite, got {args.peak_tflops}")
    check_cuda(p, args.device)
    dev = torch.device(args.device)
    if args.dtype == "bf16" and not bf16_supported(dev):
        p.error(f"--dtype bf16: this {dev.type} does not support bf16 autocast")
    if args.memory_snapshot and dev.type != "cuda":
        p.error("--memory-snapshot records the CUDA caching allocator; it needs --device cuda")


def config_row(args: argparse.Namespace, cfg: ModelConfig) -> dict[str, Any]:
    return {"size": args.size, "d_model": cfg.d_model, "num_layers": cfg.num_layers,
            "num_heads": cfg.num_heads, "d_ff": cfg.d_ff, "vocab_size": cfg.vocab_size,
            "context": cfg.context_length, "batch": args.batch_size, "mode": args.mode,
            "dtype": args.dtype, "compile": args.compile, "attention": args.attention,
            "warmup": args.warmup, "steps": args.steps, "profile": args.profile,
            "params": count_parameters(cfg)["total"]}


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    validate(p, args)
    cfg = parse_config(p, args)
    have, where = fit.capacity_bytes(args.device)
    need = fit.step_memory(cfg, args.mode, batch=args.batch_size, context=cfg.context_length,
                           bf16=args.dtype == "bf16", attention=args.attention)
    fit.refuse_unless_fits(p, args, need, have, where,
                           f"--size {args.size} --batch-size {args.batch_size} --context-length "
                           f"{cfg.context_length} --mode {args.mode}")
    # Open the store before measuring, so a foreign file or uncommitted code fails fast, writing nothing.
    store = open_store(p, BENCH, KEY, device=None if args.device.startswith("cuda") else "cpu",
                       root=args.results_dir)
    row = config_row(args, cfg)
    try:
        metrics = run(args, cfg)
    except Exception as exc:  # noqa: BLE001
        if is_oom(exc):
            store.append(row, status="oom", error="CUDA out of memory")
            print(f"model: {args.size} {args.mode} ctx {cfg.context_length}: CUDA out of memory", file=sys.stderr)
            return 1
        raise
    store.append(row, {k: v for k, v in metrics.items() if not k.startswith("_")})
    mfu = f", MFU {metrics['mfu']:.1%}" if metrics.get("mfu") is not None else ""
    print(f"{args.size} {args.mode} {args.dtype}{' compiled' if args.compile else ''} ctx {cfg.context_length} "
          f"batch {args.batch_size}: mean {metrics['mean_ms']:.2f} ms, std {metrics['std_ms']:.2f} ms per step "
          f"({args.steps} steps after {args.warmup} warm-up); {metrics['tokens_per_s']:,.0f} tokens/s{mfu}")
    if "_kernel_table" in metrics:
        print(metrics["_kernel_table"])
    print(f"row appended to {store.path}")
    return 0


def run(args: argparse.Namespace, cfg: ModelConfig) -> dict[str, Any]:
    """Build, optionally compile/annotate/profile/snapshot, and measure one configuration."""
    dev = torch.device(args.device)
    model = build_model(cfg, dev, args.seed)
    compiled = torch.compile(model) if args.compile else None
    attention = args.attention
    if args.profile:
        attention = annotated_attention(range_factory(args.profile))
    common = dict(mode=args.mode, dtype=args.dtype, batch=args.batch_size, context=cfg.context_length,
                  warmup=args.warmup, steps=args.steps, device=dev, compiled=compiled,
                  peak_tflops=args.peak_tflops, seed=args.seed)
    with use_attention(attention):
        snapshot = None
        if args.memory_snapshot:
            from .memory import record_snapshot

            snapshot = record_snapshot(args.memory_snapshot)
        metrics = measure(model, cfg, range_kind=args.profile if args.profile == "nvtx" else None,
                          snapshot=snapshot, **common)
        if args.profile == "torch":
            from .torch_profile import format_kernel_table, profile_step

            trace = args.trace or (Path(args.results_dir or DEFAULT_ROOT) / "_local" / "traces"
                                   / f"{args.size}-{args.mode}-{cfg.context_length}.json")
            rows, phases = profile_step(model, cfg, compiled=compiled, trace_path=trace, **{
                k: common[k] for k in ("mode", "dtype", "batch", "context", "device", "seed")})
            metrics["_kernel_table"] = format_kernel_table(rows, phases) + f"\nChrome trace: {trace}"
    return metrics


if __name__ == "__main__":
    sys.exit(main())
