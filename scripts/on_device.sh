#!/usr/bin/env bash
# Run a command on the GPU machine (the device tool) and pack what it changed under results/ into
# $OUT/results.tgz, with the log beside it. Usage: make the snapshot here (scripts/gpu_snapshot.sh),
# carry .gpu_snapshot, and as the device tool's command:
#   cd .gpu_snapshot && bash scripts/on_device.sh 'just-like-commands; ...'
# Then, here: bash scripts/unpack_results.sh <files_at>/results.tgz
set -uo pipefail
# The commit every row names: the one scripts/gpu_snapshot.sh wrote into the snapshot. A different
# CS336_GIT_COMMIT is refused before anything runs (it would mislabel every row).
if [ -f .commit ]; then
    snap=$(cat .commit)
    if [ -n "${CS336_GIT_COMMIT:-}" ] && [ "$CS336_GIT_COMMIT" != "$snap" ]; then
        echo "on_device: CS336_GIT_COMMIT=$CS336_GIT_COMMIT, but this snapshot is $snap (scripts/gpu_snapshot.sh wrote .commit); nothing ran" >&2
        exit 2
    fi
    export CS336_GIT_COMMIT="$snap"
fi
: "${OUT:?OUT is set by the device tool}"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
stamp=$(mktemp); sleep 1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'
} 2>&1 | tee "$OUT/env.txt"
bash -c "$1" 2>&1 | tee "$OUT/log.txt"
rc=${PIPESTATUS[0]}
find results -type f -newer "$stamp" -print0 | tar czf "$OUT/results.tgz" --null -T -
echo "changed results:"; tar tzf "$OUT/results.tgz"
exit "$rc"
