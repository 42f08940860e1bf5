#!/usr/bin/env bash
# Run a command on the GPU machine (the device tool) and pack what it changed under results/ into
# $OUT/results.tgz, with the log beside it. Usage (as the device tool's command):
#   CS336_GIT_COMMIT=<sha> bash scripts/on_device.sh 'just-like-commands; ...'
# Then, here: bash scripts/unpack_results.sh <files_at>/results.tgz
set -uo pipefail
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
