#!/usr/bin/env bash
# One command for a CPU that has not been measured yet (an Intel Xeon above
# all): the figures issue 34's targets ask for, and every CPU switch of the
# decode and prefill paths in its two states, so that the defaults for that
# kind of CPU can be chosen by measurement. About 4 minutes on 2 cores with
# the default model and a llama-bench to alternate with (less without). Results go
# to $OUT (or build/cpu-check/) as text files; summary.md gathers them.
#
#   scripts/cpu-check.sh [MODEL]      (default: the default model, fetched)
#
# Environment:
#   PHASELAB_CLI                    the phaselab-cli to measure (default: build/app/phaselab-cli)
#   PHASELAB_REFERENCE_LLAMA_BENCH  a llama-bench to alternate with (built outside the
#                                   repository); the llama-batched-bench beside it too
#   THREADS                         threads for both (default: one per physical core)
#   CPU_CHECK_QUICK=1               tiny counts (the script's own test, on stories260K)
#
# Each switch is measured by `bench --ab`, which alternates its two states
# inside one process (token by token, or run by run for prefill), so that a
# machine whose speed drifts still compares them fairly; huge pages and
# the kernels' instruction set, load-time choices, alternate whole
# processes. Every figure comes with the placement line (a cache line's
# round trip between the first two CPUs: ~300 ns where they sit on two AMD
# CCDs). The script checks that every step printed its figures and exits
# 1, naming those missing, where one did not.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUTDIR="${OUT:-$ROOT/build/cpu-check}"
CLI="${PHASELAB_CLI:-$ROOT/build/app/phaselab-cli}"
LLAMA="${PHASELAB_REFERENCE_LLAMA_BENCH:-}"
if [[ -n "$LLAMA" ]]; then
  LLAMA="$(command -v "$LLAMA")" || { echo "cpu-check: no llama-bench at $PHASELAB_REFERENCE_LLAMA_BENCH" >&2; exit 2; }
fi
QUICK="${CPU_CHECK_QUICK:-0}"
mkdir -p "$OUTDIR"
[[ -x "$CLI" ]] || { echo "cpu-check: no phaselab-cli at $CLI: build first (scripts/build.sh) or set PHASELAB_CLI" >&2; exit 2; }
MODEL="${1:-${PHASELAB_DEFAULT_MODEL:-}}"
if [[ -z "$MODEL" ]]; then
  MODEL="$("$ROOT/scripts/fetch-model.sh")" || { echo "cpu-check: no model: pass one, or let scripts/fetch-model.sh fetch the default" >&2; exit 2; }
fi
[[ -f "$MODEL" ]] || { echo "cpu-check: no such model: $MODEL" >&2; exit 2; }
if [[ -n "${THREADS:-}" ]]; then
  [[ "$THREADS" =~ ^[1-9][0-9]*$ ]] || { echo "cpu-check: THREADS must be a positive number (got '$THREADS')" >&2; exit 2; }
else  # one per physical core, as bench's default; nproc where lscpu is missing
  THREADS=$(lscpu -p=core,socket 2>/dev/null | grep -v '^#' | sort -u | wc -l)
  [[ "$THREADS" -ge 1 ]] || THREADS=$(nproc)
fi

if [[ "$QUICK" == 1 ]]; then
  PP=32; TG=8; DEPTHS=0,32; REPS=1; LONG=64; ROUNDS=1; BATCH=1,2; BPP=16; BTG=4; CTX=(-c 256)
else
  PP=512; TG=128; DEPTHS=0,2000; REPS=3; LONG=1938; ROUNDS=2; BATCH=1,16; BPP=128; BTG=32; CTX=()
fi
B=("$CLI" bench -m "$MODEL" -t "$THREADS")
# bench's figures: its table rows, the fractions of the machine's limits,
# the A/B ratios and the placement line (without its legend).
keep() { grep -E "^\| |^machine:|^pp|^tg|^sg|^A/B|^threads:|error" | sed 's/ (~35 ns.*//'; }

{
  echo "date: $(date -u +%FT%TZ)"
  echo "commit: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "model: $MODEL"
  echo "threads: $THREADS"
  lscpu 2>/dev/null | grep -E "^(Model name|Vendor ID|CPU family|Model|Stepping|CPU\(s\)|Thread|Core|Socket|L1d|L2|L3|NUMA node\(s\)|Hypervisor)" \
    || echo "Model name: $(grep -m1 '^model name' /proc/cpuinfo | sed 's/^model name[[:space:]]*: *//') (no lscpu)"
  echo "flags: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -x -E 'avx2|avx512f|avx512_vnni|avx_vnni|avx512_bf16|amx_tile|amx_int8' | tr '\n' ' ')"
  echo "transparent huge pages: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null || echo unknown)"
  echo "kernel: $(uname -r)"
} > "$OUTDIR/machine.txt"
cat "$OUTDIR/machine.txt"

# 1. The targets' figures, alternating with llama.cpp where it is given:
#    pp and tg at depth 0 and 2000 with their fraction of the machine's
#    limits, and a long prompt.
series="$OUTDIR/series.txt"
: > "$series"
: > "$OUTDIR/llama.txt"
for r in $(seq 1 "$ROUNDS"); do
  echo "=== round $r $(date +%T)" >> "$series"
  if [[ -n "$LLAMA" ]]; then
    timeout 300 "$LLAMA" -m "$MODEL" -p "$PP" -n "$TG" -d "$DEPTHS" -r "$REPS" -t "$THREADS" 2>&1 | grep -E "^\|" \
      | tee -a "$OUTDIR/llama.txt" >> "$series"
    timeout 300 "$LLAMA" -m "$MODEL" -p "$LONG" -n 0 -r "$REPS" -t "$THREADS" 2>&1 | grep -E "pp$LONG" \
      | tee -a "$OUTDIR/llama.txt" >> "$series"
  fi
  timeout 300 "${B[@]}" ${CTX[@]+"${CTX[@]}"} -p "$PP" -n "$TG" -d "$DEPTHS" -r "$REPS" 2>&1 | keep >> "$series"
  timeout 300 "${B[@]}" -p "$LONG" -n 0 -r "$REPS" --no-peaks 2>&1 | keep >> "$series"
done
cat "$series"

# 2. Each switch in its two states (bench --ab): decode's on tg, row tiles on pp.
switches="$OUTDIR/switches.txt"
: > "$switches"
DECODE_SWITCHES=(decode-rows prefetch-l2 prefetch=4096 prefetch=16384 stream-prefetch=0 stream-prefetch=8192
                 stream-ways=1 stream-ways=4 stream-chunks=1 stream-chunks=8)
for s in "${DECODE_SWITCHES[@]}"; do
  echo "=== --ab $s" >> "$switches"
  timeout 120 "${B[@]}" ${CTX[@]+"${CTX[@]}"} -p 0 -n "$TG" -r "$REPS" --no-peaks --ab "$s" 2>&1 | keep | grep -E "^A/B|^threads:|error" >> "$switches"
done
echo "=== --ab row-tiles" >> "$switches"
timeout 120 "${B[@]}" ${CTX[@]+"${CTX[@]}"} -p "$PP" -n 0 -r "$REPS" --no-peaks --ab row-tiles 2>&1 | keep | grep -E "^A/B|^threads:|error" >> "$switches"
# Huge pages for the repacked weights: whole processes, alternating.
for r in $(seq 1 "$REPS"); do
  for hp in 0 1; do
    echo "=== PHASELAB_CPU_HUGEPAGES=$hp, run $r" >> "$switches"
    PHASELAB_CPU_HUGEPAGES=$hp timeout 120 "${B[@]}" ${CTX[@]+"${CTX[@]}"} -p 0 -n "$TG" -r 1 --no-peaks 2>&1 \
      | keep | grep -E "^\| .*tg$TG|^threads:|error" >> "$switches"
  done
done
cat "$switches"
# The kernels' instruction set: the best this CPU has against the lower
# ones it also runs (PHASELAB_CPU_ISA caps the choice at load): where
# AVX-512 lowers a core's clock, the 256-bit kernels can be the faster.
isa="$OUTDIR/isa.txt"
: > "$isa"
ISAS=(best avx2)
grep -m1 '^flags' /proc/cpuinfo | grep -q -w avx_vnni && ISAS+=(avx-vnni)
for r in $(seq 1 "$REPS"); do
  for i in "${ISAS[@]}"; do
    if [[ "$i" == best ]]; then
      label="the best kernels (no PHASELAB_CPU_ISA)" cap=()
    else
      label="PHASELAB_CPU_ISA=$i" cap=(env "PHASELAB_CPU_ISA=$i")
    fi
    echo "=== $label, run $r" >> "$isa"
    ${cap[@]+"${cap[@]}"} timeout 120 "${B[@]}" ${CTX[@]+"${CTX[@]}"} -p "$PP" -n "$TG" -r 1 --no-peaks 2>&1 \
      | keep | grep -E "^\| .*(pp$PP|tg$TG) \||^threads:|error" >> "$isa"
  done
done
cat "$isa"

# 3. Batched decode (against llama-batched-bench where given) and sampled decode.
other="$OUTDIR/batch-sampled.txt"
: > "$other"
LLAMA_BATCHED="${LLAMA:+$(dirname "$LLAMA")/llama-batched-bench}"
[[ -n "$LLAMA_BATCHED" && ! -x "$LLAMA_BATCHED" ]] && echo "(no llama-batched-bench beside $LLAMA: batched decode without llama.cpp's)" >> "$other"
if [[ -n "$LLAMA_BATCHED" && -x "$LLAMA_BATCHED" ]]; then
  timeout 300 "$LLAMA_BATCHED" -m "$MODEL" -c 8192 -b 2048 -ub 512 -npp "$BPP" -ntg "$BTG" -npl "$BATCH" -t "$THREADS" 2>&1 \
    | grep -E "^\|" >> "$other"
fi
timeout 300 "${B[@]}" --batch "$BATCH" -p "$BPP" -n "$BTG" --no-peaks 2>&1 | keep >> "$other"
for r in $(seq 1 "$REPS"); do
  timeout 120 "${B[@]}" ${CTX[@]+"${CTX[@]}"} -p 0 -n "$TG" -r "$REPS" --no-peaks --sampled 2>&1 | keep | grep -E "greedy|t=1|^threads:|error" >> "$other"
done
cat "$other"

# 4. The summary, and a check that every step printed its figures.
missing=()
grep -q "| tg$TG |" "$series" || missing+=("tg$TG")
grep -q "| pp$PP |" "$series" || missing+=("pp$PP")
grep -q "^tg$TG: .* of the machine's read bandwidth" "$series" || missing+=("tg$TG's fraction of the read bandwidth")
grep -q "| pp$LONG |" "$series" || missing+=("pp$LONG")
for s in "${DECODE_SWITCHES[@]}" row-tiles; do
  # (the A/B line within the switch's own section)
  awk -v h="=== --ab $s" '$0 == h { f = 1; next } /^===/ { f = 0 } f && /^A\/B/ { ok = 1 } END { exit !ok }' "$switches" \
    || missing+=("--ab $s")
done
[[ $(grep -c "| tg$TG |" "$switches") -eq $((2 * REPS)) ]] || missing+=("huge pages on and off")
[[ $(grep -c "| tg$TG |" "$isa") -eq $((${#ISAS[@]} * REPS)) && $(grep -c "| pp$PP |" "$isa") -eq $((${#ISAS[@]} * REPS)) ]] \
  || missing+=("the instruction sets ${ISAS[*]}")
# (bench --batch's rows: model | backend | threads | batch | pp | tg ...; the largest batch's)
awk -F'|' -v b="${BATCH##*,}" '$3 ~ /cpu/ && $5 + 0 == b && $7 ~ /[0-9]/ { ok = 1 } END { exit !ok }' "$other" \
  || missing+=("--batch $BATCH")
[[ $(grep -c "| tg$TG t=1" "$other") -eq "$REPS" && $(grep -c "| tg$TG greedy" "$other") -eq "$REPS" ]] || missing+=("--sampled")
if [[ -n "$LLAMA" ]]; then
  for t in "pp$PP" "tg$TG" "pp$LONG"; do
    [[ $(grep -c -E "\| +$t \|" "$OUTDIR/llama.txt") -eq "$ROUNDS" ]] || missing+=("llama-bench's $t")
  done
  if [[ -x "$LLAMA_BATCHED" ]]; then
    grep -q -E "^\| +$BPP \| +$BTG \| +${BATCH##*,} \|" "$other" || missing+=("llama-batched-bench's batch ${BATCH##*,}")
  fi
fi
{
  echo "# cpu-check: $(grep -m1 '^Model name' "$OUTDIR/machine.txt" | sed 's/Model name: *//'), $(date -u +%F)"
  echo
  echo '```'
  cat "$OUTDIR/machine.txt"
  echo '```'
  echo
  echo "## The targets' figures (series.txt)"
  echo '```'
  grep -E "^===|pp$PP|tg$TG|pp$LONG|^threads:|^machine:" "$series"
  echo '```'
  echo
  echo "## Switches: on / off, or the setting / the one in effect (switches.txt)"
  echo '```'
  grep -E "^===|^A/B|^\| .*tg$TG \||^threads:" "$switches" \
    | sed 's/^threads: a cache line between the first two CPUs this process may use and back took /placement: a round trip of /'
  echo '```'
  echo
  echo "## The kernels' instruction set, alternating processes (isa.txt; the backend column names it)"
  echo '```'
  grep -E "^===|^\| " "$isa"
  echo '```'
  echo
  echo "## Batched and sampled decode (batch-sampled.txt)"
  echo '```'
  cat "$other"
  echo '```'
  if ((${#missing[@]})); then
    echo
    echo "MISSING: ${missing[*]}"
  fi
} > "$OUTDIR/summary.md"
echo "cpu-check: the results are in $OUTDIR (summary.md)"
if ((${#missing[@]})); then
  echo "cpu-check: these steps printed no figures: ${missing[*]} (see the files in $OUTDIR)" >&2
  exit 1
fi
