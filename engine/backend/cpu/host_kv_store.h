// The K/V bytes of the pools a CPU backend runs (internal to
// engine/backend/cpu; tests read K/V through it). engine/kv keeps the books
// (blocks, tables, window parts, copy-on-write decisions); the bytes live
// here, laid out exactly by the pool's blocks and window slots:
//   K, V:   (n_blocks, full-attention layers, kBlockTokens, n_embd_kv)
//   WK, WV: (n_window_blocks, local layers, kBlockTokens, n_embd_kv)
// values of the pool's type (KvPool::store_bytes). A row of a local layer
// is found through the window slot its block has now.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "phaselab/kv_cache.h"
#include "phaselab/status.h"

namespace phaselab {

class Backend;

// One pool's K/V.
class HostKv {
 public:
  explicit HostKv(const KvPool& pool);  // allocates (zeroed); throws std::bad_alloc
  uint64_t bytes() const { return k_.size() + v_.size() + wk_.size() + wv_.size(); }

  // Block b's row of layer il at slot: [n_embd_kv] values of the pool's type
  // (float, IEEE half or bfloat16 as uint16_t, or Q8_0 blocks:
  // kv_row_bytes). A local layer's rows exist while the block has its window
  // part.
  void* k(int b, int il, int slot) { return rows_of(true, il, b, pool_->window_slot(b)) + slot * row_bytes_; }
  void* v(int b, int il, int slot) { return rows_of(false, il, b, pool_->window_slot(b)) + slot * row_bytes_; }

  // Applies the copies on write the pool recorded (in order), and forgets them.
  void apply_copies(KvPool& pool);

 private:
  friend class SeqKv;
  // The first row of block `block` (window part `window_slot` for a local
  // layer) in layer il's K (key) or V store.
  uint8_t* rows_of(bool key, int il, int block, int window_slot) {
    const size_t li = layer_index_[il];
    if (layer_local_[il])
      return (key ? wk_ : wv_).data() + (static_cast<size_t>(window_slot) * n_local_ + li) * KvPool::kBlockTokens * row_bytes_;
    return (key ? k_ : v_).data() + (static_cast<size_t>(block) * n_full_ + li) * KvPool::kBlockTokens * row_bytes_;
  }

  const KvPool* pool_;  // for the window slots (alive while a sequence of it is run)
  int n_full_ = 0, n_local_ = 0;
  size_t row_bytes_ = 0;
  std::vector<uint8_t> layer_local_;  // (n_layer) the pool's geometry, copied
  std::vector<int> layer_index_;      // (n_layer)
  std::vector<uint8_t> k_, v_, wk_, wv_;
};

// One sequence's K/V: its block table over its pool's bytes.
class SeqKv {
 public:
  SeqKv(const KvCache& seq, HostKv& bytes) : seq_(&seq), kv_(&bytes) {}
  KvType type() const { return seq_->type(); }

  // K/V rows of one layer and position: [n_embd_kv] values of type().
  // Writable positions are those made ready by KvCache::reserve(); a
  // sliding-window layer's rows exist for the positions its next query sees.
  void* k(int il, int pos) const { return at(true, il, pos); }
  void* v(int il, int pos) const { return at(false, il, pos); }

  // Layer il's K (or V) rows of positions [a, b], each advanced by offset
  // values: out[j - a], as the attention kernels take them (the cache is
  // paged). T is the storage type: uint16_t for 16-bit rows, float for F32,
  // uint8_t for Q8_0 (offset a multiple of 32). One block lookup per block,
  // not per position.
  template <class T>
  void k_rows(int il, int a, int b, int offset, const T** out) const { rows(true, il, a, b, offset, out); }
  template <class T>
  void v_rows(int il, int a, int b, int offset, const T** out) const { rows(false, il, a, b, offset, out); }

 private:
  void* at(bool key, int il, int pos) const {
    const int B = KvPool::kBlockTokens, blk = seq_->block_table()[pos / B];
    return kv_->rows_of(key, il, blk, kv_->pool_->window_slot(blk)) + (pos % B) * kv_->row_bytes_;
  }
  template <class T>
  void rows(bool key, int il, int a, int b, int offset, const T** out) const {
    const int B = KvPool::kBlockTokens;
    const size_t stride = kv_->row_bytes_, skip = kv_row_bytes(type(), offset);
    const std::vector<int>& table = seq_->block_table();
    for (int j = a; j <= b;) {
      const int s0 = j % B, s1 = std::min(B - 1, s0 + (b - j));
      const int blk = table[j / B];
      const uint8_t* base = kv_->rows_of(key, il, blk, kv_->pool_->window_slot(blk)) + s0 * stride + skip;
      for (int s = s0; s <= s1; s++, j++) out[j - a] = reinterpret_cast<const T*>(base + (s - s0) * stride);
    }
  }

  const KvCache* seq_;
  HostKv* kv_;
};

// The K/V of every pool a backend runs, keyed by the pool's id; a pool's
// bytes are freed once the pool is gone (at the next prepare).
class HostKvStore {
 public:
  // pool's K/V: allocated (zeroed) the first time the pool is seen, with the
  // copies on write the pool recorded since applied. Call it after the
  // pass's reserves and before it writes K/V.
  Result<HostKv*> prepare(KvPool& pool);
  // A sequence's K/V in a prepared pool.
  SeqKv of(const KvCache& seq);
  // The pool's K/V, or null when it was never prepared.
  HostKv* find(const KvPool& pool);

 private:
  struct Entry {
    uint64_t id;
    std::weak_ptr<const KvPool> pool;  // expired: the pool is gone
    std::unique_ptr<HostKv> kv;
  };
  std::vector<Entry> pools_;  // a few: a linear search
};

// The host store of a CPU backend (make_cpu_backend,
// make_cpu_reference_backend), or null for another backend: for tests that
// compare K/V bytes.
HostKvStore* host_kv_store(Backend& backend);

}  // namespace phaselab
