// The paged KV cache.
//
// KvPool: fixed-size blocks of kBlockTokens positions with reference counts.
// A block is one id for its positions in every layer, but its storage has two
// parts: the full-attention layers' K/V (every block has it) and the
// sliding-window layers' K/V (a "window part", from a smaller store). A local
// layer sees only the last sliding_window keys, so a sequence gives a block's
// window part back once its next query can no longer see it; the store holds
// about a window per sequence, not a context (Gemma 3: 15 of 18 layers local,
// window 512). A full block's hash chains on the previous block's hash;
// published blocks (immutable from then on) are found again by hash,
// confirmed by comparing token ids, and shared. Blocks no sequence references
// stay cached, least recently used evicted first, so a conversation switched
// away from and back to is still cached; so do window parts no sequence
// needs, so that a rollback or a prefix found again can take them back.
//
// KvCache: one sequence: a block table into a pool, the window parts it
// holds, and the token at every position. Attention reads K/V through the
// table.
//
// These are the books only: the K/V bytes live with the backend that owns
// them, laid out by the pool's blocks and window slots (the CPU backends'
// HostKvStore, engine/backend/cpu/host_kv_store.h; the CUDA backend's device
// pool), keyed by KvPool::id().
#pragma once

#include <algorithm>
#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "phaselab/model_config.h"
#include "phaselab/status.h"

namespace phaselab {

// How K and V are stored. F16 by default (as llama.cpp's cache): half the
// memory of F32, and a pool of a given size holds twice the positions. BF16
// takes the same memory with F32's range and 8 bits of precision (as
// llama.cpp's -ctk bf16). Q8_0 (as llama.cpp's -ctk q8_0): blocks of 32
// values, an F16 scale and 32 int8 each (34 bytes), about half of F16's
// memory; each head's values must be whole blocks (head_dim a multiple of
// 32).
enum class KvType { f32, f16, bf16, q8_0 };
const char* kv_type_name(KvType t);                        // "f32", "f16", "bf16", "q8_0"
std::optional<KvType> kv_type_from_name(std::string_view name);
// Bytes of n values of type t (n a multiple of 32 for q8_0).
inline size_t kv_row_bytes(KvType t, size_t n) {
  return t == KvType::f32 ? 4 * n : t == KvType::q8_0 ? n / 32 * 34 : 2 * n;
}

// Where K and V live (the pool itself allocates none: it keeps the books,
// i.e. blocks, tables, hashes, reference counts, window parts and
// copy-on-write decisions). host: in host memory, in the store of the CPU
// backend that runs the pool (HostKvStore), which applies the copies on
// write the pool records (pending_copies). device: on the backend's device,
// which mirrors the pool's blocks and window parts and its copies on write
// (the CUDA backend, Backend::kv_storage(); KvCache::take_tail_copy).
enum class KvStorage { host, device };

class KvPool : public std::enable_shared_from_this<KvPool> {
 public:
  static constexpr int kBlockTokens = 16;

  // n_window_blocks: blocks' worth of window parts (the sliding-window
  // layers' K/V); <= 0 or more than n_blocks: one for every block. Without
  // sliding-window layers there are no window parts.
  static Result<std::shared_ptr<KvPool>> create(const ModelConfig& c, int n_blocks, KvType type = KvType::f16,
                                                int n_window_blocks = 0, KvStorage storage = KvStorage::host);
  // Host memory that K/V of such a pool take (K and V of both parts, laid
  // out as copy_bytes() says; 0 for device storage, which is on the device).
  static uint64_t bytes_for(const ModelConfig& c, int n_blocks, KvType type, int n_window_blocks = 0,
                            KvStorage storage = KvStorage::host);
  // Window parts that n_seqs sequences need at most when each pass computes
  // at most tokens_per_pass tokens in all: per sequence the window's blocks
  // before its first new token, one block of alignment and one for copy on
  // write, and the pass's new tokens. 0 for a model without sliding-window
  // layers.
  static int window_blocks_for(const ModelConfig& c, int n_seqs, int tokens_per_pass);

  int n_blocks() const { return n_blocks_; }
  int n_free() const { return static_cast<int>(free_.size()); }    // never used or evicted
  int n_cached() const { return static_cast<int>(lru_.size()); }   // unreferenced, kept for reuse
  int n_used() const { return n_blocks_ - n_free() - n_cached(); }  // referenced by a sequence
  int n_shared() const;                                             // referenced more than once
  // Bytes of one full copy of the pool's K or V, as a backend lays it out:
  // (n_blocks, full-attention layers, kBlockTokens, n_embd_kv) values of
  // type() for the blocks (window = false), (n_window_blocks, local layers,
  // kBlockTokens, n_embd_kv) for the window parts (window = true). The one
  // formula of the K/V size (bytes_for and the host store use it).
  uint64_t store_bytes(bool window) const { return layout_bytes(window ? n_wslots_ : n_blocks_, window ? n_local_ : n_full_, row_bytes_); }
  // K and V of both parts: what a backend holding the pool's K/V allocates.
  uint64_t copy_bytes() const { return 2 * (store_bytes(false) + store_bytes(true)); }
  // Bytes of one row of n_embd_kv values of type().
  size_t row_bytes() const { return row_bytes_; }
  KvType type() const { return type_; }
  KvStorage storage() const { return storage_; }
  int refcount(int b) const { return ref_[b]; }
  bool published(int b) const { return published_[b] != 0; }
  // Identity for mirrors of the pool (the CUDA backend's device pool): a
  // number no other pool of the process has, and for each block how many
  // times allocate() has handed it out, so that K/V a mirror holds for a
  // block's earlier life are known to be stale.
  uint64_t id() const { return id_; }
  uint32_t generation(int b) const { return generation_[b]; }

  // Window parts: whether the model has sliding-window layers (and so
  // sequences give window parts back), how many the store has, how many
  // hold K/V a sequence needs, and per block whether it has one and how many
  // sequences hold it.
  bool windowed() const { return window_ > 0; }
  int window() const { return window_; }
  int n_window_blocks() const { return n_wslots_; }
  int n_window_used() const { return n_wslots_ - static_cast<int>(wfree_.size()) - static_cast<int>(wlru_.size()); }
  bool is_local(int il) const { return layer_local_[il] != 0; }
  int n_embd_kv() const { return n_embd_kv_; }
  int n_layer() const { return n_layer_; }
  bool has_window_part(int b) const { return !windowed() || wslot_[b] >= 0; }
  int window_refcount(int b) const { return wref_[b]; }
  // Where block b's window part is in the window store (-1: none, or no
  // window parts). A block keeps the slot it was given by allocate() until it
  // loses its part, and gets one again only when it is handed out anew (a new
  // generation), so a device mirror may lay out its own window store by these
  // slots.
  int window_slot(int b) const { return windowed() ? wslot_[b] : -1; }
  // The sliding-window layers' count, and layer il's index among the local
  // layers (is_local) or among the full-attention ones.
  int n_local_layers() const { return n_local_; }
  int layer_index(int il) const { return layer_index_[il]; }
  // "15 of 18 layers keep only their 512-position window" where the pool
  // has window parts, else "" (host or device storage alike: the CUDA
  // backend lays out its device K/V by the same window parts).
  std::string window_note() const;

  // A block with reference count 1 and its window part held once: a free
  // block, else the least recently used cached one (unpublished first); its
  // window part a free one, else the least recently used one no sequence
  // holds. -1 when either runs out.
  int allocate();
  void retain(int b);
  void release(int b);  // at 0: cached if published, else free (its window part too)
  // Holding a block's window part (a sequence whose queries can see it);
  // false when the part was given to another block meanwhile.
  bool retain_window(int b);
  void release_window(int b);  // at 0: kept for reuse until another block needs it

  // Publishes a full block: hash chains on prev_hash; tokens are its
  // kBlockTokens token ids. Returns false if an equal block is published already.
  bool publish(int b, uint64_t hash, uint64_t prev_hash, const int32_t* tokens);
  // A published block with this hash, previous hash and token ids, or -1.
  int lookup(uint64_t hash, uint64_t prev_hash, const int32_t* tokens) const;
  // Copy on write: slots [0, n) of every layer of block src are to be
  // copied to dst (the local layers' where both have their window parts).
  // With host storage it is recorded, with the window slots of that moment,
  // for the host store to apply before the next pass writes K/V (no K/V is
  // written between, so applying the copies in order then gives what copying
  // now would); with device storage nothing (the device mirrors the copy:
  // KvCache::take_tail_copy).
  void copy_prefix(int dst, int src, int n);
  struct PendingCopy {
    int dst = -1, dst_window_slot = -1, src = -1, src_window_slot = -1, n = 0;
  };
  const std::vector<PendingCopy>& pending_copies() const { return pending_; }
  void clear_pending_copies() { pending_.clear(); }

  static uint64_t chain_hash(uint64_t prev, const int32_t* tokens);

 private:
  KvPool() = default;
  static uint64_t layout_bytes(int n_blocks, int n_layers, size_t row_bytes) {
    return static_cast<uint64_t>(n_blocks) * n_layers * kBlockTokens * row_bytes;
  }
  void unpublish(int b);
  void drop_window_part(int b);  // gives the block's window part back to the free store
  int take_window_slot();        // a free window part, else an evicted one; -1 when none

  uint64_t id_ = 0;
  int n_blocks_ = 0, n_layer_ = 0, n_embd_kv_ = 0;
  int n_full_ = 0, n_local_ = 0;  // layers whose K/V live in the blocks / in the window parts
  int window_ = 0;                // 0: no window parts
  int n_wslots_ = 0;
  KvType type_ = KvType::f16;
  KvStorage storage_ = KvStorage::host;
  size_t row_bytes_ = 0;  // bytes of one row of n_embd_kv values
  std::vector<uint8_t> layer_local_;  // (n_layer) 1: a sliding-window layer
  std::vector<int> layer_index_;      // (n_layer) its index among the full or the local layers
  std::vector<uint32_t> generation_;
  std::vector<PendingCopy> pending_;  // copies on write not yet applied (host storage)
  std::vector<int> ref_;
  std::vector<uint8_t> published_;
  std::vector<uint64_t> hash_, prev_hash_;
  std::vector<int32_t> block_tokens_;  // (n_blocks, kBlockTokens) of published blocks
  std::vector<int> free_;
  std::list<int> lru_;                                  // unreferenced published blocks, oldest first
  std::vector<std::list<int>::iterator> lru_pos_;
  std::unordered_multimap<uint64_t, int> by_hash_;
  // Window parts: per block its slot (-1: none) and holders; slots no block
  // has; blocks whose part no sequence holds, oldest first.
  std::vector<int> wslot_, wref_;
  std::vector<int> wfree_;
  std::list<int> wlru_;
  std::vector<std::list<int>::iterator> wlru_pos_;
};

class KvCache {
 public:
  // A sequence of up to n_ctx positions with a pool of its own, sized for
  // the context (plus one block for copy on write) and, for the window
  // parts, for passes of at most tokens_per_pass tokens: what the sequence
  // does not use keeps other conversations cached. turn_window: room for
  // one more window (pin_window), for a chat whose next turn or regenerate
  // goes back to the last prompt's end; without it pin_window does nothing
  // and the pool holds what llama.cpp's cache holds.
  static Result<std::unique_ptr<KvCache>> create(const ModelConfig& c, int n_ctx, KvType type = KvType::f16,
                                                 int tokens_per_pass = 512, KvStorage storage = KvStorage::host,
                                                 bool turn_window = true);
  // The bytes create() allocates for n_ctx positions (K and V of its pool).
  static uint64_t bytes_for(const ModelConfig& c, int n_ctx, KvType type = KvType::f16, int tokens_per_pass = 512,
                            KvStorage storage = KvStorage::host, bool turn_window = true);
  // A sequence in a shared pool.
  static std::unique_ptr<KvCache> create_in(std::shared_ptr<KvPool> pool, int n_ctx);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  int n_ctx() const { return n_ctx_; }
  int n_past() const { return static_cast<int>(tokens_.size()); }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  KvPool& pool() { return *pool_; }
  const KvPool& pool() const { return *pool_; }
  const std::vector<int>& block_table() const { return table_; }
  // Whether the sequence holds the window part of its i-th block.
  bool holds_window(int i) const { return held_[i] != 0; }
  // The block of the first key that the query at position n sees in a
  // sliding-window layer (0 without them).
  int first_window_block(int n) const;
  // Whether layer il's K/V row of position pos (< n_past) exists: always
  // for a full-attention layer, while the block has its window part for a
  // sliding-window one.
  bool has_row(int il, int pos) const;

  KvType type() const { return pool_->type(); }

  // Makes positions [n_past, n_past + n) writable: gives back the window
  // parts the query at n_past can no longer see, allocates blocks, and
  // copies a shared or published block before it is written (copy on
  // write).
  Status reserve(int n);
  // The copy on write the last reserve() made of the partly filled block it
  // continues: table entry `index` now holds a copy of block `src`'s first n
  // positions (src's window part was src_window_slot, its generation
  // src_generation). A backend that keeps
  // K/V elsewhere (the CUDA device) mirrors it, and may meet the reservation
  // only after the fact: the engine loop reserves while it plans the pass.
  // take_tail_copy() returns it once (index -1: none); a truncate() that drops
  // its block drops it.
  struct TailCopy {
    int index = -1, src = -1, src_window_slot = -1, n = 0;
    uint32_t src_generation = 0;
  };
  TailCopy take_tail_copy() { return std::exchange(tail_copy_, TailCopy{}); }
  // Backends call this after writing K/V for the new tokens; blocks that
  // became full are published (when the prefix cache is on).
  void append(const int32_t* tokens, int n);
  // Forgets positions >= n (rollback, or reuse of a common prefix) and
  // returns n_past: n, or less when the window parts that position n's
  // query would see were given back and taken by other blocks (then the
  // longest prefix whose window is still there, often 0).
  int truncate(int n);
  void clear() { truncate(0); }

  // Makes the cache hold the longest reusable prefix of tokens[0, limit):
  // the common prefix with what it holds, then published blocks found by
  // hash, as far as the window before its end is still there. Returns that
  // prefix's length.
  int reuse_prefix(const int32_t* tokens, int limit);
  // What reuse_prefix would return, without changing anything.
  int reusable_prefix(const int32_t* tokens, int limit) const;
  void set_prefix_cache(bool on) { prefix_cache_ = on; }

  // Keeps the window parts that the query at n_past sees (and one block
  // before them) from being taken by other blocks until the next pin, so
  // that a later truncate to about here still finds its window after a
  // long answer moved the sequence's own window on: a chat's next turn
  // re-renders the answer and usually differs from the sampled tokens where
  // it began, and regenerate starts there. Session pins at the end of each
  // prompt; create() sizes the window store with room for it (turn_window),
  // and without that room (or in a shared pool: create_in) nothing is pinned.
  void pin_window();
  void unpin_window();
  bool prefix_cache() const { return prefix_cache_; }

 private:
  KvCache() = default;
  // Of the first blocks of a prefix, where has(i) says whether block i's
  // window part is held or can be taken back: the longest prefix <= n whose
  // next query finds its window.
  template <class Has>
  int windowed_prefix(int n, Has has) const;
  // What reuse_prefix(tokens, limit) makes the cache hold: the returned
  // length, and in *found the published blocks it takes after the block
  // boundary at or before the common prefix (none: it keeps the common
  // prefix, or less, of its own).
  int plan_reuse(const int32_t* tokens, int limit, std::vector<int>* found) const;
  // Holds the window parts of blocks [first_window_block(n), table size)
  // and gives back those before (every one of them must be there:
  // windowed_prefix).
  void hold_window_for(int n);
  void release_windows_before(int first);  // of the held blocks before block `first`
  void release_block(int i);               // the table's i-th block, and its window part if held
  void drop_blocks_from(int keep);         // the table's blocks [keep, size)
  std::shared_ptr<KvPool> pool_;
  int n_ctx_ = 0;
  bool prefix_cache_ = true;
  TailCopy tail_copy_;
  bool pin_room_ = false;          // create() made room for pin_window()
  std::vector<int> table_;         // block of each kBlockTokens positions
  std::vector<uint8_t> held_;      // per table entry: 1 while its window part is held
  int held_from_ = 0;              // no entry before it holds its window part
  std::vector<uint64_t> hashes_;   // chain hash of each full block
  std::vector<int32_t> tokens_;    // token at each position
  std::vector<int> found_;         // scratch of reuse_prefix
  struct Pin {
    int block;
    uint32_t generation;  // the block's life when pinned: a block handed out again has lost its part
  };
  std::vector<Pin> pins_;          // window parts held by pin_window()
};

}  // namespace phaselab
