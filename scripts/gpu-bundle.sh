#!/usr/bin/env bash
# Prepares, on a development machine, what scripts/gpu-check.sh needs on a GPU
# machine that has neither the project's libraries (Qt, spdlog, PCRE2) nor a
# network: the CUDA build for Hopper (sm_90) of phaselab-cli,
# libphaselab_cuda.so and test_cuda, the shared libraries they load that a
# CUDA image lacks, and a shape twin spec of the default model (its metadata
# and tensor shapes, no weights: the model itself is too large to travel).
# Output: gpu-bundle/ (ignored by git; name it in the device run's `carry`).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="$ROOT/build-gpu"
OUT="$ROOT/gpu-bundle"
ARCH="${PHASELAB_CUDA_ARCH:-90}"
export PATH="/usr/local/cuda/bin:$PATH"

cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPHASELAB_CUDA=ON -DPHASELAB_GUI=OFF -DPHASELAB_CUDA_EMULATOR=OFF \
      -DCMAKE_CUDA_ARCHITECTURES="$ARCH" >&2
cmake --build "$BUILD" -j "$(nproc)" --target phaselab-cli phaselab_cuda test_cuda test_cuda_ops fake_cuda_library_1 fake_cuda_library_2 fake_cuda_library_3 >&2

rm -rf "$OUT"
mkdir -p "$OUT/bin" "$OUT/lib"
cp "$BUILD/app/phaselab-cli" "$BUILD/tests/test_cuda" "$BUILD/tests/test_cuda_ops" "$OUT/bin/"
cp "$BUILD/kernels/libphaselab_cuda.so" "$OUT/bin/"   # found next to the executable
# test_cuda's libraries of another interface (it looks beside itself too).
cp "$BUILD"/tests/libfake_cuda_library_*.so "$OUT/bin/"
# The libraries a CUDA image is not expected to have: everything but the C
# runtime, libstdc++/libgcc (the GPU machine's are newer), the driver and the
# CUDA toolkit's own (cudart, cuBLAS: hundreds of MiB, and a CUDA image has
# them; gpu-check.sh finds them there).
for exe in "$OUT/bin/phaselab-cli" "$OUT/bin/test_cuda" "$OUT/bin/test_cuda_ops" "$OUT/bin/libphaselab_cuda.so"; do
  ldd "$exe" | awk '/=> \//{print $3}'
done | sort -u | grep -v -E '/(libc|libm|libdl|librt|libpthread|ld-linux.*|libgcc_s|libstdc\+\+|libcuda|libcudart|libcublas|libcublasLt)\.so' \
  | while read -r lib; do cp -L "$lib" "$OUT/lib/"; done
# Compressed: the carried files may total 64 MiB with the working tree (ICU's
# data alone is 30 MiB; the executables' GPU code compresses well too).
tar -C "$OUT" -cJf "$OUT/lib.tar.xz" lib && rm -rf "$OUT/lib"

MODEL="$("$ROOT/scripts/fetch-model.sh" 2>/dev/null || true)"
if [[ -n "$MODEL" ]]; then
  "$BUILD/app/phaselab-cli" twin export "$MODEL" "$OUT/default-model.twin.gguf"
fi
# Mixture-of-experts models to benchmark too (their specs; the GPU machine
# builds the twins): PHASELAB_MOE_MODEL=path[:path...], e.g. the Qwen3-30B-A3B
# and gpt-oss-20b shape twins that `build/tests/make_reference_models
# --qwen3moe-twin 12 OUT` and `--gpt-oss-twin 12 OUT` write.
if [[ -n "${PHASELAB_MOE_MODEL:-}" ]]; then
  IFS=: read -r -a moe_models <<< "$PHASELAB_MOE_MODEL"
  for i in "${!moe_models[@]}"; do
    "$BUILD/app/phaselab-cli" twin export "${moe_models[$i]}" "$OUT/moe-model-$i.twin.gguf"
  done
fi
tar -C "$OUT" -cJf "$OUT/bin.tar.xz" bin && rm -rf "$OUT/bin"
du -sh "$OUT" >&2
echo "gpu-bundle: ready; on the GPU machine run scripts/gpu-check.sh with carry [\"gpu-bundle\"]" >&2
