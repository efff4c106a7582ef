// The paged KV cache.
//
// KvPool: fixed-size blocks of kBlockTokens positions (K and V of every layer)
// from one allocation, with reference counts. A full block's hash chains on
// the previous block's hash; published blocks (immutable from then on) are
// found again by hash, confirmed by comparing token ids, and shared. Blocks no
// sequence references stay cached, least recently used evicted first, so a
// conversation switched away from and back to is still cached.
//
// KvCache: one sequence: a block table into a pool and the token at every
// position. Attention reads K/V through the table.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "phaselab/model_config.h"
#include "phaselab/status.h"

namespace phaselab {

// How K and V are stored. F16 by default (as llama.cpp's cache): half the
// memory of F32, and a pool of a given size holds twice the positions. BF16
// takes the same memory with F32's range and 8 bits of precision (as
// llama.cpp's -ctk bf16).
enum class KvType { f32, f16, bf16 };
const char* kv_type_name(KvType t);                        // "f32", "f16", "bf16"
std::optional<KvType> kv_type_from_name(std::string_view name);
inline size_t kv_type_bytes(KvType t) { return t == KvType::f32 ? 4 : 2; }

class KvPool {
 public:
  static constexpr int kBlockTokens = 16;

  static Result<std::shared_ptr<KvPool>> create(const ModelConfig& c, int n_blocks, KvType type = KvType::f16);

  int n_blocks() const { return n_blocks_; }
  int n_free() const { return static_cast<int>(free_.size()); }    // never used or evicted
  int n_cached() const { return static_cast<int>(lru_.size()); }   // unreferenced, kept for reuse
  int n_used() const { return n_blocks_ - n_free() - n_cached(); }  // referenced by a sequence
  int n_shared() const;                                             // referenced more than once
  uint64_t bytes() const { return k_.size() + v_.size(); }
  KvType type() const { return type_; }
  int refcount(int b) const { return ref_[b]; }
  bool published(int b) const { return published_[b] != 0; }
  // Identity for mirrors of the pool (the CUDA backend's device pool): a
  // number no other pool of the process has, and for each block how many
  // times allocate() has handed it out, so that K/V a mirror holds for a
  // block's earlier life are known to be stale.
  uint64_t id() const { return id_; }
  uint32_t generation(int b) const { return generation_[b]; }

  // K/V of one block, layer and slot: [n_embd_kv] values of type() (float
  // or IEEE half as uint16_t).
  void* k(int b, int il, int slot) { return k_.data() + offset(b, il, slot); }
  void* v(int b, int il, int slot) { return v_.data() + offset(b, il, slot); }
  const void* k(int b, int il, int slot) const { return k_.data() + offset(b, il, slot); }
  const void* v(int b, int il, int slot) const { return v_.data() + offset(b, il, slot); }

  // A block with reference count 1: a free one, else the least recently used
  // cached one (unpublished first). -1 when every block is referenced.
  int allocate();
  void retain(int b);
  void release(int b);  // at 0: cached if published, else free

  // Publishes a full block: hash chains on prev_hash; tokens are its
  // kBlockTokens token ids. Returns false if an equal block is published already.
  bool publish(int b, uint64_t hash, uint64_t prev_hash, const int32_t* tokens);
  // A published block with this hash, previous hash and token ids, or -1.
  int lookup(uint64_t hash, uint64_t prev_hash, const int32_t* tokens) const;
  // Copies slots [0, n) of every layer from block src to dst.
  void copy_prefix(int dst, int src, int n);

  static uint64_t chain_hash(uint64_t prev, const int32_t* tokens);

 private:
  KvPool() = default;
  size_t offset(int b, int il, int slot) const {  // in bytes
    return ((static_cast<size_t>(b) * n_layer_ + il) * kBlockTokens + slot) * n_embd_kv_ * elem_;
  }
  void unpublish(int b);

  uint64_t id_ = 0;
  int n_blocks_ = 0, n_layer_ = 0, n_embd_kv_ = 0;
  KvType type_ = KvType::f16;
  size_t elem_ = 2;  // bytes per value
  std::vector<uint32_t> generation_;
  std::vector<uint8_t> k_, v_;  // (n_blocks, n_layer, kBlockTokens, n_embd_kv) values of type_
  std::vector<int> ref_;
  std::vector<uint8_t> published_;
  std::vector<uint64_t> hash_, prev_hash_;
  std::vector<int32_t> block_tokens_;  // (n_blocks, kBlockTokens) of published blocks
  std::vector<int> free_;
  std::list<int> lru_;                                  // unreferenced published blocks, oldest first
  std::vector<std::list<int>::iterator> lru_pos_;
  std::unordered_multimap<uint64_t, int> by_hash_;
};

class KvCache {
 public:
  // A sequence of up to n_ctx positions with a pool of its own, sized for
  // the context (plus one block for copy on write): what the sequence does
  // not use keeps other conversations cached.
  static Result<std::unique_ptr<KvCache>> create(const ModelConfig& c, int n_ctx, KvType type = KvType::f16);
  // The bytes create() allocates for n_ctx positions (K and V of its pool).
  static uint64_t bytes_for(const ModelConfig& c, int n_ctx, KvType type = KvType::f16);
  // A sequence in a shared pool.
  static std::unique_ptr<KvCache> create_in(std::shared_ptr<KvPool> pool, int n_ctx);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  int n_ctx() const { return n_ctx_; }
  int n_past() const { return static_cast<int>(tokens_.size()); }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  uint64_t bytes() const { return pool_->bytes(); }
  KvPool& pool() { return *pool_; }
  const KvPool& pool() const { return *pool_; }
  const std::vector<int>& block_table() const { return table_; }

  KvType type() const { return pool_->type(); }
  // K/V rows of one layer and position: [n_embd_kv] values of type().
  // Writable positions are those made ready by reserve().
  const void* k(int il, int pos) const { return pool_->k(table_[pos / KvPool::kBlockTokens], il, pos % KvPool::kBlockTokens); }
  const void* v(int il, int pos) const { return pool_->v(table_[pos / KvPool::kBlockTokens], il, pos % KvPool::kBlockTokens); }
  void* k(int il, int pos) { return pool_->k(table_[pos / KvPool::kBlockTokens], il, pos % KvPool::kBlockTokens); }
  void* v(int il, int pos) { return pool_->v(table_[pos / KvPool::kBlockTokens], il, pos % KvPool::kBlockTokens); }

  // Makes positions [n_past, n_past + n) writable: allocates blocks, and
  // copies a shared or published block before it is written (copy on write).
  Status reserve(int n);
  // Backends call this after writing K/V for the new tokens; blocks that
  // became full are published (when the prefix cache is on).
  void append(const int32_t* tokens, int n);
  // Forgets positions >= n (rollback, or reuse of a common prefix).
  void truncate(int n);
  void clear() { truncate(0); }

  // Makes the cache hold the longest reusable prefix of tokens[0, limit):
  // the common prefix with what it holds, then published blocks found by
  // hash. Returns that prefix's length.
  int reuse_prefix(const int32_t* tokens, int limit);
  // What reuse_prefix would return, without changing anything.
  int reusable_prefix(const int32_t* tokens, int limit) const;
  void set_prefix_cache(bool on) { prefix_cache_ = on; }
  bool prefix_cache() const { return prefix_cache_; }

 private:
  KvCache() = default;

  std::shared_ptr<KvPool> pool_;
  int n_ctx_ = 0;
  bool prefix_cache_ = true;
  std::vector<int> table_;         // block of each kBlockTokens positions
  std::vector<uint64_t> hashes_;   // chain hash of each full block
  std::vector<int32_t> tokens_;    // token at each position
  std::vector<int> found_;         // scratch of reuse_prefix
};

}  // namespace phaselab
