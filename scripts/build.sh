#!/usr/bin/env bash
# Configures and builds PhaseLab (Release) into build/. Extra arguments go to
# CMake's configure step, e.g. -DPHASELAB_CUDA=OFF.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${PHASELAB_BUILD_DIR:-$ROOT/build}"
JOBS="${PHASELAB_JOBS:-$(nproc)}"
GEN=()
if command -v ninja >/dev/null && [[ ! -f "$BUILD_DIR/Makefile" ]]; then GEN=(-G Ninja); fi
cmake -S "$ROOT" -B "$BUILD_DIR" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release "$@" >&2
cmake --build "$BUILD_DIR" -j "$JOBS" >&2
