#!/usr/bin/env bash
# The whole set-up on a fresh machine, then every test:
# dependencies, the default model, a Release build, ctest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/install-deps.sh"
MODEL="$("$ROOT/scripts/fetch-model.sh")"
"$ROOT/scripts/build.sh"
# A package installed by hand must not hide a broken fresh set-up.
"$ROOT/scripts/check-deps.sh" "${PHASELAB_BUILD_DIR:-$ROOT/build}"
export PHASELAB_DEFAULT_MODEL="$MODEL"
export QT_QPA_PLATFORM=offscreen
cd "${PHASELAB_BUILD_DIR:-$ROOT/build}"
rc=0
ctest --output-on-failure --timeout 1500 "$@" || rc=$?
# Nothing is skipped silently: each suite's skipped checks and their reasons
# (e.g. the CUDA tests on a machine without a GPU).
if grep -q "^SKIP" Testing/Temporary/LastTest.log 2>/dev/null; then
  echo "Skipped checks (count, suite: reason):"
  python3 - Testing/Temporary/LastTest.log <<'PY'
import collections, re, sys
counts = collections.Counter()
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"SKIP +: (\w+)::\w+\(", line)
    if not m:
        continue
    depth, i = 1, m.end()  # skip the data tag, which may hold parentheses
    while i < len(line) and depth:
        depth += {"(": 1, ")": -1}.get(line[i], 0)
        i += 1
    counts[f"{m.group(1)}: {line[i:].strip()}"] += 1
for what, n in sorted(counts.items()):
    print(f"{n:6d} {what}")
PY
fi
exit "$rc"
