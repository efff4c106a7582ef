#include "phaselab/kv_cache.h"

#include <algorithm>
#include <atomic>
#include <new>

namespace phaselab {

// ---- KvPool -------------------------------------------------------------------

const char* kv_type_name(KvType t) {
  switch (t) {
    case KvType::f32: return "f32";
    case KvType::bf16: return "bf16";
    case KvType::q8_0: return "q8_0";
    default: return "f16";
  }
}

std::optional<KvType> kv_type_from_name(std::string_view name) {
  if (name == "f32") return KvType::f32;
  if (name == "f16") return KvType::f16;
  if (name == "bf16") return KvType::bf16;
  if (name == "q8_0") return KvType::q8_0;
  return std::nullopt;
}

namespace {
int local_layers(const ModelConfig& c) {
  if (c.sliding_window <= 0) return 0;
  int n = 0;
  for (int il = 0; il < c.n_layer; il++) n += c.is_swa(il) ? 1 : 0;
  return n;
}
int window_slots(const ModelConfig& c, int n_blocks, int n_window_blocks) {
  if (local_layers(c) == 0) return 0;
  return n_window_blocks <= 0 ? n_blocks : std::min(n_window_blocks, n_blocks);
}
}  // namespace

uint64_t KvPool::bytes_for(const ModelConfig& c, int n_blocks, KvType type, int n_window_blocks, KvStorage storage) {
  if (storage != KvStorage::host) return 0;
  // K and V: (block, layer, position in block, n_embd_kv) values each, the
  // local layers' for the window parts alone (store_bytes).
  const int n_local = local_layers(c);
  const size_t row = kv_row_bytes(type, c.n_embd_kv());
  return 2 * (layout_bytes(n_blocks, c.n_layer - n_local, row) +
              layout_bytes(window_slots(c, n_blocks, n_window_blocks), n_local, row));
}

int KvPool::window_blocks_for(const ModelConfig& c, int n_seqs, int tokens_per_pass) {
  if (local_layers(c) == 0) return 0;
  const int B = kBlockTokens;
  n_seqs = std::max(1, n_seqs);
  tokens_per_pass = std::max(1, tokens_per_pass);
  // A pass of T tokens from position p holds the blocks of positions
  // [p - window + 1, p + T): at most (window + T - 2) / B + 2 of them, one
  // more while a shared last block is copied. With several sequences, those
  // not yet given their next chunk still hold their last one: the pass's
  // tokens count twice.
  const int window_part = std::max(0, c.sliding_window - 2) / B;
  const long tokens = n_seqs == 1 ? tokens_per_pass : 2L * tokens_per_pass;
  const long n = n_seqs == 1 ? window_part + 3 + (tokens + B - 1) / B
                             : static_cast<long>(n_seqs) * (window_part + 4) + (tokens + B - 1) / B;
  return static_cast<int>(std::min<long>(n, 1L << 30));
}

Result<std::shared_ptr<KvPool>> KvPool::create(const ModelConfig& c, int n_blocks, KvType type, int n_window_blocks,
                                               KvStorage storage) {
  if (n_blocks < 1) return invalid_argument("the KV pool needs at least one block");
  if (type == KvType::q8_0 && (c.head_dim % 32 != 0 || c.n_embd_kv() % 32 != 0))
    return invalid_argument("a q8_0 KV cache stores each head in blocks of 32 values, and this model's heads have " +
                            std::to_string(c.head_dim) + ": store K/V as f16 instead (--cache-type f16; in the app, Settings > "
                            "Preferences > KV cache storage)");
  std::shared_ptr<KvPool> p(new KvPool());
  p->n_blocks_ = n_blocks;
  p->n_layer_ = c.n_layer;
  p->n_embd_kv_ = c.n_embd_kv();
  p->type_ = type;
  p->storage_ = storage;
  p->row_bytes_ = kv_row_bytes(type, c.n_embd_kv());
  p->n_local_ = local_layers(c);
  p->n_full_ = c.n_layer - p->n_local_;
  p->window_ = p->n_local_ > 0 ? c.sliding_window : 0;
  p->n_wslots_ = window_slots(c, n_blocks, n_window_blocks);
  for (int il = 0, nf = 0, nl = 0; il < c.n_layer; il++) {
    const bool local = p->n_local_ > 0 && c.is_swa(il);
    p->layer_local_.push_back(local ? 1 : 0);
    p->layer_index_.push_back(local ? nl++ : nf++);
  }
  // The books only: the backend that runs the pool holds its K/V.
  try {
    p->block_tokens_.assign(static_cast<size_t>(n_blocks) * kBlockTokens, -1);
  } catch (const std::bad_alloc&) {
    return out_of_memory("the KV cache's books for " + std::to_string(n_blocks * kBlockTokens) +
                         " positions could not be allocated: lower the context size");
  }
  static std::atomic<uint64_t> next_id{1};
  p->id_ = next_id++;
  p->generation_.assign(n_blocks, 0);
  p->ref_.assign(n_blocks, 0);
  p->published_.assign(n_blocks, 0);
  p->hash_.assign(n_blocks, 0);
  p->prev_hash_.assign(n_blocks, 0);
  p->lru_pos_.resize(n_blocks);
  for (int b = n_blocks - 1; b >= 0; b--) p->free_.push_back(b);
  p->wslot_.assign(n_blocks, -1);
  p->wref_.assign(n_blocks, 0);
  p->wlru_pos_.resize(n_blocks);
  for (int w = p->n_wslots_ - 1; w >= 0; w--) p->wfree_.push_back(w);
  return p;
}

std::string KvPool::window_note() const {
  if (!windowed()) return "";
  return std::to_string(n_local_) + " of " + std::to_string(n_layer_) + " layers keep only their " +
         std::to_string(window_) + "-position window";
}

int KvPool::n_shared() const {
  return static_cast<int>(std::count_if(ref_.begin(), ref_.end(), [](int r) { return r > 1; }));
}

int KvPool::allocate() {
  int b;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else if (!lru_.empty()) {
    b = lru_.front();  // evict the least recently used cached block
    lru_.pop_front();
    unpublish(b);
    drop_window_part(b);
  } else {
    return -1;
  }
  if (windowed()) {
    const int w = take_window_slot();
    if (w < 0) {  // blocks remain but window parts do not
      free_.push_back(b);
      return -1;
    }
    wslot_[b] = w;
    wref_[b] = 1;
  }
  ref_[b] = 1;
  generation_[b]++;
  return b;
}

int KvPool::take_window_slot() {
  if (!wfree_.empty()) {
    const int w = wfree_.back();
    wfree_.pop_back();
    return w;
  }
  if (wlru_.empty()) return -1;
  const int owner = wlru_.front();  // a window part no sequence holds, the oldest
  wlru_.pop_front();
  const int w = wslot_[owner];
  wslot_[owner] = -1;
  return w;
}

void KvPool::drop_window_part(int b) {
  if (!windowed() || wslot_[b] < 0) return;
  if (wref_[b] == 0) wlru_.erase(wlru_pos_[b]);
  wref_[b] = 0;
  wfree_.push_back(wslot_[b]);
  wslot_[b] = -1;
}

void KvPool::retain(int b) {
  if (ref_[b]++ == 0 && published_[b]) lru_.erase(lru_pos_[b]);
}

void KvPool::release(int b) {
  if (ref_[b] <= 0) return;  // tolerated: never below zero
  if (--ref_[b] > 0) return;
  if (published_[b]) {
    lru_.push_back(b);
    lru_pos_[b] = std::prev(lru_.end());
  } else {
    drop_window_part(b);  // nobody can find this block's K/V again
    free_.push_back(b);
  }
}

bool KvPool::retain_window(int b) {
  if (!windowed()) return true;
  if (wslot_[b] < 0) return false;
  if (wref_[b]++ == 0) wlru_.erase(wlru_pos_[b]);
  return true;
}

void KvPool::release_window(int b) {
  if (!windowed() || wslot_[b] < 0 || wref_[b] <= 0) return;
  if (--wref_[b] > 0) return;
  wlru_.push_back(b);
  wlru_pos_[b] = std::prev(wlru_.end());
}

uint64_t KvPool::chain_hash(uint64_t prev, const int32_t* tokens) {
  // FNV-1a over the previous hash and the token ids, then a final mix.
  uint64_t h = 1469598103934665603ull ^ prev;
  for (int i = 0; i < kBlockTokens; i++) {
    uint32_t t = static_cast<uint32_t>(tokens[i]);
    for (int byte = 0; byte < 4; byte++) {
      h ^= (t >> (8 * byte)) & 0xFF;
      h *= 1099511628211ull;
    }
  }
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

bool KvPool::publish(int b, uint64_t hash, uint64_t prev_hash, const int32_t* tokens) {
  if (published_[b] || lookup(hash, prev_hash, tokens) >= 0) return false;
  published_[b] = 1;
  hash_[b] = hash;
  prev_hash_[b] = prev_hash;
  std::copy_n(tokens, kBlockTokens, block_tokens_.begin() + static_cast<long>(b) * kBlockTokens);
  by_hash_.emplace(hash, b);
  return true;
}

void KvPool::unpublish(int b) {
  if (!published_[b]) return;
  auto range = by_hash_.equal_range(hash_[b]);
  for (auto it = range.first; it != range.second; ++it)
    if (it->second == b) {
      by_hash_.erase(it);
      break;
    }
  published_[b] = 0;
}

int KvPool::lookup(uint64_t hash, uint64_t prev_hash, const int32_t* tokens) const {
  auto range = by_hash_.equal_range(hash);
  for (auto it = range.first; it != range.second; ++it) {
    const int b = it->second;
    if (prev_hash_[b] == prev_hash &&
        std::equal(tokens, tokens + kBlockTokens, block_tokens_.begin() + static_cast<long>(b) * kBlockTokens))
      return b;
  }
  return -1;
}

void KvPool::copy_prefix(int dst, int src, int n) {
  if (storage_ != KvStorage::host) return;
  pending_.push_back(PendingCopy{dst, window_slot(dst), src, window_slot(src), n});
}

// ---- KvCache ------------------------------------------------------------------

namespace {
// The context's blocks and one more: a sequence that continues a shared
// block copies it before writing (copy on write) while still holding the
// original. Blocks the sequence does not use keep other conversations' KV
// for reuse until they are needed.
int pool_blocks_for(int n_ctx) { return (n_ctx + KvPool::kBlockTokens - 1) / KvPool::kBlockTokens + 1; }
// A sequence's own window parts, and room for a pinned window (pin_window:
// the blocks of a window and the one before it).
int own_window_blocks(const ModelConfig& c, int tokens_per_pass, bool turn_window) {
  const int own = KvPool::window_blocks_for(c, 1, tokens_per_pass);
  if (own == 0 || !turn_window) return own;
  return own + std::max(0, c.sliding_window - 1) / KvPool::kBlockTokens + 2;
}
}  // namespace

uint64_t KvCache::bytes_for(const ModelConfig& c, int n_ctx, KvType type, int tokens_per_pass, KvStorage storage,
                            bool turn_window) {
  return KvPool::bytes_for(c, pool_blocks_for(n_ctx), type, own_window_blocks(c, tokens_per_pass, turn_window),
                           storage);
}

Result<std::unique_ptr<KvCache>> KvCache::create(const ModelConfig& c, int n_ctx, KvType type, int tokens_per_pass,
                                                 KvStorage storage, bool turn_window) {
  if (n_ctx < 1) return invalid_argument("context size must be at least 1");
  auto pool =
      KvPool::create(c, pool_blocks_for(n_ctx), type, own_window_blocks(c, tokens_per_pass, turn_window), storage);
  if (!pool) return pool.status();
  auto kv = create_in(std::move(*pool), n_ctx);
  kv->pin_room_ = turn_window;
  return kv;
}

std::unique_ptr<KvCache> KvCache::create_in(std::shared_ptr<KvPool> pool, int n_ctx) {
  std::unique_ptr<KvCache> kv(new KvCache());
  kv->pool_ = std::move(pool);
  kv->n_ctx_ = n_ctx;
  kv->tokens_.reserve(n_ctx);
  kv->table_.reserve(n_ctx / KvPool::kBlockTokens + 1);
  kv->held_.reserve(n_ctx / KvPool::kBlockTokens + 1);
  kv->hashes_.reserve(n_ctx / KvPool::kBlockTokens + 1);
  kv->found_.reserve(n_ctx / KvPool::kBlockTokens + 1);
  return kv;
}

KvCache::~KvCache() {
  truncate(0);
  unpin_window();
}

void KvCache::pin_window() {
  unpin_window();
  const int n = n_past();
  if (!pin_room_ || !pool_->windowed() || n == 0) return;
  for (int i = std::max(0, first_window_block(n) - 1); i <= (n - 1) / KvPool::kBlockTokens; i++) {
    const int b = table_[i];
    if (pool_->retain_window(b)) pins_.push_back({b, pool_->generation(b)});
  }
}

void KvCache::unpin_window() {
  for (const Pin& p : pins_)
    if (pool_->generation(p.block) == p.generation) pool_->release_window(p.block);
  pins_.clear();
}

int KvCache::first_window_block(int n) const {
  // The query at position n sees keys (n - window, n].
  return pool_->windowed() ? std::max(0, n - pool_->window() + 1) / KvPool::kBlockTokens : 0;
}

bool KvCache::has_row(int il, int pos) const {
  return !pool_->is_local(il) || pool_->has_window_part(table_[pos / KvPool::kBlockTokens]);
}

void KvCache::release_block(int i) {
  if (held_[i]) pool_->release_window(table_[i]);
  pool_->release(table_[i]);
}

template <class Has>
int KvCache::windowed_prefix(int n, Has has) const {
  if (!pool_->windowed()) return n;
  const int B = KvPool::kBlockTokens;
  while (n > 0) {
    // Blocks [first, last] hold the keys the query at n sees (the last is
    // the one written next when n is mid-block; that part is needed too).
    const int first = first_window_block(n), last = (n - 1) / B;
    int missing = -1;
    for (int i = last; i >= first && missing < 0; i--)
      if (!has(i)) missing = i;
    if (missing < 0) return n;
    n = missing * B;  // the longest prefix that does not need the missing block
  }
  return 0;
}

void KvCache::release_windows_before(int first) {
  for (int i = held_from_; i < first; i++)
    if (held_[i]) {
      pool_->release_window(table_[i]);
      held_[i] = 0;
    }
  held_from_ = std::max(held_from_, first);
}

void KvCache::hold_window_for(int n) {
  if (!pool_->windowed()) return;
  const int end = static_cast<int>(table_.size());
  const int first = std::min(first_window_block(n), end);
  for (int i = first; i < end; i++)
    if (!held_[i]) held_[i] = pool_->retain_window(table_[i]) ? 1 : 0;  // windowed_prefix saw it there
  release_windows_before(first);
  held_from_ = first;
}

void KvCache::drop_blocks_from(int keep) {
  while (static_cast<int>(table_.size()) > keep) {
    release_block(static_cast<int>(table_.size()) - 1);
    table_.pop_back();
    held_.pop_back();
  }
  held_from_ = std::min(held_from_, keep);
}

Status KvCache::reserve(int n) {
  const int p0 = n_past();
  if (p0 + n > n_ctx_)
    return Status(StatusCode::context_full, "the context is full (" + std::to_string(n_ctx_) +
                                                " tokens): start a new conversation or raise the context size");
  const int B = KvPool::kBlockTokens;
  // Window parts the first new query cannot see go back to the pool (kept
  // there for reuse until another block needs the room). Done here, not in
  // append, so that a rollback before the next pass finds them still held.
  if (pool_->windowed()) release_windows_before(std::min(first_window_block(p0), static_cast<int>(table_.size())));
  // The block being continued may be shared or published: copy it first.
  if (p0 % B != 0) {
    const int bi = p0 / B;
    const int b = table_[bi];
    if (pool_->refcount(b) > 1 || pool_->published(b)) {
      const int nb = pool_->allocate();
      if (nb < 0) return out_of_memory("the KV cache pool is exhausted (every block is in use): raise the context size");
      pool_->copy_prefix(nb, b, p0 % B);
      tail_copy_ = TailCopy{bi, b, pool_->window_slot(b), p0 % B, pool_->generation(b)};
      release_block(bi);
      table_[bi] = nb;
      held_[bi] = pool_->windowed() ? 1 : 0;
    }
  }
  while (static_cast<int>(table_.size()) * B < p0 + n) {
    const int nb = pool_->allocate();
    if (nb < 0) return out_of_memory("the KV cache pool is exhausted (every block is in use): raise the context size");
    table_.push_back(nb);
    held_.push_back(pool_->windowed() ? 1 : 0);
  }
  return Status::ok();
}

void KvCache::append(const int32_t* tokens, int n) {
  const int B = KvPool::kBlockTokens;
  tokens_.insert(tokens_.end(), tokens, tokens + n);
  while (static_cast<int>(hashes_.size()) < n_past() / B) {
    const int bi = static_cast<int>(hashes_.size());
    const uint64_t prev = bi ? hashes_[bi - 1] : 0;
    const uint64_t h = KvPool::chain_hash(prev, tokens_.data() + bi * B);
    hashes_.push_back(h);
    if (prefix_cache_) pool_->publish(table_[bi], h, prev, tokens_.data() + bi * B);
  }
}

int KvCache::truncate(int n) {
  n = std::clamp(n, 0, n_past());
  // A copy on write stays to be mirrored while its block stays in the table
  // (a failed reservation truncates to n_past and keeps the copy).
  if (tail_copy_.index >= 0 && n <= tail_copy_.index * KvPool::kBlockTokens) tail_copy_ = TailCopy{};
  // The query at n must find its window: held, or still in the pool.
  n = windowed_prefix(n, [&](int i) { return held_[i] || pool_->has_window_part(table_[i]); });
  tokens_.resize(n);
  const int B = KvPool::kBlockTokens;
  drop_blocks_from((n + B - 1) / B);
  hashes_.resize(std::min(hashes_.size(), static_cast<size_t>(n / B)));
  hold_window_for(n);
  return n;
}

int KvCache::plan_reuse(const int32_t* tokens, int limit, std::vector<int>* found) const {
  const int B = KvPool::kBlockTokens;
  int common = 0;
  const int lim = std::min(n_past(), limit);
  while (common < lim && tokens_[common] == tokens[common]) common++;
  found->clear();
  // A block of ours has its window part while we hold it or the pool still has it.
  auto own = [&](int i) { return held_[i] || pool_->has_window_part(table_[i]); };
  if (prefix_cache_) {
    // From the block boundary at or before the common prefix, published
    // blocks may carry the prefix further (another conversation's, or this
    // one's before it was overwritten). (Every full block below n_past has
    // its hash, so the chain is known.)
    const int boundary = common / B * B, nb = boundary / B;
    int at = boundary;
    uint64_t prev = at > 0 ? hashes_[nb - 1] : 0;
    while (at + B <= limit) {
      const uint64_t h = KvPool::chain_hash(prev, tokens + at);
      const int b = pool_->lookup(h, prev, tokens + at);
      if (b < 0) break;
      found->push_back(b);
      prev = h;
      at += B;
    }
    // As far as the window before the prefix's end is still there.
    if (at > common)
      at = windowed_prefix(at, [&](int i) { return i < nb ? own(i) : pool_->has_window_part((*found)[i - nb]); });
    if (at > common) {
      found->resize(static_cast<size_t>(at / B - nb));
      return at;
    }
    found->clear();
  }
  return windowed_prefix(common, own);
}

int KvCache::reusable_prefix(const int32_t* tokens, int limit) const {
  std::vector<int> found;
  return plan_reuse(tokens, limit, &found);
}

int KvCache::reuse_prefix(const int32_t* tokens, int limit) {
  const int B = KvPool::kBlockTokens;
  const int at = plan_reuse(tokens, limit, &found_);
  if (found_.empty()) return truncate(at);
  // Take the published blocks: keep ours up to the boundary, then share.
  const int nb = at / B - static_cast<int>(found_.size());
  for (int b : found_) pool_->retain(b);  // before dropping ours may release them
  // Our blocks before the boundary are the prefix's: dropping the rest
  // cannot fail for want of a window, since the found blocks follow.
  tokens_.resize(static_cast<size_t>(nb) * B);
  drop_blocks_from(nb);
  hashes_.resize(std::min(hashes_.size(), static_cast<size_t>(nb)));
  for (int b : found_) {
    const int bi = static_cast<int>(table_.size());
    table_.push_back(b);
    held_.push_back(0);
    tokens_.insert(tokens_.end(), tokens + bi * B, tokens + (bi + 1) * B);
    hashes_.push_back(KvPool::chain_hash(bi ? hashes_[bi - 1] : 0, tokens + bi * B));
  }
  hold_window_for(at);
  return at;
}

}  // namespace phaselab
