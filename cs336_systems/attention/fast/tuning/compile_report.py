"""Compile the kernels for Hopper (sm_90) without a GPU and report their resources.

Triton compiles ahead of time for any target: shared memory per program, register spills (local
memory traffic in the PTX) and whether the tensor-core instructions (wgmma) and asynchronous copies
(cp.async) are there, all at no device time: `fits` says whether a configuration can launch at all
(227 KB of shared memory). The command line is a script:

    python scripts/attention/compile_report.py [--dtype bf16] [--d 64] [--causal] [--tuned] [--onepass-candidates]
"""

from __future__ import annotations

import collections
import re
import time

import torch

from ...flash_launch import dot_precision
from ...tiles import BwdConfig, FwdConfig
from ...triton_loader import next_power_of_2

SMEM_LIMIT = 232448  # bytes a Hopper program may use (227 KB)
_PTR = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32"}
_OPS = re.compile(r"^\s*((?:cp\.async|wgmma\.mma_async|ld\.local|st\.local|ld\.global)[\w.:]*)", re.M)
# Atomics are predicated (`@%p1 red.global...`), which _OPS (unpredicated instructions only) misses.
_ATOMICS = re.compile(r"^\s*(?:@!?%p\d+\s+)?(red|atom)\.global[\w.]*", re.M)


def _compile(fn, pointers: dict[str, str], const: dict, num_warps: int, num_stages: int):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    # What a launch specialises on: unit strides are constants, other strides, sizes and pointers
    # are multiples of 16 (true for every power-of-two shape we time).
    signature, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in const:
            signature[name] = "constexpr"
        else:
            signature[name] = pointers.get(name, "fp32" if name.endswith("scale") else "i32")
            if (name in pointers and pointers[name].startswith("*")) or name.startswith(("stride", "n_")):
                attrs[(i,)] = [["tt.divisibility", 16]]
    return triton.compile(ASTSource(fn, signature, const, attrs), target=GPUTarget("cuda", 90, 128),
                          options=dict(num_warps=num_warps, num_stages=num_stages))


def machine_code(cubin: bytes) -> dict:
    """Registers per thread and register-spill instructions (STL/LDL) in the SASS that ptxas made:
    the PTX above it has virtual registers, so only the cubin shows real spills."""
    import subprocess
    import tempfile
    from pathlib import Path

    import triton

    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        try:
            sass = subprocess.run([str(tools / "nvdisasm"), "-c", f.name], capture_output=True, text=True).stdout
            usage = subprocess.run([str(tools / "cuobjdump"), "-res-usage", f.name], capture_output=True, text=True).stdout
        except OSError:  # a Triton build without the bundled CUDA tools
            return {}
    regs = re.search(r"REG:(\d+)", usage)
    return {"regs": int(regs.group(1)) if regs else None, "sass_spill_ops": len(re.findall(r"\b(?:STL|LDL)\b", sass)),
            "loop_spill_ops": innermost_loop_spills(sass)}


_SASS_LABEL = re.compile(r"^\.(L_x_\d+):")
_SASS_INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?);")
_SASS_BRANCH = re.compile(r"\bBRA\b.*`\(\.(L_x_\d+)\)")


def innermost_loop_spills(sass: str) -> list[int]:
    """Spill instructions (STL/LDL) in each innermost loop of the SASS with tensor-core products in
    it (the tile loops), in address order: a loop is a branch back to an earlier label, innermost
    when no other loop lies inside it. A kernel's whole count mixes set-up code run once with the
    tile loops run thousands of times; these are the ones on the hot path."""
    at: dict[str, int] = {}
    code: list[tuple[int, str]] = []
    pending: list[str] = []
    for line in sass.splitlines():
        if m := _SASS_LABEL.match(line.strip()):
            pending.append(m.group(1))
        elif m := _SASS_INSTRUCTION.match(line):
            code.append((int(m.group(1), 16), m.group(2)))
            for label in pending:
                at[label] = code[-1][0]
            pending = []
    loops = [(at[m.group(1)], a) for a, text in code if (m := _SASS_BRANCH.search(text)) and at.get(m.group(1), a) < a]
    innermost = [(s, e) for s, e in loops if not any((s, e) != (s2, e2) and s <= s2 and e2 <= e for s2, e2 in loops)]
    body = lambda s, e: [text for a, text in code if s <= a <= e]  # noqa: E731
    return [sum(1 for text in body(s, e) if re.search(r"\b(?:STL|LDL)\b", text))
            for s, e in sorted(set(innermost)) if any("GMMA" in text for text in body(s, e))]


def report(kind: str, config: FwdConfig | BwdConfig, dtype: torch.dtype, head_dim: int, causal: bool) -> dict:
    """Resources of one kernel ('fwd', 'dkdv', 'dq', 'fused' or 'onepass') for one config."""
    from ... import flash_bwd_kernel as B
    from ... import flash_fwd_kernel as F
    from .. import flash_bwd_onepass_kernel as B1

    p = _PTR[dtype]
    common = dict(CAUSAL=causal, HEAD_DIM=head_dim, HEAD_DIM_PAD=next_power_of_2(max(head_dim, 16)),
                  INPUT_PRECISION=dot_precision(dtype))  # as the launchers pass it
    unit = {f"stride_{t}d": 1 for t in "qkvdo"}
    if kind == "fwd":
        assert isinstance(config, FwdConfig)
        fn = F.flash_fwd_kernel
        const = common | dict(BLOCK_M=config.block_m, BLOCK_N=config.block_n, TMA=config.tma)
        warps, stages = config.num_warps, config.num_stages
        ptrs = {n: p for n in "QKVO"} | {"L": "*fp32"}
        if config.tma:
            box = {"Q": config.block_m, "K": config.block_n, "V": config.block_n}
            ptrs |= {n: f"tensordesc<{p[1:]}[1, 1, {r}, {common['HEAD_DIM_PAD']}]>" for n, r in box.items()}
    else:
        assert isinstance(config, BwdConfig)
        ptrs = {n: p for n in ("Q", "K", "V", "DO", "DQ", "DK", "DV")} | {"L": "*fp32", "Delta": "*fp32"}
        pad = common["HEAD_DIM_PAD"]
        # The timed shapes (powers of two, tiles dividing them) have no ragged query tile.
        no_tail = not causal or config.block_n1 % config.block_m1 == 0

        def descs(names, rows_qdo, rows_kv):  # TMA: descriptor types with each tensor's box
            q, k, v, do = names
            return {n: f"tensordesc<{p[1:]}[1, 1, {r}, {pad}]>"
                    for n, r in ((q, rows_qdo), (k, rows_kv), (v, rows_kv), (do, rows_qdo))}

        if kind == "dkdv":
            fn, const = B.bwd_dkdv_kernel, common | dict(BLOCK_M=config.block_m1, BLOCK_N=config.block_n1,
                                                         TMA=config.tma1, NO_TAIL=no_tail)
            if config.tma1:
                ptrs |= descs(("Q", "K", "V", "DO"), config.block_m1, config.block_n1)
            warps, stages = config.num_warps1, config.num_stages1
        elif kind == "onepass":  # EVEN_N: the timed shapes are multiples of the key tile
            fn = B1.bwd_onepass_kernel
            ptrs["DQ"] = "*fp32"  # the atomics accumulate into an fp32 buffer, whatever the dtype
            const = common | dict(EVEN_N=True, BLOCK_M=config.block_m1, BLOCK_N=config.block_n1,
                                  TMA=config.tma1, DQ_TMA=config.tma1, NO_TAIL=no_tail)
            if config.tma1:
                ptrs |= descs(("Q", "K", "V", "DO"), config.block_m1, config.block_n1)
                ptrs["DQ"] = f"tensordesc<fp32[1, 1, {config.block_m1}, {pad}]>"
            warps, stages = config.num_warps1, config.num_stages1
        elif kind == "dq":
            fn, const = B.bwd_dq_kernel, common | dict(BLOCK_M=config.block_m2, BLOCK_N=config.block_n2,
                                                       TMA=config.tma2)
            if config.tma2:
                ptrs |= descs(("Q", "K", "V", "DO"), config.block_m2, config.block_n2)
            warps, stages = config.num_warps2, config.num_stages2
        else:
            fn = B.bwd_fused_kernel
            const = common | dict(BLOCK_M1=config.block_m1, BLOCK_N1=config.block_n1,
                                  BLOCK_M2=config.block_m2, BLOCK_N2=config.block_n2,
                                  TMA1=config.tma1, TMA2=config.tma2, NO_TAIL=no_tail)
            ptrs |= {n + "2": p for n in ("Q", "K", "V", "DO")}
            if config.tma1:
                ptrs |= descs(("Q", "K", "V", "DO"), config.block_m1, config.block_n1)
            if config.tma2:
                ptrs |= descs(("Q2", "K2", "V2", "DO2"), config.block_m2, config.block_n2)
            warps, stages = config.num_warps1, config.num_stages1
    const |= {k: v for k, v in unit.items() if k in fn.arg_names}
    start = time.perf_counter()
    k = _compile(fn, {n: t for n, t in ptrs.items() if n in fn.arg_names}, const, warps, stages)
    ops = collections.Counter(m.split(".")[0] + "." + m.split(".")[1] for m in _OPS.findall(k.asm["ptx"]))
    out = {"smem": k.metadata.shared, "fits": k.metadata.shared <= SMEM_LIMIT, **machine_code(k.asm["cubin"]),
           "spills": ops.get("ld.local", 0) + ops.get("st.local", 0), "wgmma": ops.get("wgmma.mma_async", 0),
           "cp_async": ops.get("cp.async", 0), "tma": len(re.findall(r"cp\.async\.bulk\.tensor", k.asm["ptx"])),
           "compile_s": time.perf_counter() - start}
    if kind == "onepass":  # the only kernel with atomics: red (result unused) or atom (result used)
        atomics = collections.Counter(_ATOMICS.findall(k.asm["ptx"]))
        out["red"], out["atom"] = atomics.get("red", 0), atomics.get("atom", 0)
        out["tma_reduce"] = len(re.findall(r"cp\.reduce\.async\.bulk\.tensor", k.asm["ptx"]))
    return out
