#!/usr/bin/env bash
# Unpack results.tgz fetched from the GPU machine over the repository's results/ (only the files the
# run changed travel, so results of other runs are untouched). on_device.sh packs plain files under
# results/ and nothing else, so anything else in the archive (another path, an absolute path, '..',
# a link, a device) is refused before a single file is written: the archive cannot overwrite code.
set -euo pipefail
archive="${1:?path to results.tgz}"
root="$(git rev-parse --show-toplevel)"

python3 - "$archive" <<'EOF'
import sys
import tarfile
from pathlib import PurePosixPath

bad = []
with tarfile.open(sys.argv[1]) as tar:
    for member in tar.getmembers():
        parts = PurePosixPath(member.name).parts  # './results/x' -> ('results', 'x')
        if member.name.startswith("/") or ".." in parts or parts[:1] != ("results",):
            bad.append(f"{member.name} (not under results/)")
        elif not (member.isfile() or member.isdir()):
            bad.append(f"{member.name} (not a plain file or directory)")
if bad:
    print(f"unpack_results: refusing {sys.argv[1]}: it holds entries other than plain files under "
          f"results/ (nothing was extracted):", *bad, sep="\n  ", file=sys.stderr)
    sys.exit(1)
EOF
tar xzvf "$archive" -C "$root" --no-same-owner
