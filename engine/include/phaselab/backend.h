// The Backend interface and the per-sequence KV cache it reads and appends to.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "phaselab/model.h"
#include "phaselab/status.h"

namespace phaselab {

// Contiguous KV cache of one sequence: K and V of every layer for positions
// [0, n_past). tokens[i] is the token at position i, so a new prompt can reuse
// the longest common prefix.
class KvCache {
 public:
  // Allocates n_ctx positions; a failure says how much was needed.
  static Result<std::unique_ptr<KvCache>> create(const ModelConfig& c, int n_ctx);

  int n_ctx() const { return n_ctx_; }
  int n_past() const { return static_cast<int>(tokens_.size()); }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  uint64_t bytes() const { return (k_.size() + v_.size()) * sizeof(float); }

  // K/V rows of one layer and position: [n_embd_kv]
  float* k(int il, int pos) { return k_.data() + (static_cast<size_t>(il) * n_ctx_ + pos) * n_embd_kv_; }
  float* v(int il, int pos) { return v_.data() + (static_cast<size_t>(il) * n_ctx_ + pos) * n_embd_kv_; }
  const float* k(int il, int pos) const { return k_.data() + (static_cast<size_t>(il) * n_ctx_ + pos) * n_embd_kv_; }
  const float* v(int il, int pos) const { return v_.data() + (static_cast<size_t>(il) * n_ctx_ + pos) * n_embd_kv_; }

  // Backends call this after writing K/V for the new tokens.
  void append(const int32_t* tokens, int n) { tokens_.insert(tokens_.end(), tokens, tokens + n); }
  // Forgets positions >= n (rollback, or reuse of a common prefix).
  void truncate(int n) {
    if (n < n_past()) tokens_.resize(n < 0 ? 0 : n);
  }
  void clear() { tokens_.clear(); }

 private:
  int n_ctx_ = 0, n_layer_ = 0, n_embd_kv_ = 0;
  std::vector<float> k_, v_;  // (layer, n_ctx, n_embd_kv)
  std::vector<int32_t> tokens_;
};

enum class LogitsMode {
  none,  // only fill the KV cache (all prefill chunks but the last)
  last,  // [n_vocab] for the last token
  all,   // [n_tokens, n_vocab] (speculative verification, tests)
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // Largest n_tokens one forward() accepts; callers split longer prompts.
  virtual int max_batch() const = 0;
  // Runs tokens at positions kv.n_past() .. + n_tokens, appends their K/V to
  // kv and writes logits as mode says. Fails (without touching kv) when the
  // tokens do not fit in kv's context.
  virtual Status forward(const int32_t* tokens, int n_tokens, KvCache& kv, float* logits, LogitsMode mode) = 0;
};

// The fast CPU backend (the default): 8-bit quantized activations, integer
// SIMD dot products (AVX2 when the CPU has it, else portable C++; with
// portable_only always the latter), a persistent thread pool.
Result<std::unique_ptr<Backend>> make_cpu_backend(std::shared_ptr<const Model> model, int n_threads,
                                                  int max_batch = 64, bool portable_only = false);

// The plain reference path: dequantizes weight rows on the fly, float math,
// no SIMD beyond what the compiler does. The oracle for every other backend.
Result<std::unique_ptr<Backend>> make_cpu_reference_backend(std::shared_ptr<const Model> model, int n_threads,
                                                            int max_batch = 64);

}  // namespace phaselab
