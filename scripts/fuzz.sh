#!/usr/bin/env bash
# Fuzzes the engine's input side with libFuzzer + ASan + UBSan:
#   fuzz_gguf           GGUF reader, ModelConfig, tokenizer construction, Model tensor checks
#   fuzz_tokenizer      encode and (incremental) decode, SentencePiece and byte-level BPE
#   fuzz_chat_template  chat template detection and rendering
#   fuzz_http           the HTTP/1.1 request reader (limits, chunked bodies, pipelining)
#
#   scripts/fuzz.sh [SECONDS]     (default 30 per target)
#
# Configures and builds build-fuzz/ (clang; engine sources only; installs
# nothing: clang comes from scripts/install-deps.sh), replays every case in
# tests/fuzz/regressions/<target>/ (none may fail), then runs each target
# for SECONDS on its seeds (tests/fuzz/corpus/<target>/, never written to;
# new inputs go to build-fuzz/corpus/<target>/). Exits non-zero on any
# crash, sanitizer report or failed check, naming the reproducer.
# Environment: FUZZ_JOBS (build jobs, default 1), FUZZ_ARGS (extra libFuzzer
# options). Longer runs: tests/fuzz/README.md.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SECONDS_PER_TARGET=${1:-30}
if ! [[ "$SECONDS_PER_TARGET" =~ ^[0-9]+$ ]]; then
  echo "usage: scripts/fuzz.sh [SECONDS]   (seconds per target, default 30)" >&2
  exit 2
fi
BUILD="$ROOT/build-fuzz"
TARGETS=(fuzz_gguf fuzz_tokenizer fuzz_chat_template fuzz_http)

CXX_BIN=${FUZZ_CXX:-clang++}
if ! command -v "$CXX_BIN" >/dev/null; then
  echo "fuzz.sh: $CXX_BIN not found (scripts/install-deps.sh installs clang)" >&2
  exit 1
fi

if [[ ! -f "$BUILD/build.ninja" ]]; then
  cmake -S "$ROOT/tests/fuzz" -B "$BUILD" -G Ninja -DCMAKE_CXX_COMPILER="$CXX_BIN" >/dev/null
fi
ninja -C "$BUILD" -j"${FUZZ_JOBS:-1}" "${TARGETS[@]}"

export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1:allocator_may_return_null=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
COMMON=(-timeout=20 -rss_limit_mb=2560 -print_final_stats=0)

fail=0
# 1. Regressions: every input that ever crashed a target, replayed once.
for t in "${TARGETS[@]}"; do
  dir="$ROOT/tests/fuzz/regressions/$t"
  [[ -d "$dir" ]] || continue
  n=0
  while IFS= read -r -d '' f; do
    n=$((n + 1))
    if ! "$BUILD/$t" "${COMMON[@]}" "$f" >"$BUILD/$t.regression.log" 2>&1; then
      echo "fuzz.sh: $t FAILS on regression case $f (log: $BUILD/$t.regression.log)" >&2
      tail -n 30 "$BUILD/$t.regression.log" >&2
      fail=1
    fi
  done < <(find "$dir" -type f ! -name '*.md' -print0 | sort -z)
  echo "fuzz.sh: $t: $n regression cases replayed"
done
if [[ $fail -ne 0 ]]; then exit 1; fi

# 2. Fuzzing, SECONDS per target.
[[ "$SECONDS_PER_TARGET" -eq 0 ]] && exit 0
for t in "${TARGETS[@]}"; do
  work="$BUILD/corpus/$t"
  artifacts="$BUILD/artifacts/$t"
  mkdir -p "$work" "$artifacts"
  log="$BUILD/$t.log"
  echo "fuzz.sh: $t for ${SECONDS_PER_TARGET}s (log: $log)"
  # shellcheck disable=SC2086
  if "$BUILD/$t" "${COMMON[@]}" -max_total_time="$SECONDS_PER_TARGET" -artifact_prefix="$artifacts/" \
      ${FUZZ_ARGS:-} "$work" "$ROOT/tests/fuzz/corpus/$t" >"$log" 2>&1; then
    grep -E '^(#[0-9]+ +DONE|Done [0-9]+ runs)' "$log" | tail -n 1 | sed "s/^/fuzz.sh: $t: /" || true
  else
    fail=1
    echo "fuzz.sh: $t CRASHED (log: $log)" >&2
    grep -E 'ERROR: |runtime error|fuzz check failed|SUMMARY' "$log" | head -n 5 >&2 || true
    grep -o 'Test unit written to .*' "$log" | sed 's/^Test unit written to /fuzz.sh: reproducer: /' >&2 || true
    echo "fuzz.sh: replay with $BUILD/$t REPRODUCER; once fixed, keep it in tests/fuzz/regressions/$t/" >&2
  fi
done
exit $fail
