#!/usr/bin/env bash
# The attention GPU tests (report/gpu_tests.TEST_FILES) on the device, logged with provenance to
# results/attention/flash_gpu_tests/<device>-<commit>.log, the file the flash chapter reads.
# Run inside the snapshot, from scripts/on_device.sh:  bash scripts/attention/gpu_tests.sh [TIMEOUT_S]
set -uo pipefail
limit="${1:-400}"
commit="${CS336_GIT_COMMIT:?run through scripts/on_device.sh, which sets it}"
files=$(python3 -c 'from report import gpu_tests; print(" ".join(gpu_tests.TEST_FILES))')
log="results/attention/flash_gpu_tests/nvidia-h200-${commit}.log"
env=$(python3 -c 'import torch, triton; print(f"torch {torch.__version__}; triton {triton.__version__}; cuda {torch.version.cuda}")')
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)
{
  echo "# GPU pytest of the attention tests, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "# NVIDIA H200; ${env}; driver ${driver}; git ${commit}"
  echo "# command: python3 -m pytest -v -n 14 -rfE --timeout=240 -p no:cacheprovider -p no:randomly <report/gpu_tests.TEST_FILES> (timeout ${limit} s)"
  timeout "$limit" python3 -m pytest -v -n 14 -rfE --timeout=240 -p no:cacheprovider -p no:randomly $files 2>&1
} > "$log"
rc=$?
tail -3 "$log"
exit $rc
