#!/usr/bin/env bash
# Remakes tests/data/reference-models: the random-weight model of each family
# (make_reference_models, from the build) and llama.cpp's log-probabilities
# for them and for tests/data/stories260K.gguf (llama-perplexity
# --kl-divergence-base), which test_perplexity compares PhaseLab's with.
#
#   scripts/reference-logits.sh LLAMA_PERPLEXITY [BUILD_DIR]
#
# LLAMA_PERPLEXITY is a llama-perplexity binary built by you, outside this
# repository, from llama.cpp (the files here come from commit
# 84f712946729f8517c972da4eb80db810ffe3210, CPU build). Nothing of llama.cpp
# is kept here: only its output. Its exact path is used (no flash attention,
# F32 K/V: its flash attention rounds to F16 on the CPU), so that the files
# check PhaseLab to the 16-bit rounding of the file.
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_PPL=${1:?usage: scripts/reference-logits.sh LLAMA_PERPLEXITY [BUILD_DIR]}
BUILD=${2:-build}
OUT=tests/data/reference-models
[ -x "$LLAMA_PPL" ] || { echo "reference-logits: $LLAMA_PPL is not an executable llama-perplexity" >&2; exit 1; }
[ -x "$BUILD/tests/make_reference_models" ] || cmake --build "$BUILD" --target make_reference_models

"$BUILD/tests/make_reference_models" "$OUT"
run() {  # model text chunks out
  "$LLAMA_PPL" -m "$1" -f "$2" -c 64 -b 64 --chunks "$3" -t 2 -fa off -ctk f32 -ctv f32 --kl-divergence-base "$4" > "$4.log" 2>&1 ||
    { cat "$4.log" >&2; echo "reference-logits: llama-perplexity failed on $1" >&2; exit 1; }
  rm -f "$4.log"
  echo "$4"
}
for m in "$OUT"/*.gguf; do
  run "$m" "$OUT/text.txt" 3 "${m%.gguf}.kld"
done
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
head -c 3000 resources/text/eval-en.txt > "$tmp"
run tests/data/stories260K.gguf "$tmp" 4 "$OUT/stories260K.kld"
