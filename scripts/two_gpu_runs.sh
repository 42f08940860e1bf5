#!/usr/bin/env bash
# The two-GPU runs of issue 29, in priority order, and the one-GPU run that can be made meanwhile.
# Every command is one line below. Each invocation measures all its cells again; a cut run goes on
# with `--resume RUN` (the id it printed) added to its line. Rows go to results/ (committed code
# only: the store refuses a dirty tree).
#
#   bash scripts/two_gpu_runs.sh                # on a node with 2 GPUs: runs 1, 2, 3 in order
#   bash scripts/two_gpu_runs.sh 1 3b           # some of them: a run (1, 2, 3) or one line (1a ... 3b)
#   bash scripts/two_gpu_runs.sh shared         # on ONE GPU: two gloo ranks share it (memory only)
#   TINY=1 bash scripts/two_gpu_runs.sh 1 2 3 shared   # the same lines on CPU gloo ranks, tiny sizes
#   DRY=1 bash scripts/two_gpu_runs.sh 1 2 3 shared    # print the lines, run nothing
#
# With the device tool (a clean snapshot; on_device.sh stamps each row with its commit):
#   cd .gpu_snapshot && NCCL_NVLS_ENABLE=0 bash scripts/on_device.sh 'bash scripts/two_gpu_runs.sh shared'
# (kind nvidia-h200 for `shared`, nvidia-h200-x2 for the others; one call per run keeps each
# under the 10 minutes a call may take: 1a, 1b+1c, 2, 3a, 3b).
#
# TINY=1 appends each tool's CPU flags to its line (argparse keeps the last value of a flag) and
# writes under $CS336_RESULTS_DIR (default: a new temporary directory), never results/: a rehearsal
# of every argument and code path, not a measurement.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

# -- the runs, in priority order --------------------------------------------------------------------
# 1  FSDP (fsdp, fsdp_accounting) on the 2026 xl (our 2.7B): every variant's step time and peak per
#    GPU, the profiled steps of (b); then the FSDP and TP tests over NCCL, and the TP bench.
run_1a() { bench fsdp --device cuda --world-size 2 --size 2.7B --trace-dir "$TRACES/fsdp"; }
run_1b() { tests tests/test_fsdp_gpu.py tests/test_tp_ffn.py; }
run_1c() { bench tp-ffn --backend nccl; }
# 2  The DDP and sharding problems on the 2026 xl (the 2025 xl's rows stay for the 2025 answers).
run_2a() { bench ddp --device cuda --backend nccl --size 2.7B; }
run_2b() { bench sharding --device cuda --backend nccl --size 2.7B; }
# 3  The leaderboard's step at batch 2 x 32,768 on two GPUs, the blocks kept that fit per rank.
run_3a() { bench training-step --world-size 2 --variant stock ours --cold-cache --shard fsdp2 --keep-blocks "$(kept stock ours --shard fsdp2)"; }
run_3b() { bench training-step --world-size 2 --variant ours --cold-cache --shard fsdp --no-compile --keep-blocks "$(kept ours --shard fsdp)"; }
# shared  ONE GPU, two gloo ranks on it: each rank's peak memory (real) for fsdp_accounting (a) and
#    the FSDP-vs-FSDP2 memory goal, and our FSDP's gathered weights on the GPU's allocator. No times.
run_shared_a() { tests tests/test_fsdp_shared_gpu.py; }
run_shared_b() { PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True bench fsdp --device cuda --backend gloo --world-size 2 --ranks-per-gpu 2 --size 2.7B --variants fsdp fsdp2 fsdp-bf16 fsdp2-bf16 zero1 ddp --warmup 1 --steps 1; }

# -- how a line runs ----------------------------------------------------------------------------------
declare -A TINY_FLAGS=(
    [fsdp]="--device cpu --backend gloo --size tiny --warmup 1 --steps 1"
    [ddp]="--device cpu --backend gloo --size tiny --rounds 1 --warmup 0 --steps 1 --bucket-sizes-mb 1"
    [sharding]="--device cpu --backend gloo --size tiny --warmup 0 --steps 1"
    [tp-ffn]="--backend gloo --d-model 16 --d-ff 32 --tokens 8 --warmup 0 --iters 1"
    [training-step]="--device cpu --size tiny --dtype fp32 --no-compile"
    [keep_blocks]="--device cpu --size tiny --dtype fp32"
)

show() { echo "+ $*" >&2; }
dry() { [ -n "${DRY:-}" ]; }

bench() {  # what `just bench NAME ARGS` runs
    local name=$1; shift
    local cmd=(python -m cs336_systems.bench "$name" "$@")
    if [ -n "${TINY:-}" ]; then read -ra extra <<< "${TINY_FLAGS[$name]}"; cmd+=("${extra[@]}"); fi
    show ${PYTORCH_CUDA_ALLOC_CONF:+PYTORCH_CUDA_ALLOC_CONF=$PYTORCH_CUDA_ALLOC_CONF} "${cmd[@]}"
    dry || "${cmd[@]}"
}

tests() {
    local cmd=(python -m pytest -q -v -p no:randomly "$@")
    if [ -n "${TINY:-}" ]; then cmd+=(--collect-only); fi  # on CPU they skip: collecting checks the paths
    show "${cmd[@]}"
    dry || "${cmd[@]}"
}

kept() {  # the largest --keep-blocks every named variant's memory estimate fits on a rank
    local cmd=(python -m cs336_systems.training_step.keep_blocks --world-size 2 --variant "$@")
    if [ -n "${TINY:-}" ]; then read -ra extra <<< "${TINY_FLAGS[keep_blocks]}"; cmd+=("${extra[@]}"); fi
    show "${cmd[@]}"
    if dry; then echo 0; else "${cmd[@]}"; fi
}

# -- which lines, checked before anything runs ------------------------------------------------------
usage="usage: $0 [1 2 3 shared | 1a 1b 1c 2a 2b 3a 3b shared_a shared_b ...] (default: 1 2 3)"
lines=()
for run in "${@:-1 2 3}"; do
    for r in $run; do
        case "$r" in
            1|2|3|shared) mapfile -t -O "${#lines[@]}" lines < <(declare -F | awk '{print $3}' | grep -E "^run_${r}_?[a-z]$" | sort) ;;
            1a|1b|1c|2a|2b|3a|3b|shared_a|shared_b) lines+=("run_$r") ;;
            -h|--help) echo "$usage"; exit 0 ;;
            *) echo "two_gpu_runs: unknown run '$r'; $usage" >&2; exit 2 ;;
        esac
    done
done
if [ -n "${TINY:-}" ]; then
    export CS336_RESULTS_DIR="${CS336_RESULTS_DIR:-$(mktemp -d -t two-gpu-runs-XXXXXX)}"
    TRACES="$CS336_RESULTS_DIR/traces"
    echo "two_gpu_runs: TINY rehearsal, rows under $CS336_RESULTS_DIR" >&2
elif dry; then
    TRACES="${OUT:-.}/traces"
else
    TRACES="${OUT:-.}/traces"  # the device tool brings back what is under $OUT
    gpus=$(python -c 'import torch; print(torch.cuda.device_count())')
    for line in "${lines[@]}"; do
        need=2; [[ $line == run_shared_* ]] && need=1
        if [ "$gpus" -lt "$need" ]; then
            echo "two_gpu_runs: ${line#run_} needs $need GPU(s), $gpus visible (TINY=1 rehearses on the CPU)" >&2
            exit 2
        fi
    done
fi

# A gate's failure skips the rest of its run (the big run would fail the same way, minutes later);
# any other failure lets the next line run: device time is scarce.
GATES=(run_shared_a)
failed=()
skip=""
for line in "${lines[@]}"; do
    if [ -n "$skip" ] && [[ $line == "$skip"* ]]; then
        echo "== ${line#run_}: skipped (${failed[-1]} failed)" >&2; failed+=("${line#run_}"); continue
    fi
    echo "== ${line#run_}" >&2
    if ! "$line"; then
        failed+=("${line#run_}")
        if [[ " ${GATES[*]} " == *" $line "* ]]; then skip="${line%_*}_"; fi
    fi
done
if [ "${#failed[@]}" -gt 0 ]; then
    echo "two_gpu_runs: failed: ${failed[*]}" >&2
    exit 1
fi
