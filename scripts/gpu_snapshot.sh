#!/usr/bin/env bash
# Make .gpu_snapshot: a clean worktree of one commit to carry to the GPU machine (the device tool's
# `carry`), with the commit's id written into it (.gpu_snapshot/.commit). on_device.sh stamps every
# row with that id, so no one types it by hand (a hand-typed id once named a commit that does not
# exist). Usage: bash scripts/gpu_snapshot.sh [REV]   (default HEAD; commit first: only commits travel)
set -euo pipefail
rev="${1:-HEAD}"
cd "$(git rev-parse --show-toplevel)"
commit=$(git rev-parse --verify --quiet "$rev^{commit}") || { echo "gpu_snapshot: no commit named '$rev'" >&2; exit 2; }
exclude="$(git rev-parse --git-path info/exclude)"
mkdir -p "$(dirname "$exclude")"
grep -qxF "/.gpu_snapshot/" "$exclude" 2>/dev/null || echo "/.gpu_snapshot/" >> "$exclude"
git worktree remove --force .gpu_snapshot 2>/dev/null || rm -rf .gpu_snapshot
git worktree prune
git worktree add -q --detach .gpu_snapshot "$commit"
git rev-parse --short=12 "$commit" > .gpu_snapshot/.commit
echo "gpu_snapshot: .gpu_snapshot holds $(cat .gpu_snapshot/.commit); carry it and run:"
echo "  cd .gpu_snapshot && NCCL_NVLS_ENABLE=0 bash scripts/on_device.sh '<commands>'"
