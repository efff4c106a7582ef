#!/usr/bin/env bash
# One command for a machine with an NVIDIA GPU: the GPU tests (CUDA against
# the CPU reference) and phaselab-cli bench --backend cuda, in under 8 minutes.
#
# Two ways to run:
#  - from a bundle prepared on a development machine (scripts/gpu-bundle.sh;
#    carry gpu-bundle/): for GPU machines without the project's libraries or a
#    network. The default model cannot travel (241 MiB), so the benchmark runs
#    on its shape twin, built here from the bundled spec: same tensors, types
#    and shapes, random weights, hence the same work and speed.
#  - without a bundle: builds from source for the local GPU (needs the
#    packages scripts/install-deps.sh installs) and benchmarks the real model.
# Results go to $OUT (or build-gpu/) as text files.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUTDIR="${OUT:-$ROOT/build-gpu}"
mkdir -p "$OUTDIR"
export PATH="/usr/local/cuda/bin:$PATH"
nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv | tee "$OUTDIR/gpu.txt"

if [[ -f "$ROOT/gpu-bundle/bin.tar.xz" ]]; then
  BIN=/tmp/phaselab-gpu/bin
  mkdir -p /tmp/phaselab-gpu && tar -C /tmp/phaselab-gpu -xJf "$ROOT/gpu-bundle/lib.tar.xz" \
    && tar -C /tmp/phaselab-gpu -xJf "$ROOT/gpu-bundle/bin.tar.xz"
  # cudart and cuBLAS come from the machine: the CUDA toolkit, or the
  # nvidia-* Python wheels of a PyTorch image.
  CUDA_LIBS="/usr/local/cuda/lib64"
  for d in $(python3 -c 'import glob, site; print(" ".join(d for p in site.getsitepackages() for d in glob.glob(p + "/nvidia/*/lib")))' 2>/dev/null); do
    CUDA_LIBS="$CUDA_LIBS:$d"
  done
  export LD_LIBRARY_PATH="/tmp/phaselab-gpu/lib:$CUDA_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  MODEL=""
  if [[ -f "$ROOT/gpu-bundle/default-model.twin.gguf" ]]; then
    MODEL=/tmp/default-model-twin.gguf
    "$BIN/phaselab-cli" twin build "$ROOT/gpu-bundle/default-model.twin.gguf" "$MODEL" 2>&1 | tee "$OUTDIR/twin.txt"
  fi
  MOE_SPECS=("$ROOT"/gpu-bundle/moe-model*.twin.gguf)
  TEST_CUDA="$BIN/test_cuda"
  TEST_CUDA_OPS="$BIN/test_cuda_ops"
else
  BUILD="${PHASELAB_GPU_BUILD_DIR:-$ROOT/build-gpu}"
  GEN=(); command -v ninja >/dev/null && GEN=(-G Ninja)
  cmake -S "$ROOT" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DPHASELAB_CUDA=ON -DPHASELAB_GUI=OFF \
        -DPHASELAB_CUDA_EMULATOR=OFF -DCMAKE_CUDA_ARCHITECTURES=native > "$OUTDIR/configure.log" 2>&1 || { tail -20 "$OUTDIR/configure.log"; exit 1; }
  cmake --build "$BUILD" -j "$(nproc)" --target phaselab_cuda phaselab-cli test_cuda test_cuda_ops > "$OUTDIR/build.log" 2>&1 \
    || { tail -40 "$OUTDIR/build.log"; exit 1; }
  BIN="$BUILD/app"
  TEST_CUDA="$BUILD/tests/test_cuda"
  TEST_CUDA_OPS="$BUILD/tests/test_cuda_ops"
  MODEL="${PHASELAB_DEFAULT_MODEL:-$("$ROOT/scripts/fetch-model.sh" 2>/dev/null || true)}"
fi

"$BIN/phaselab-cli" devices 2>&1 | tee "$OUTDIR/devices.txt"
# Each kernel first (the cheapest place to find a bug), then the default
# model's figures (the targets), then whole models against the CPU, then the
# variants. Every step has its own limit, so that one that hangs costs its
# limit and not the rest: the whole stays under 8 minutes.
timeout 90 "$TEST_CUDA_OPS" 2>&1 | tee "$OUTDIR/test_cuda_ops.txt"
if [[ -n "$MODEL" && -f "$MODEL" ]]; then
  timeout 90 "$BIN/phaselab-cli" bench -m "$MODEL" --backend cuda -p 512 -n 128 -r 5 --json \
    > "$OUTDIR/bench_cuda.json" 2> "$OUTDIR/bench_cuda.err"
  cat "$OUTDIR/bench_cuda.json" "$OUTDIR/bench_cuda.err"
fi
# PHASELAB_DEFAULT_MODEL: test_cuda compares the (twin) default model too.
PHASELAB_DEFAULT_MODEL="$MODEL" timeout 150 "$TEST_CUDA" 2>&1 | tee "$OUTDIR/test_cuda.txt"
timeout 30 "$BIN/phaselab-cli" bench -m "$ROOT/tests/data/stories260K.gguf" --backend cuda -p 512 -n 128 -r 3 \
  2>&1 | tee "$OUTDIR/bench_stories.md"
if [[ -n "$MODEL" && -f "$MODEL" ]]; then
  # The choices to be made by measurement: decode with and without the CUDA
  # graph, prefill through cuBLAS (default) and through the matrix-vector
  # kernel alone.
  {
    echo "## where the time goes (PHASELAB_CUDA_PROFILE=1: every step timed alone, no graph)"
    PHASELAB_CUDA_PROFILE=1 timeout 30 "$BIN/phaselab-cli" bench -m "$MODEL" --backend cuda -p 512 -n 32 -r 1 2>&1
    echo "## batched decode: one pass for many sequences, a graph per batch-size bucket"
    timeout 45 "$BIN/phaselab-cli" bench -m "$MODEL" --backend cuda --batch 1,4,16,64 -p 128 -n 32 2>&1
    echo "## at depth 2000 (a 2000-token context before the pp512 and tg128)"
    timeout 45 "$BIN/phaselab-cli" bench -m "$MODEL" --backend cuda -p 512 -n 128 -d 2000 -r 3 2>&1
    echo "## decode without the integer path (PHASELAB_CUDA_Q8=0: float matrix-vector products)"
    PHASELAB_CUDA_Q8=0 timeout 30 "$BIN/phaselab-cli" bench -m "$MODEL" --backend cuda -p 0 -n 128 -r 3 2>&1
    echo "## prefill without resident BF16 weights (PHASELAB_CUDA_BF16_WEIGHTS=0: slabs dequantized per pass)"
    PHASELAB_CUDA_BF16_WEIGHTS=0 timeout 30 "$BIN/phaselab-cli" bench -m "$MODEL" --backend cuda -p 512 -n 0 -r 3 2>&1
    echo "## decode without programmatic dependent launch (PHASELAB_CUDA_PDL=0: each kernel launched after the last ends)"
    PHASELAB_CUDA_PDL=0 timeout 30 "$BIN/phaselab-cli" bench -m "$MODEL" --backend cuda -p 0 -n 128 -r 3 2>&1
    echo "## decode with fused tails (PHASELAB_CUDA_FUSED_TAILS: 1 norms, 2 RoPE, 4 FFN 8-bit copy, 8 attention merge)"
    for round in 1 2 3; do  # alternating: one process per figure, each mask once a round
      for tails in 0 4 8 12; do
        echo "round $round, tails $tails: $(PHASELAB_CUDA_FUSED_TAILS=$tails timeout 30 "$BIN/phaselab-cli" bench -m "$MODEL" --backend cuda -p 0 -n 128 -r 3 2>&1 | grep '| tg128' | awk -F'|' '{print $8}')"
      done
    done
    echo "## sampled decode (t=1 top-p 0.95 against greedy): draws on the GPU, then on the host (PHASELAB_CUDA_SAMPLING=0)"
    for round in 1 2; do
      for on in 1 0; do
        echo "round $round, device sampling $on:"
        PHASELAB_CUDA_SAMPLING=$on timeout 30 "$BIN/phaselab-cli" bench -m "$MODEL" --backend cuda -p 0 -n 128 -r 3 --sampled 2>&1 | grep '| tg128'
      done
    done
    echo "## decode without the CUDA graph (PHASELAB_CUDA_GRAPHS=0)"
    PHASELAB_CUDA_GRAPHS=0 timeout 30 "$BIN/phaselab-cli" bench -m "$MODEL" --backend cuda -p 0 -n 128 -r 3 2>&1
    echo "## prefill without cuBLAS (PHASELAB_CUDA_GEMM_MIN=100000)"
    PHASELAB_CUDA_GEMM_MIN=100000 timeout 30 "$BIN/phaselab-cli" bench -m "$MODEL" --backend cuda -p 512 -n 0 -r 3 2>&1
    echo "## prefill in passes of 64 tokens rather than 512 (-b 64, the CPU backend's passes for models from ~1B parameters on)"
    timeout 30 "$BIN/phaselab-cli" bench -m "$MODEL" --backend cuda -p 512 -n 0 -r 3 -b 64 2>&1
    echo "## prefill attention without query tiles (PHASELAB_CUDA_ATTN_TILED=0)"
    PHASELAB_CUDA_ATTN_TILED=0 timeout 30 "$BIN/phaselab-cli" bench -m "$MODEL" --backend cuda -p 512 -n 0 -r 3 2>&1
  } | tee "$OUTDIR/bench_cuda_variants.md"
else
  echo "gpu-check: no default model (or twin) here; benchmarked stories260K only" >&2
fi
# Another engine on the same model and GPU, alternating with PhaseLab, where
# PHASELAB_REFERENCE_LLAMA_BENCH names a llama.cpp llama-bench built for
# this GPU (the project neither ships nor builds one: bring your own).
if [[ -n "${PHASELAB_REFERENCE_LLAMA_BENCH:-}" && -x "$PHASELAB_REFERENCE_LLAMA_BENCH" && -n "$MODEL" && -f "$MODEL" ]]; then
  {
    for round in 1 2; do
      echo "## round $round: PhaseLab (bench --backend cuda -p 512 -n 128 -r 5)"
      timeout 60 "$BIN/phaselab-cli" bench -m "$MODEL" --backend cuda -p 512 -n 128 -r 5 2>&1 | grep -E '\| (pp|tg)'
      echo "## round $round: llama-bench (-p 512 -n 128 -r 5 -ngl 99)"
      timeout 90 "$PHASELAB_REFERENCE_LLAMA_BENCH" -m "$MODEL" -p 512 -n 128 -r 5 -ngl 99 2>>"$OUTDIR/llama-bench.err"
    done
    echo "## at depth 2000: PhaseLab, then llama-bench (-d 2000)"
    timeout 60 "$BIN/phaselab-cli" bench -m "$MODEL" --backend cuda -p 512 -n 128 -d 2000 -r 3 2>&1 | grep -E '\| (pp|tg)'
    timeout 90 "$PHASELAB_REFERENCE_LLAMA_BENCH" -m "$MODEL" -p 512 -n 128 -d 2000 -r 3 -ngl 99 2>>"$OUTDIR/llama-bench.err"
  } 2>&1 | tee "$OUTDIR/reference.md"
fi
# Mixture-of-experts twins, where the bundle has their specs (gpu-bundle.sh's
# PHASELAB_MOE_MODEL): each built here, then prefill and decode on the GPU.
for MOE_SPEC in "${MOE_SPECS[@]:-}"; do
  [[ -n "$MOE_SPEC" && -f "$MOE_SPEC" ]] || continue
  {
    echo "## mixture of experts: $(basename "$MOE_SPEC")"
    timeout 120 "$BIN/phaselab-cli" twin build "$MOE_SPEC" /tmp/moe-twin.gguf 2>&1
    timeout 60 "$BIN/phaselab-cli" bench -m /tmp/moe-twin.gguf --backend cuda -p 512 -n 128 -r 3 2>&1
    PHASELAB_CUDA_PROFILE=1 timeout 60 "$BIN/phaselab-cli" bench -m /tmp/moe-twin.gguf --backend cuda -p 512 -n 32 -r 1 2>&1
    rm -f /tmp/moe-twin.gguf
  } | tee -a "$OUTDIR/bench_moe.md"
done
