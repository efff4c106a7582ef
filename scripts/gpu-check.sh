#!/usr/bin/env bash
# One command for a machine with an NVIDIA GPU: build with CUDA for the local
# GPU's architecture, run the GPU tests, and benchmark the CUDA backend on the
# default model. Meant to finish in under 8 minutes.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${PHASELAB_GPU_BUILD_DIR:-$ROOT/build-gpu}"
export PATH="/usr/local/cuda/bin:$PATH"
OUT="${OUT:-$BUILD}"
mkdir -p "$OUT"

nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv | tee "$OUT/gpu.txt"
MODEL="${PHASELAB_DEFAULT_MODEL:-}"
if [[ -z "$MODEL" ]]; then
  MODEL="$("$ROOT/scripts/fetch-model.sh" 2>/dev/null || true)"
fi

cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPHASELAB_CUDA=ON -DPHASELAB_GUI=OFF \
      -DCMAKE_CUDA_ARCHITECTURES=native > "$OUT/configure.log"
cmake --build "$BUILD" -j "$(nproc)" --target phaselab_cuda phaselab-cli test_cuda > "$OUT/build.log"

export PHASELAB_DEFAULT_MODEL="$MODEL"
"$BUILD/app/phaselab-cli" devices | tee "$OUT/devices.txt"
"$BUILD/tests/test_cuda" 2>&1 | tee "$OUT/test_cuda.txt"
if [[ -n "$MODEL" && -f "$MODEL" ]]; then
  timeout 300 "$BUILD/app/phaselab-cli" bench -m "$MODEL" --backend cuda -p 512 -n 128 -r 5 | tee "$OUT/bench_cuda.md"
  timeout 120 "$BUILD/app/phaselab-cli" bench -m "$MODEL" --backend cuda -p 512 -n 128 -r 5 --json > "$OUT/bench_cuda.json"
else
  echo "gpu-check: the default model is not available here; skipped the benchmark" >&2
fi
