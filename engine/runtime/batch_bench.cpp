#include "phaselab/batch_bench.h"

#include <algorithm>
#include <cstdlib>
#include <chrono>
#include <random>
#include <vector>

#include "phaselab/kv_cache.h"
#include "phaselab/sampler.h"
#include "engine_loop.h"
#include "request_rules.h"

namespace phaselab {

Result<BatchBenchPoint> bench_batch(Backend& backend, const Model& model, int batch, int n_prompt, int n_gen,
                                    uint64_t seed, const std::atomic<bool>* cancel, KvType kv_type) {
  const ModelConfig& c = model.config();
  if (batch < 1) return invalid_argument("the batch size must be at least 1");
  if (batch > backend.max_batch())
    return invalid_argument("batch " + std::to_string(batch) + " is more than the " + std::to_string(backend.max_batch()) +
                            " tokens one pass of this backend takes: raise --batch-size");
  if (n_prompt < 1 || n_gen < 1) return invalid_argument("the prompt and the generated tokens must be at least 1 each");
  const int n_ctx = n_prompt + n_gen + 1;
  if (n_ctx > c.n_ctx_train)
    return invalid_argument("prompt and generated tokens (" + std::to_string(n_ctx) + ") exceed the model's context of " +
                            std::to_string(c.n_ctx_train));
  const int per_seq = (n_ctx + KvPool::kBlockTokens - 1) / KvPool::kBlockTokens;
  const int window_blocks = KvPool::window_blocks_for(c, batch, backend.max_batch());
  PHASELAB_TRY(check_engine_memory(
      model, backend, KvPool::bytes_for(c, batch * per_seq, kv_type, window_blocks, backend.kv_storage()), batch));
  auto pool = KvPool::create(c, batch * per_seq, kv_type, window_blocks, backend.kv_storage());
  if (!pool) return pool.status();
  // The engine loop with every prompt computed before any sequence decodes,
  // so that the two phases are timed apart: prefill passes of up to
  // max_batch tokens taken from the sequences in turn, then n_gen passes of
  // one token per sequence (greedy, to n_gen + 1 tokens each: the first
  // comes from the prefill's logits).
  LoopOptions lo;
  lo.n_ctx = n_ctx;
  lo.max_seqs = batch;
  lo.token_budget = backend.max_batch();
  lo.prefix_cache = false;  // random prompts: nothing to share, nothing to publish
  lo.prefill_before_decode = true;
  EngineLoop loop(backend, model, *pool, lo);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_int_distribution<int32_t> pick(0, c.n_vocab - 1);
  GenerateOptions go;
  go.n_predict = n_gen + 1;
  go.ignore_eos = true;
  go.prefix_cache = false;
  go.sampling.temperature = 0;
  for (int b = 0; b < batch; b++) {
    std::vector<int32_t> prompt(n_prompt);
    for (auto& t : prompt) t = pick(rng);
    loop.add(std::make_unique<Sequence>(static_cast<uint64_t>(b), std::move(prompt), go, TokenCallback{}, model, n_ctx));
  }

  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  auto t1 = t0;
  int decode_passes = 0;
  while (!loop.idle()) {
    if (cancel && cancel->load(std::memory_order_relaxed)) return cancelled("benchmark cancelled");
    StepReport pass;
    PHASELAB_TRY(loop.step(&pass));
    if (pass.prefill) t1 = Clock::now();
    else decode_passes += pass.n_seqs > 0;
  }
  const auto t2 = Clock::now();
  for (auto& f : loop.take_finished())
    if (!f.status) return f.status;
  if (decode_passes != n_gen)
    return internal_error("the benchmark ran " + std::to_string(decode_passes) + " decode passes for " +
                          std::to_string(n_gen) + " tokens");
  BatchBenchPoint p;
  p.batch = batch;
  p.n_prompt = n_prompt;
  p.n_gen = n_gen;
  p.prefill_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
  p.decode_ms = std::chrono::duration<double, std::milli>(t2 - t1).count();
  p.pp_tps = batch * n_prompt / std::max(p.prefill_ms / 1000.0, 1e-9);
  p.tg_tps = batch * n_gen / std::max(p.decode_ms / 1000.0, 1e-9);
  p.tpot_ms = p.decode_ms / n_gen;
  p.kv_mib = backend.kv_bytes(**pool) / 1048576.0;
  return p;
}

double decode_ridge_batch(double weight_bytes, double read_bytes_per_s, double ops_per_token, double ops_per_s) {
  if (weight_bytes <= 0 || read_bytes_per_s <= 0 || ops_per_token <= 0 || ops_per_s <= 0) return 0;
  return (weight_bytes / read_bytes_per_s) * ops_per_s / ops_per_token;
}

}  // namespace phaselab

namespace phaselab {

double DecodeRoofline::ceiling_tps(double b) const {
  if (read_bytes_per_s <= 0 || weight_bytes <= 0) return 0;
  const double bandwidth_bound = b * read_bytes_per_s / weight_bytes;
  return ops_per_s > 0 && ops_per_token > 0 ? std::min(bandwidth_bound, ops_per_s / ops_per_token) : bandwidth_bound;
}

DecodeRoofline decode_roofline(const Model& model, const std::string& backend_name, double read_bytes_per_s,
                               double int8_ops_per_s, double fp32_flops) {
  DecodeRoofline r;
  r.weight_bytes = static_cast<double>(model.active_weight_bytes());
  r.ops_per_token = decode_ops_per_token(model);
  r.read_bytes_per_s = read_bytes_per_s;
  const ComputePeak peak = compute_peak(backend_name, int8_ops_per_s, fp32_flops);
  r.int8 = peak.int8;
  r.ops_per_s = peak.ops_per_s;
  r.ridge_batch = decode_ridge_batch(r.weight_bytes, r.read_bytes_per_s, r.ops_per_token, r.ops_per_s);
  return r;
}

Result<std::vector<int>> parse_batch_sizes(std::string_view text) {
  const std::string hint = "batch sizes are whole numbers from 1 to 4096 separated by commas (e.g. 1,2,4,8,16,32), not '" +
                           std::string(text) + "'";
  std::vector<int> out;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    std::string item(text.substr(at, comma - at));
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    char* end = nullptr;
    const long v = item.empty() ? 0 : std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end || v < 1 || v > 4096) return invalid_argument(hint);
    out.push_back(static_cast<int>(v));
    at = comma + 1;
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace phaselab
