#include "phaselab/kv_cache.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <new>

namespace phaselab {

// ---- KvPool -------------------------------------------------------------------

const char* kv_type_name(KvType t) {
  switch (t) {
    case KvType::f32: return "f32";
    case KvType::bf16: return "bf16";
    default: return "f16";
  }
}

std::optional<KvType> kv_type_from_name(std::string_view name) {
  if (name == "f32") return KvType::f32;
  if (name == "f16") return KvType::f16;
  if (name == "bf16") return KvType::bf16;
  return std::nullopt;
}

Result<std::shared_ptr<KvPool>> KvPool::create(const ModelConfig& c, int n_blocks, KvType type) {
  if (n_blocks < 1) return invalid_argument("the KV pool needs at least one block");
  std::shared_ptr<KvPool> p(new KvPool());
  p->n_blocks_ = n_blocks;
  p->n_layer_ = c.n_layer;
  p->n_embd_kv_ = c.n_embd_kv();
  p->type_ = type;
  p->elem_ = kv_type_bytes(type);
  const size_t n = static_cast<size_t>(n_blocks) * c.n_layer * kBlockTokens * c.n_embd_kv() * p->elem_;
  try {
    p->k_.assign(n, 0);
    p->v_.assign(n, 0);
    p->block_tokens_.assign(static_cast<size_t>(n_blocks) * kBlockTokens, -1);
  } catch (const std::bad_alloc&) {
    return out_of_memory("the KV cache of " + std::to_string(n_blocks * kBlockTokens) + " positions needs " +
                         std::to_string((2 * n) >> 20) + " MiB, which could not be allocated: lower the context size");
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
  return p;
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
  } else {
    return -1;
  }
  ref_[b] = 1;
  generation_[b]++;
  return b;
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
    free_.push_back(b);
  }
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
  for (int il = 0; il < n_layer_; il++) {
    std::memcpy(k(dst, il, 0), k(src, il, 0), elem_ * n * n_embd_kv_);
    std::memcpy(v(dst, il, 0), v(src, il, 0), elem_ * n * n_embd_kv_);
  }
}

// ---- KvCache ------------------------------------------------------------------

namespace {
// The context's blocks and one more: a sequence that continues a shared
// block copies it before writing (copy on write) while still holding the
// original. Blocks the sequence does not use keep other conversations' KV
// for reuse until they are needed.
int pool_blocks_for(int n_ctx) { return (n_ctx + KvPool::kBlockTokens - 1) / KvPool::kBlockTokens + 1; }
}  // namespace

uint64_t KvCache::bytes_for(const ModelConfig& c, int n_ctx, KvType type) {
  // K and V: (block, layer, position in block, n_embd_kv) values each.
  return 2ull * static_cast<uint64_t>(pool_blocks_for(n_ctx)) * static_cast<uint64_t>(c.n_layer) *
         KvPool::kBlockTokens * static_cast<uint64_t>(c.n_embd_kv()) * kv_type_bytes(type);
}

Result<std::unique_ptr<KvCache>> KvCache::create(const ModelConfig& c, int n_ctx, KvType type) {
  if (n_ctx < 1) return invalid_argument("context size must be at least 1");
  auto pool = KvPool::create(c, pool_blocks_for(n_ctx), type);
  if (!pool) return pool.status();
  return create_in(std::move(*pool), n_ctx);
}

std::unique_ptr<KvCache> KvCache::create_in(std::shared_ptr<KvPool> pool, int n_ctx) {
  std::unique_ptr<KvCache> kv(new KvCache());
  kv->pool_ = std::move(pool);
  kv->n_ctx_ = n_ctx;
  kv->tokens_.reserve(n_ctx);
  kv->table_.reserve(n_ctx / KvPool::kBlockTokens + 1);
  kv->hashes_.reserve(n_ctx / KvPool::kBlockTokens + 1);
  kv->found_.reserve(n_ctx / KvPool::kBlockTokens + 1);
  return kv;
}

KvCache::~KvCache() { truncate(0); }

Status KvCache::reserve(int n) {
  const int p0 = n_past();
  if (p0 + n > n_ctx_)
    return Status(StatusCode::context_full, "the context is full (" + std::to_string(n_ctx_) +
                                                " tokens): start a new conversation or raise the context size");
  const int B = KvPool::kBlockTokens;
  // The block being continued may be shared or published: copy it first.
  if (p0 % B != 0) {
    const int bi = p0 / B;
    const int b = table_[bi];
    if (pool_->refcount(b) > 1 || pool_->published(b)) {
      const int nb = pool_->allocate();
      if (nb < 0) return out_of_memory("the KV cache pool is exhausted (every block is in use): raise the context size");
      pool_->copy_prefix(nb, b, p0 % B);
      pool_->release(b);
      table_[bi] = nb;
    }
  }
  while (static_cast<int>(table_.size()) * B < p0 + n) {
    const int nb = pool_->allocate();
    if (nb < 0) return out_of_memory("the KV cache pool is exhausted (every block is in use): raise the context size");
    table_.push_back(nb);
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

void KvCache::truncate(int n) {
  n = std::clamp(n, 0, n_past());
  tokens_.resize(n);
  const int B = KvPool::kBlockTokens;
  const size_t keep_blocks = static_cast<size_t>((n + B - 1) / B);
  while (table_.size() > keep_blocks) {
    pool_->release(table_.back());
    table_.pop_back();
  }
  hashes_.resize(std::min(hashes_.size(), static_cast<size_t>(n / B)));
}

int KvCache::reusable_prefix(const int32_t* tokens, int limit) const {
  const int B = KvPool::kBlockTokens;
  int common = 0;
  const int lim = std::min(n_past(), limit);
  while (common < lim && tokens_[common] == tokens[common]) common++;
  if (!prefix_cache_) return common;
  int at = common / B * B;
  uint64_t prev = at > 0 ? hashes_[at / B - 1] : 0;
  while (at + B <= limit) {
    const uint64_t h = KvPool::chain_hash(prev, tokens + at);
    if (pool_->lookup(h, prev, tokens + at) < 0) break;
    prev = h;
    at += B;
  }
  return std::max(at, common);
}

int KvCache::reuse_prefix(const int32_t* tokens, int limit) {
  const int B = KvPool::kBlockTokens;
  int common = 0;
  const int lim = std::min(n_past(), limit);
  while (common < lim && tokens_[common] == tokens[common]) common++;
  if (!prefix_cache_) {
    truncate(common);
    return common;
  }
  // From the block boundary at or before the common prefix, published blocks
  // may carry the prefix further (another conversation's, or this one's
  // before it was overwritten).
  // (Every full block below n_past has its hash, so the chain is known.)
  const int boundary = common / B * B;
  int at = boundary;
  uint64_t prev = at > 0 ? hashes_[at / B - 1] : 0;
  found_.clear();
  while (at + B <= limit) {
    const uint64_t h = KvPool::chain_hash(prev, tokens + at);
    const int b = pool_->lookup(h, prev, tokens + at);
    if (b < 0) break;
    found_.push_back(b);
    prev = h;
    at += B;
  }
  if (at <= common) {
    truncate(common);
    return common;
  }
  // Take the published blocks: keep ours up to the boundary, then share.
  for (int b : found_) pool_->retain(b);  // before truncate may release them
  truncate(boundary);
  for (int b : found_) {
    const int bi = static_cast<int>(table_.size());
    table_.push_back(b);
    tokens_.insert(tokens_.end(), tokens + bi * B, tokens + (bi + 1) * B);
    hashes_.push_back(KvPool::chain_hash(bi ? hashes_[bi - 1] : 0, tokens + bi * B));
  }
  return at;
}

}  // namespace phaselab
