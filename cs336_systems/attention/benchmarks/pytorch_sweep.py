"""Plain PyTorch attention at scale (problems pytorch_attention, torch_compile (a)): `just bench attention`.

Batch 8, no head dimension, d in {16, 32, 64, 128} x seq in {256, 1024, 4096, 8192, 16384}, fp32:
100 forward passes timed, the memory in use just before backward, 100 backward passes timed, for the
model's naive attention eager and under torch.compile. OOM cells are rows with status "oom".
Beyond SPEC's grid, d=64 at seq 32768 and 65536 probes where the H200's memory runs out.
Results: results/attention/pytorch_attention/.

`attention_memory` is the accounting by hand that the chapter sets beside the measured memory.
"""

from __future__ import annotations

import math
import sys

import torch

from cs336_systems.bench import fit
from cs336_systems.bench.cli import (
    Parser,
    add_resume,
    at_least,
    csv_of,
    given,
    open_store,
    positive,
    require_gpu,
    results_root,
)
from cs336_systems.bench.timing import synchronize, time_steps
from cs336_systems.model import naive_attention
from cs336_systems.profiling.budget import run_budgeted

KEY = ["impl", "batch", "d", "seq"]
MIB = 2**20


# --8<-- [start:memory_accounting]
def attention_memory(batch: int, seq: int, d: int, bytes_per_element: int = 4) -> dict[str, float]:
    """Bytes of naive attention softmax(Q K^T / sqrt(d)) V on (batch, seq, d) inputs, by hand.

    Forward: S = Q K^T (batch·seq² elements), S/sqrt(d) (another), P = softmax (another); autograd
    keeps Q, K (for the QK^T backward), P (softmax backward needs its output; P V's backward needs P)
    and V. Before backward: Q, K, V, O and P are live. Backward of P V makes dP (batch·seq²);
    softmax backward makes dS (batch·seq²) from P and dP. The measured peak holds one more
    score-sized tensor beside P, dP and dS (docs/attention.md discusses which), so count four.
    """
    e = bytes_per_element
    vec = batch * seq * d * e  # one (batch, seq, d) tensor
    mat = batch * seq * seq * e  # one (batch, seq, seq) tensor: independent of d
    return {
        "one_score_matrix": mat,
        "inputs_qkv": 3 * vec,
        "forward_peak": 3 * vec + 2 * mat,  # S and S/sqrt(d) alive together, then S/sqrt(d) and P
        "before_backward": 4 * vec + mat,  # Q, K, V, O + P
        "backward_peak": 4 * vec + 4 * mat + 4 * vec,  # P, dP, dS + one temporary; grads of Q, K, V, dO
    }


def largest_seq_that_fits(batch: int, d: int, capacity_bytes: float, bytes_per_element: int = 4) -> int:
    """The largest power-of-two seq whose hand-counted backward peak fits in `capacity_bytes`."""
    seq = 1
    while attention_memory(batch, seq * 2, d, bytes_per_element)["backward_peak"] <= capacity_bytes:
        seq *= 2
    return seq
# --8<-- [end:memory_accounting]


# --8<-- [start:measure]
def measure(attn, batch: int, seq: int, d: int, *, steps: int, warmup: int, device) -> dict:
    """Time `steps` forwards, read memory before backward, time `steps` backwards (each on a fresh
    graph: the forward is rerun untimed before every timed backward)."""
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(batch, seq, d, device=device, generator=gen, requires_grad=True) for _ in range(3))
    grad_out = torch.randn(batch, seq, d, device=device, generator=gen)
    for _ in range(warmup):  # also compiles forward and backward for this shape
        attn(q, k, v).backward(grad_out)
    fwd = time_steps(lambda: attn(q, k, v), warmup=0, steps=steps, device=device)
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() if cuda else 0
    out = attn(q, k, v)
    synchronize(device)
    before_backward = torch.cuda.memory_allocated() if cuda else 0
    bwd_times = []
    for i in range(steps):
        if i:
            out = attn(q, k, v)  # untimed: a fresh graph for each backward
        bwd_times += time_steps(lambda o=out: o.backward(grad_out), warmup=0, steps=1, device=device).times
        del out
    peak = torch.cuda.max_memory_allocated() if cuda else 0
    mean = sum(bwd_times) / len(bwd_times)
    std = math.sqrt(sum((t - mean) ** 2 for t in bwd_times) / max(len(bwd_times) - 1, 1))
    return {"forward_ms": fwd.mean * 1e3, "forward_std_ms": fwd.std * 1e3,
            "backward_ms": mean * 1e3, "backward_std_ms": std * 1e3,
            "mem_before_backward_mib": before_backward / MIB if cuda else None,
            "graph_mib": (before_backward - base) / MIB if cuda else None,
            "peak_mib": peak / MIB if cuda else None, "steps": steps}
# --8<-- [end:measure]


def check_fit(p, args, cells) -> None:
    """Refuse a cell whose hand-counted backward peak exceeds the device (or this host's RAM),
    unless --allow-oom: the sweep's probes past the GPU's memory are asked for with it."""
    have, where = fit.capacity_bytes(args.device)
    for cell in cells:
        peak = attention_memory(cell["batch"], cell["seq"], cell["d"])["backward_peak"]
        need = fit.StepMemory(peak, {"inputs, outputs, gradients and four (batch, seq, seq) scores": peak})
        fit.refuse_unless_fits(p, args, need, have, where,
                           f"--batch {cell['batch']} --ds/--probe-d {cell['d']} --seqs/--probe-seqs {cell['seq']}")


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="attention", description=__doc__.splitlines()[0])
    p.add_argument("--ds", type=csv_of(at_least(1)), default=[16, 32, 64, 128])
    p.add_argument("--seqs", type=csv_of(at_least(1)), default=[256, 1024, 4096, 8192, 16384])
    p.add_argument("--probe-seqs", type=csv_of(at_least(1), allow_empty=True), default=[32768, 65536],
                   help="extra seqs at --probe-d ('' for none)")
    p.add_argument("--probe-d", type=at_least(1), default=64)
    p.add_argument("--impls", type=csv_of(choices=["eager", "compiled"]), default=["eager", "compiled"])
    p.add_argument("--batch", type=at_least(1), default=8)
    p.add_argument("--steps", type=at_least(1), default=100)
    p.add_argument("--warmup", type=at_least(0), default=3)
    p.add_argument("--device", default="cuda",
                   help="cuda (a GPU benchmark), or cpu for its CPU smoke run with --results-dir")
    p.add_argument("--results-dir", type=results_root, default=None)
    p.add_argument("--budget-s", type=positive(float), default=None)
    add_resume(p)
    fit.add_allow_oom(p)
    args = p.parse_args(argv)
    impls = args.impls
    require_gpu(p, args.device, args.results_dir)
    if given(p, "probe_d") and (not args.probe_seqs or "eager" not in impls):
        p.error("--probe-d sets the d of the --probe-seqs cells (eager only); this run has none")
    store = open_store(p, "attention/pytorch_attention", KEY, root=args.results_dir,
                       device="cpu" if torch.device(args.device).type != "cuda" else None)
    grid = [(d, s) for d in args.ds for s in args.seqs]
    probes = [(args.probe_d, s) for s in args.probe_seqs]  # eager only: where does memory run out?
    cells = [{"impl": i, "batch": args.batch, "d": d, "seq": s} for i in impls for d, s in grid]
    cells += [{"impl": "eager", "batch": args.batch, "d": d, "seq": s} for d, s in probes if "eager" in impls]
    check_fit(p, args, cells)
    capacity = torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None

    def run(cell):
        attn = naive_attention
        if cell["impl"] == "compiled":
            torch._dynamo.reset()  # one static compile per shape, no recompile limit across the sweep
            attn = torch.compile(naive_attention, dynamic=False)
        acct = attention_memory(cell["batch"], cell["seq"], cell["d"])
        out = measure(attn, cell["batch"], cell["seq"], cell["d"], steps=args.steps,
                      warmup=args.warmup, device=args.device)
        out.update({f"predicted_{k}_mib": v / MIB for k, v in acct.items()})
        out["device_total_mib"] = capacity / MIB if capacity else None
        return out

    return run_budgeted(store, cells, run, budget_s=args.budget_s, desc="attention sweep")


if __name__ == "__main__":
    sys.exit(main())
