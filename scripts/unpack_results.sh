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

# A .jsonl store is appended to, never replaced: the archive holds the whole file as the device had
# it (the snapshot's rows plus the run's), and a later call from the same snapshot holds the same
# older rows without an earlier call's, so extracting over the file would drop that call's rows.
# Lines the file lacks are added, in the archive's order; other files are written as they are.
# (So a row deleted here after the snapshot was taken comes back with the archive: delete it again.)
python3 - "$archive" "$root" <<'EOF'
import sys
import tarfile
from pathlib import Path

archive, root = sys.argv[1], Path(sys.argv[2])
with tarfile.open(archive) as tar:
    for member in tar.getmembers():
        if not member.isfile():
            continue
        path = root / member.name
        data = tar.extractfile(member).read().decode()
        if path.suffix == ".jsonl" and path.exists():
            have = path.read_text()
            known = set(have.splitlines())
            new = [line for line in data.splitlines() if line and line not in known]
            if new:
                path.write_text(have + ("\n" if have and not have.endswith("\n") else "") + "\n".join(new) + "\n")
            print(f"{member.name}: {len(new)} new rows")
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(data)
            print(member.name)
EOF
