#!/usr/bin/env bash
# The whole set-up on a fresh machine, then every test:
# dependencies, the default model, a Release build, ctest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/install-deps.sh"
MODEL="$("$ROOT/scripts/fetch-model.sh")"
"$ROOT/scripts/build.sh"
export PHASELAB_DEFAULT_MODEL="$MODEL"
export QT_QPA_PLATFORM=offscreen
cd "${PHASELAB_BUILD_DIR:-$ROOT/build}"
ctest --output-on-failure --timeout 1500 "$@"
