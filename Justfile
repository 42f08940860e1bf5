# cs336-systems: `just` lists the recipes.

set shell := ["bash", "-euo", "pipefail", "-c"]

# List the recipes
default:
    @just --list --unsorted

# Install the package with the test and docs tools (CPU is fine)
install:
    python -m pip install -e ".[dev]"

# Run the whole test suite (CPU: Triton under the interpreter, 2-process gloo, the built site)
test *ARGS:
    python -m pytest {{ARGS}}

# CPU kernel sets add in different orders (ATEN_CPU_CAPABILITY: default = scalar, avx2, avx512), so a
# tolerance tuned to one CPU's order fails on another. These files compare floating-point results, as
# do the distributed tests (taken by marker) but for the benchmark harnesses' and the launcher's. A
# set that is this CPU's own was run by `just test` and is skipped; so are `slow` tests (torch.compile:
# inductor's generated C++ does not build under ATEN_CPU_CAPABILITY=default, and it is not numerics).
numerics := "tests/test_model.py tests/test_model_attention_impls.py tests/test_flash_attention.py tests/test_weighted_sum.py tests/test_online_softmax.py"

# Run the distributed and numerics tests again under other CPU kernel sets (CI runs it after `just test`)
test-kernels CAPS="default avx2" *ARGS:
    #!/usr/bin/env bash
    set -euo pipefail
    native=$(python -c "import torch; print(torch.backends.cpu.get_cpu_capability().lower())")
    for cap in {{CAPS}}; do
        if [ "$cap" = "$native" ]; then echo "== $cap is this CPU's own kernel set: just test ran it"; continue; fi
        echo "== ATEN_CPU_CAPABILITY=$cap: distributed"
        ATEN_CPU_CAPABILITY=$cap python -m pytest -q -p no:randomly -m distributed -k "not bench and not test_launch" {{ARGS}}
        echo "== ATEN_CPU_CAPABILITY=$cap: numerics"
        ATEN_CPU_CAPABILITY=$cap python -m pytest -q -p no:randomly -m "not slow" {{numerics}} {{ARGS}}
    done

# Run the distributed tests N times in a row, to catch interleaving bugs
test-dist-repeat N="5":
    for i in $(seq 1 {{N}}); do echo "== run $i of {{N}}"; python -m pytest -q -m distributed -p no:randomly; done

# Serve the site at http://127.0.0.1:8000 (rebuilds on change)
serve:
    python -m mkdocs serve -a 127.0.0.1:8000

# Build the site into site/ (strict: any warning fails)
build:
    python -m mkdocs build --strict

# Run one benchmark by name (`just bench list` shows them); results go to results/
bench NAME *ARGS:
    python -m cs336_systems.bench {{NAME}} {{ARGS}}

# Run every GPU benchmark in order (on a GPU node): first each one's rough time on an H200 (from the
# committed rows), then each measures every cell again under a new run id, with a progress line
bench-all *ARGS:
    python -m cs336_systems.bench all {{ARGS}}
