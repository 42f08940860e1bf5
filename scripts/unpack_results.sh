#!/usr/bin/env bash
# Unpack results.tgz fetched from the GPU machine over the repository's results/ (only the files the
# run changed travel, so results of other runs are untouched).
set -euo pipefail
tar xzvf "${1:?path to results.tgz}" -C "$(git rev-parse --show-toplevel)"
