"""Single-level gradient checkpointing measured (problem gradient_checkpointing (b)):
`python -m cs336_systems.bench checkpointing`.

The 2026 handout's xl model (d_model 2560, 32 layers: the `2.7B` preset of the 2025 size table, which
this package keeps under that name), batch 4, context 2048, by default: one step time and peak
memory per block size k of TransformerLM.checkpoint_every (0 = no checkpointing), so the best k and
its neighbours can be read off one run. Rows: results/memory/checkpointing/<device>.jsonl.

`--sublayers attn,ffn,attn+ffn` adds the granularities finer than a block (the "next smaller" than
k = 1): inside every block, the attention branch alone, the feed-forward branch alone, or each on
its own (TransformerLM.checkpoint_sublayers; checkpoint_theory.sublayer_peak is their arithmetic).
Their rows go to results/memory/checkpointing_sublayers/<device>.jsonl (k = 0 there, `sublayers`
naming the granularity), so the block-size file keeps one row kind. Every run measures its cells
(the old rows stay; readers keep the newest), so k = 1 and 2 can be timed in the same run as the
sub-block cells; `--remeasure` also measures again the cells a `--resume`d run had finished.

Per k: --warmup untimed steps, then --steps timed (profiling.benchmark.measure: the allocator's peak
over the timed steps on CUDA), then one forward whose saved tensors are counted (what the forward
leaves for the backward: the segment inputs plus everything outside the blocks). On CPU there is no
allocator peak; one more step under LiveTensorBytes gives the peak of live tensor bytes instead.
`python -m cs336_systems.bench checkpointing --size tiny --device cpu --results-dir results/_local` is
the CPU smoke run.
"""

from __future__ import annotations

import math
import sys

import torch

from cs336_systems.bench.cli import Parser, add_resume, at_least, csv_of, open_store, require_gpu, results_root
from cs336_systems.bench.fit import add_allow_oom
from cs336_systems.bench.sweep import exit_code, run_sweep
from cs336_systems.model import cross_entropy, get_config, use_attention
from cs336_systems.model.attention import ATTENTION_IMPLS
from cs336_systems.model.config import PRESETS, PRESETS_EXTRA
from cs336_systems.sharding.accounting import block_sublayer_bytes, saved_activation_bytes

from .benchmark import measure
from .budget import check_fit
from .checkpointing import LiveTensorBytes
from .steps import DTYPES, MODES, autocast_context, build_model, random_batch

BENCH = "memory/checkpointing"
KEY = ["size", "context", "batch", "mode", "dtype", "attention", "checkpoint_every", "warmup", "steps"]
SUBLAYER_BENCH = "memory/checkpointing_sublayers"
SUBLAYER_KEY = [*KEY, "sublayers"]
SUBLAYER_CHOICES = {"attn": ("attn",), "ffn": ("ffn",), "attn+ffn": ("attn", "ffn")}
GIB = 2**30


def saved_after_forward(model, x, y, dtype: str) -> int:
    """Bytes autograd holds for the backward once forward and loss are done (parameters excluded)."""
    with saved_activation_bytes(model.parameters()) as saved, autocast_context(dtype, x.device)():
        cross_entropy(model(x).flatten(0, 1), y.flatten())
    return saved["bytes"]


def live_peak_of_step(model, x, y, dtype: str) -> int:
    """Peak live tensor bytes of one forward + backward, gradients allocated beforehand (CPU)."""
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    with LiveTensorBytes() as mem, autocast_context(dtype, x.device)():
        cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
    model.zero_grad(set_to_none=True)
    return mem.peak


def build_parser() -> Parser:
    p = Parser(prog="checkpointing", description=__doc__.splitlines()[0])
    p.add_argument("--size", default="2.7B", choices=[*PRESETS, *PRESETS_EXTRA])
    p.add_argument("--context", type=at_least(1), default=2048)
    p.add_argument("--batch", type=at_least(1), default=4)
    p.add_argument("--ks", type=csv_of(at_least(0)), default=[0, 1, 2, 3, 4, 6, 8, 16, 32],
                   help="block sizes k (checkpoint every k blocks; 0 = none); each <= num_layers")
    p.add_argument("--sublayers", type=csv_of(choices=list(SUBLAYER_CHOICES), allow_empty=True), default=[],
                   help="also checkpoint inside each block: attn, ffn, attn+ffn (comma-separated)")
    p.add_argument("--remeasure", action="store_true",
                   help="with --resume: measure again the cells that run finished (a new run measures all)")
    p.add_argument("--mode", choices=[m for m in MODES if m != "forward"], default="forward-backward")
    p.add_argument("--dtype", choices=list(DTYPES), default="fp32")
    p.add_argument("--attention", choices=list(ATTENTION_IMPLS), default="naive")
    p.add_argument("--warmup", type=at_least(0), default=2)
    p.add_argument("--steps", type=at_least(1), default=3)
    p.add_argument("--device", default="cuda",
                   help="cuda (a GPU benchmark), or cpu for its CPU smoke run with --results-dir")
    p.add_argument("--results-dir", type=results_root, default=None, help="results root (default: results/)")
    add_resume(p)
    add_allow_oom(p)
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    require_gpu(p, args.device, args.results_dir)
    cfg = get_config(args.size, args.context)
    too_big = [k for k in args.ks if k > cfg.num_layers]
    if too_big:
        p.error(f"--ks: {too_big} exceed the {args.size} model's {cfg.num_layers} layers")
    # k > 0: the recomputed segment's k blocks are live at once beside every other block's input;
    # inside-block cells (--sublayers): at least every block's input
    check_fit(p, args, [{"size": args.size, "context": args.context, "mode": args.mode, "dtype": args.dtype,
                         "batch": args.batch, "attention": args.attention, "k": k} for k in args.ks]
              + [{"size": args.size, "context": args.context, "mode": args.mode, "dtype": args.dtype,
                  "batch": args.batch, "attention": args.attention, "k": None, "sublayers": g}
                 for g in args.sublayers],
              lambda c: (f"--size {c['size']} --context {c['context']} --batch {c['batch']} "
                         + (f"--ks {c['k']}" if c["k"] is not None else f"--sublayers {c['sublayers']}")),
              checkpointed=lambda c: cfg.num_layers if c["k"] is None else cfg.num_layers - c["k"] if c["k"] else 0)
    slug = None if args.device.startswith("cuda") else "cpu"
    store = open_store(p, BENCH, KEY, device=slug, root=args.results_dir)
    sub_store = open_store(p, SUBLAYER_BENCH, SUBLAYER_KEY, device=slug, root=args.results_dir)
    dev = torch.device(args.device)
    base = {"size": args.size, "context": args.context, "batch": args.batch, "mode": args.mode,
            "dtype": args.dtype, "attention": args.attention, "warmup": args.warmup, "steps": args.steps}
    cells = [{**base, "checkpoint_every": k} for k in args.ks]
    sub_cells = [{**base, "checkpoint_every": 0, "sublayers": g} for g in args.sublayers]
    if args.remeasure:
        for st, cs in ((store, cells), (sub_store, sub_cells)):
            for cell in cs:
                st.forget(cell)
    model = None

    def run(cell: dict) -> dict:
        nonlocal model
        model = model or build_model(cfg, dev)
        k = cell["checkpoint_every"]
        model.checkpoint_sublayers = ()  # one granularity at a time: clear the other first
        model.checkpoint_every = k
        model.checkpoint_sublayers = SUBLAYER_CHOICES.get(cell.get("sublayers"), ())
        params_bytes = torch.cuda.memory_allocated(dev) if dev.type == "cuda" else None
        with use_attention(args.attention):
            out = measure(model, cfg, mode=args.mode, dtype=args.dtype, batch=args.batch,
                          context=args.context, warmup=args.warmup, steps=args.steps, device=dev)
            model.zero_grad(set_to_none=True)
            x, y = random_batch(cfg, args.batch, args.context, dev)
            out["saved_after_forward_gib"] = saved_after_forward(model, x, y, args.dtype) / GIB
            if dev.type == "cpu":
                out["live_peak_gib"] = live_peak_of_step(model, x, y, args.dtype) / GIB
        branches = len(SUBLAYER_CHOICES.get(cell.get("sublayers"), ()))
        out["segments"] = math.ceil(cfg.num_layers / k) if k else branches * cfg.num_layers
        # one segment input: the fp32 residual stream (b, s, d)
        out["checkpoint_gib"] = 4 * args.batch * args.context * cfg.d_model / GIB
        # the arithmetic's terms (accounting.block_sublayer_bytes, fp32, naive attention): what the
        # theory of checkpoint_theory.py predicts from, stored beside what was measured
        branch = block_sublayer_bytes(cfg, args.batch, args.context)
        out["attn_branch_gib"], out["ffn_branch_gib"] = branch["attn"] / GIB, branch["ffn"] / GIB
        out["params_gib"] = params_bytes / GIB if params_bytes is not None else None
        return out

    written = run_sweep(store, cells, run, desc="checkpointing") if cells else []
    written += run_sweep(sub_store, sub_cells, run, desc="checkpointing inside blocks") if sub_cells else []
    return exit_code(written, BENCH)


if __name__ == "__main__":
    sys.exit(main())
