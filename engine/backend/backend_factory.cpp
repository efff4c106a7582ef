// make_backend: a kind and its switches -> a backend, with the CUDA-to-CPU
// fallback decided here for every front end. backend_options_from_environment
// is the only reader of the backends' PHASELAB_* variables.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "phaselab/backend.h"
#include "phaselab/machine.h"
#include "phaselab/metrics.h"

namespace phaselab {

namespace {

// The variable's value; null when unset.
const char* env(const char* name) { return std::getenv(name); }

// Set to anything but "0": on; "0": off; unset: fallback.
bool env_flag(const char* name, bool fallback) {
  const char* v = env(name);
  return v ? std::strcmp(v, "0") != 0 : fallback;
}

// AMD family 19h (Zen 3 and Zen 4), and whether the core has AVX-512 (Zen 4).
struct AmdCore {
  bool family_19h = false, avx512 = false;
};
AmdCore amd_core() {
  AmdCore core;
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0, &a, &b, &c, &d) && b == 0x68747541 /* "Auth"enticAMD */ && __get_cpuid(1, &a, &b, &c, &d)) {
    core.family_19h = ((a >> 8) & 0xf) + ((a >> 20) & 0xff) == 0x19;
    __builtin_cpu_init();
    core.avx512 = __builtin_cpu_supports("avx512f");
  }
#endif
  return core;
}

}  // namespace

int default_decode_prefetch_bytes() {
  static const int bytes = [] {
    const AmdCore core = amd_core();
    return core.family_19h && !core.avx512 ? 4096 : 8192;
  }();
  return bytes;
}

bool default_decode_prefetch_l2() {
  static const bool l2 = [] {
    const AmdCore core = amd_core();
    return core.family_19h && core.avx512;
  }();
  return l2;
}

int default_stream_prefetch_bytes() {
  static const int bytes = [] {
    const AmdCore core = amd_core();
    return core.family_19h && core.avx512 ? 0 : default_decode_prefetch_bytes();
  }();
  return bytes;
}

int default_stream_ways() {
  static const int ways = [] {
    const AmdCore core = amd_core();
    return core.family_19h && core.avx512 ? 4 : 1;
  }();
  return ways;
}

int default_max_batch(BackendKind kind) { return kind == BackendKind::cuda ? 512 : 64; }

int default_cpu_max_batch(double prefill_ops_per_token) {
  for (int tokens = 512; tokens > 64; tokens /= 2)
    if (tokens * prefill_ops_per_token <= kCpuPassOps) return tokens;
  return 64;
}

namespace {

// default_max_batch(kind, model) from a prompt token's operations.
int default_passes(BackendKind kind, double prefill_ops_per_token) {
  return kind == BackendKind::cpu ? default_cpu_max_batch(prefill_ops_per_token) : default_max_batch(kind);
}

}  // namespace

int default_max_batch(BackendKind kind, const Model& model) {
  return default_passes(kind, prefill_ops_per_token(model));
}

void set_default_passes(BackendOptions* bo, double prefill_ops_per_token, int at_least) {
  bo->max_batch = std::max(at_least, default_passes(bo->kind, prefill_ops_per_token));
  bo->fallback_max_batch =
      bo->kind == BackendKind::cuda ? std::max(at_least, default_passes(BackendKind::cpu, prefill_ops_per_token)) : 0;
}

void raise_passes(BackendOptions* bo, int tokens) {
  bo->max_batch = std::max(bo->max_batch, tokens);
  if (bo->fallback_max_batch > 0) bo->fallback_max_batch = std::max(bo->fallback_max_batch, tokens);
}

void set_default_passes(BackendOptions* bo, const Model& model, int at_least) {
  set_default_passes(bo, prefill_ops_per_token(model), at_least);
}

BackendOptions backend_options_from_environment() {
  BackendOptions o;
  if (const char* v = env("PHASELAB_CPU_ISA")) o.cpu.isa_cap = v;
  o.cpu.repack = env_flag("PHASELAB_CPU_REPACK", o.cpu.repack);
  o.cpu.huge_pages = env_flag("PHASELAB_CPU_HUGEPAGES", o.cpu.huge_pages);
  o.cpu.row_tiles = env_flag("PHASELAB_CPU_ROW_TILES", o.cpu.row_tiles);
  o.cpu.decode_rows = env_flag("PHASELAB_CPU_DECODE_ROWS", o.cpu.decode_rows);
  if (const char* v = env("PHASELAB_CPU_PREFETCH_BYTES"); v && std::atoi(v) >= 0)
    o.cpu.decode_prefetch_bytes = std::min(std::atoi(v), kMaxPrefetchBytes);
  o.cpu.decode_prefetch_l2 = env_flag("PHASELAB_CPU_PREFETCH_L2", o.cpu.decode_prefetch_l2);
  if (const char* v = env("PHASELAB_CPU_STREAM_PREFETCH_BYTES"); v && std::atoi(v) >= 0)
    o.cpu.stream_prefetch_bytes = std::min(std::atoi(v), kMaxPrefetchBytes);
  if (const char* v = env("PHASELAB_CPU_STREAM_WAYS"); v && std::atoi(v) >= 1)
    o.cpu.stream_ways = std::min(std::atoi(v), kMaxStreamWays);
  if (const char* v = env("PHASELAB_CPU_STREAM_CHUNKS"); v && std::atoi(v) >= 1)
    o.cpu.stream_chunks = std::min(std::atoi(v), kMaxStreamChunks);
  o.cuda.graphs = env_flag("PHASELAB_CUDA_GRAPHS", o.cuda.graphs);
  o.cuda.device_sampling = env_flag("PHASELAB_CUDA_SAMPLING", o.cuda.device_sampling);
  o.cuda.tiled_attention = env_flag("PHASELAB_CUDA_ATTN_TILED", o.cuda.tiled_attention);
  // A positive number of rows; anything else keeps the default.
  if (const char* v = env("PHASELAB_CUDA_GEMM_MIN"); v && std::atoi(v) > 0) o.cuda.gemm_min_rows = std::atoi(v);
  // PHASELAB_CUDA_PROFILE=1 turns profiling on (unset or "0": off).
  o.cuda.profile = env_flag("PHASELAB_CUDA_PROFILE", false);
  o.cuda.q8_act = env_flag("PHASELAB_CUDA_Q8", o.cuda.q8_act);
  o.cuda.bf16_weights = env_flag("PHASELAB_CUDA_BF16_WEIGHTS", o.cuda.bf16_weights);
  if (const char* v = env("PHASELAB_CUDA_FUSED_TAILS"); v && *v) o.cuda.fused_tails = std::atoi(v) & 15;
  if (const char* v = env("PHASELAB_CUDA_LIB"); v && *v) o.cuda.library = v;
  return o;
}

std::string_view to_string(BackendKind kind) {
  switch (kind) {
    case BackendKind::cpu: return "cpu";
    case BackendKind::cpu_portable: return "cpu-portable";
    case BackendKind::cpu_reference: return "cpu-reference";
    case BackendKind::cuda: return "cuda";
  }
  return "?";
}

const std::vector<std::string>& backend_kinds() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (BackendKind k : kBackendKinds) v.emplace_back(to_string(k));
    return v;
  }();
  return names;
}

Result<BackendKind> parse_backend_kind(std::string_view name) {
  for (BackendKind k : kBackendKinds)
    if (to_string(k) == name) return k;
  std::string kinds;
  for (const std::string& k : backend_kinds()) kinds += (kinds.empty() ? "" : ", ") + k;
  return invalid_argument("unknown backend '" + std::string(name) + "' (available: " + kinds + ")");
}

Result<BackendChoice> make_backend(std::shared_ptr<const Model> model, const BackendOptions& opt) {
  const int threads = opt.n_threads > 0 ? opt.n_threads : default_thread_count();
  BackendChoice c;
  Result<std::unique_ptr<Backend>> b = invalid_argument("no backend");
  switch (opt.kind) {
    case BackendKind::cuda:
      b = make_cuda_backend(model, opt.max_batch, opt.cuda, opt.n_threads);
      if (!b && opt.fallback) {
        c.fallback_reason = b.status().message();
        b = make_cpu_backend(std::move(model), threads, opt.fallback_max_batch > 0 ? opt.fallback_max_batch : opt.max_batch,
                             false, opt.cpu);
      }
      break;
    case BackendKind::cpu_reference:
      b = make_cpu_reference_backend(std::move(model), threads, opt.max_batch);
      break;
    case BackendKind::cpu:
    case BackendKind::cpu_portable:
      b = make_cpu_backend(std::move(model), threads, opt.max_batch, opt.kind == BackendKind::cpu_portable, opt.cpu);
      break;
  }
  if (!b) return b.status();
  c.backend = std::move(*b);
  return c;
}

}  // namespace phaselab
