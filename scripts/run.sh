#!/usr/bin/env bash
# Installs what is missing, fetches the default model, builds, and starts
# PhaseLab: the desktop window when there is a display; without one, the
# terminal chat (`phaselab-cli chat`) when run from a terminal, else a one-shot
# `phaselab-cli generate` demo.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/install-deps.sh"
MODEL="$("$ROOT/scripts/fetch-model.sh")"
"$ROOT/scripts/build.sh"
BIN="${PHASELAB_BUILD_DIR:-$ROOT/build}/app"
if [[ -x "$BIN/gui/phaselab" && ( -n "${DISPLAY:-}" || -n "${WAYLAND_DISPLAY:-}" ) ]]; then
  exec "$BIN/gui/phaselab" --model "$MODEL" "$@"
fi
if [[ -t 0 && -t 1 ]]; then
  echo "run: no display found (DISPLAY is not set): starting the terminal chat instead" >&2
  exec "$BIN/phaselab-cli" chat -m "$MODEL" --temp 0.7 "$@"
fi
echo "run: no display and no terminal: running a one-shot demo (phaselab-cli generate)" >&2
exec "$BIN/phaselab-cli" generate -m "$MODEL" --chat -p "What is the capital of France?" -n 64 --temp 0 "$@"
