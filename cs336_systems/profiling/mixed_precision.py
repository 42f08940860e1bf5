"""Mixed precision, computed (problems mixed_precision_accumulation, benchmarking_mixed_precision (a)).

`just bench accumulation` writes two results files:
- mixed-precision/accumulation: the four accumulation loops of the handout, their exact outputs;
- mixed-precision/autocast_dtypes: the dtype of each tensor of the handout's toy model under autocast
  (fp16 and bf16, on every device at hand), read off the tensors, not typed.
"""

from __future__ import annotations

import math
import sys

import torch
from torch import nn

from cs336_systems.bench.cli import Parser, check_cuda, open_store, results_root
from cs336_systems.bench.provenance import device_slug
from cs336_systems.bench.store import DEFAULT_ROOT

N_ADDS = 1000
ADDEND = 0.01


# --8<-- [start:accumulation]
def accumulate(accumulator: torch.dtype, addend: torch.dtype, cast: bool = False,
               n: int = N_ADDS, value: float = ADDEND, device: str = "cpu") -> torch.Tensor:
    """Add `value` (stored as `addend`) n times into a running sum of dtype `accumulator`.

    cast=True converts the addend to the accumulator's dtype explicitly before each add, as the
    handout's fourth loop does; without it PyTorch's type promotion does the same conversion.
    """
    s = torch.tensor(0, dtype=accumulator, device=device)
    for _ in range(n):
        x = torch.tensor(value, dtype=addend, device=device)
        s += x.type(accumulator) if cast else x
    return s


LOOPS = {  # name: (accumulator, addend, explicit cast)
    "fp32 += fp32": (torch.float32, torch.float32, False),
    "fp16 += fp16": (torch.float16, torch.float16, False),
    "fp32 += fp16": (torch.float32, torch.float16, False),
    "fp32 += fp16.type(fp32)": (torch.float32, torch.float16, True),
}
# --8<-- [end:accumulation]


# --8<-- [start:binade_walk]
def binade_walk(dtype: torch.dtype = torch.float16, n: int = N_ADDS, value: float = ADDEND) -> list[dict]:
    """Where the low-precision sum loses its accuracy: for each binade [2^k, 2^(k+1)) the running
    sum passes through, the spacing of representable numbers there (ulp), how many adds it spent
    there and what one add of `value` really added (each result is rounded to that grid)."""
    s = torch.tensor(0, dtype=dtype)
    x = torch.tensor(value, dtype=dtype)
    rows: dict[int, dict] = {}
    for _ in range(n):
        before = float(s)
        s += x
        k = math.floor(math.log2(before)) if before > 0 else None
        row = rows.setdefault(k, {"binade": "[0, first add)" if k is None else f"[{2.0**k:g}, {2.0**(k + 1):g})",
                                  "ulp": None if k is None else 2.0**k * torch.finfo(dtype).eps,
                                  "adds": 0, "added": 0.0})
        row["adds"] += 1
        row["added"] += float(s) - before
    out = []
    for row in rows.values():
        row["added_per_add"] = row.pop("added") / row["adds"]
        out.append(row)
    return out
# --8<-- [end:binade_walk]


def accumulation_rows(device: str = "cpu") -> list[dict]:
    rows = []
    for name, (acc, add, cast) in LOOPS.items():
        s = accumulate(acc, add, cast, device=device)
        exact = N_ADDS * ADDEND
        rows.append({"loop": name, "accumulator": str(acc).removeprefix("torch."),
                     "addend": str(add).removeprefix("torch."), "explicit_cast": cast,
                     "n_adds": N_ADDS, "value": float(s), "value_repr": repr(float(s)),
                     "error": float(s) - exact,
                     "addend_as_stored": float(torch.tensor(ADDEND, dtype=add))})
    return rows


# --8<-- [start:toy_model]
class ToyModel(nn.Module):
    """The handout's toy model for the autocast question."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, 10, bias=False)
        self.ln = nn.LayerNorm(10)
        self.fc2 = nn.Linear(10, out_features, bias=False)
        self.relu = nn.ReLU()

    def forward(self, x):
        x = self.relu(self.fc1(x))
        x = self.ln(x)
        x = self.fc2(x)
        return x
# --8<-- [end:toy_model]


# --8<-- [start:autocast_dtypes]
def autocast_dtypes(device: str, dtype: torch.dtype) -> dict[str, str]:
    """dtype of parameters, fc1 output, layer-norm output, logits, loss and gradients under autocast."""
    torch.manual_seed(0)
    model = ToyModel(16, 4).to(device)
    seen: dict[str, str] = {}

    def record(name):
        def hook(module, inputs, output) -> None:  # returning a value would replace the output
            seen.setdefault(name, str(output.dtype))
        return hook

    model.fc1.register_forward_hook(record("fc1 output"))
    model.ln.register_forward_hook(record("layer-norm output"))
    x = torch.randn(8, 16, device=device)
    y = torch.randint(0, 4, (8,), device=device)
    with torch.autocast(device_type=torch.device(device).type, dtype=dtype):
        seen["parameters (inside autocast)"] = str(model.fc1.weight.dtype)
        logits = model(x)
        seen["logits"] = str(logits.dtype)
        loss = nn.functional.cross_entropy(logits, y)
        seen["loss"] = str(loss.dtype)
    loss.backward()
    seen["gradients"] = str(model.fc1.weight.grad.dtype)
    return {k: v.removeprefix("torch.") for k, v in seen.items()}
# --8<-- [end:autocast_dtypes]


def autocast_rows(device: str) -> list[dict]:
    rows = []
    for name, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        try:
            table = autocast_dtypes(device, dtype)
        except (RuntimeError, TypeError) as exc:  # e.g. fp16 autocast on a CPU build without it
            rows.append({"device_type": torch.device(device).type, "autocast": name, "tensor": "(all)",
                         "dtype": None, "_status": "unsupported", "_error": str(exc).splitlines()[0]})
            continue
        for tensor, dt in table.items():
            rows.append({"device_type": torch.device(device).type, "autocast": name, "tensor": tensor, "dtype": dt})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="accumulation", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--results-dir", type=results_root, default=None, help=f"results root (default {DEFAULT_ROOT})")
    args = p.parse_args(argv)
    check_cuda(p, args.device)
    slug = device_slug(args.device)
    acc = open_store(p, "mixed-precision/accumulation", ["loop", "device_type"], device=slug,
                     root=args.results_dir)
    dts = open_store(p, "mixed-precision/autocast_dtypes", ["device_type", "autocast", "tensor"],
                     device=slug, root=args.results_dir)
    devices = [args.device] + (["cpu"] if args.device != "cpu" else [])
    for dev in devices:
        for row in accumulation_rows(dev):
            row["device_type"] = torch.device(dev).type
            acc.append(row)
            print(f"[{dev}] {row['loop']:<26} {row['value_repr']}")
        for row in autocast_rows(dev):
            status, error = row.pop("_status", "ok"), row.pop("_error", None)
            dts.append(row, status=status, error=error)
            print(f"[{dev}] autocast {row['autocast']}: {row['tensor']:<30} {row['dtype'] or status}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
