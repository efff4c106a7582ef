#!/usr/bin/env bash
# Installs what is missing, fetches the default model, builds, and starts
# PhaseLab. Until the desktop window lands this starts `phaselab-cli chat`;
# on a machine without a terminal it runs a one-shot `phaselab-cli generate`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/install-deps.sh"
MODEL="$("$ROOT/scripts/fetch-model.sh")"
"$ROOT/scripts/build.sh"
BIN="${PHASELAB_BUILD_DIR:-$ROOT/build}/app"
if [[ -x "$BIN/phaselab" && ( -n "${DISPLAY:-}" || -n "${WAYLAND_DISPLAY:-}" ) ]]; then
  exec "$BIN/phaselab" --model "$MODEL" "$@"
fi
if [[ -t 0 && -t 1 ]]; then
  [[ -x "$BIN/phaselab" ]] && echo "run: no display found (DISPLAY is not set): starting the terminal chat instead" >&2
  exec "$BIN/phaselab-cli" chat -m "$MODEL" --temp 0.7 "$@"
fi
echo "run: no display and no terminal: running a one-shot demo (phaselab-cli generate)" >&2
exec "$BIN/phaselab-cli" generate -m "$MODEL" --chat -p "Write a haiku about the sea." -n 64 --temp 0 "$@"
