#include "host_kv_store.h"

#include <cstring>
#include <new>
#include <string>

namespace phaselab {

HostKv::HostKv(const KvPool& pool)
    : pool_(&pool), n_full_(pool.n_layer() - pool.n_local_layers()), n_local_(pool.n_local_layers()),
      row_bytes_(pool.row_bytes()) {
  for (int il = 0; il < pool.n_layer(); il++) {
    layer_local_.push_back(pool.is_local(il) ? 1 : 0);
    layer_index_.push_back(pool.layer_index(il));
  }
  k_.assign(pool.store_bytes(false), 0);
  v_.assign(pool.store_bytes(false), 0);
  wk_.assign(pool.store_bytes(true), 0);
  wv_.assign(pool.store_bytes(true), 0);
}

void HostKv::apply_copies(KvPool& pool) {
  for (const KvPool::PendingCopy& c : pool.pending_copies())
    for (size_t il = 0; il < layer_local_.size(); il++) {
      const int l = static_cast<int>(il);
      if (layer_local_[il] && (c.dst_window_slot < 0 || c.src_window_slot < 0)) continue;
      std::memcpy(rows_of(true, l, c.dst, c.dst_window_slot), rows_of(true, l, c.src, c.src_window_slot), row_bytes_ * c.n);
      std::memcpy(rows_of(false, l, c.dst, c.dst_window_slot), rows_of(false, l, c.src, c.src_window_slot), row_bytes_ * c.n);
    }
  pool.clear_pending_copies();
}

Result<HostKv*> HostKvStore::prepare(KvPool& pool) {
  // Pools that are gone give their bytes back first.
  pools_.erase(std::remove_if(pools_.begin(), pools_.end(), [](const Entry& e) { return e.pool.expired(); }),
               pools_.end());
  HostKv* kv = find(pool);
  if (!kv) {
    try {
      auto made = std::make_unique<HostKv>(pool);
      kv = made.get();
      pools_.push_back(Entry{pool.id(), pool.weak_from_this(), std::move(made)});
    } catch (const std::bad_alloc&) {
      return out_of_memory("the KV cache of " + std::to_string(pool.n_blocks() * KvPool::kBlockTokens) +
                           " positions needs " + std::to_string(pool.copy_bytes() >> 20) +
                           " MiB, which could not be allocated: lower the context size");
    }
  }
  if (!pool.pending_copies().empty()) kv->apply_copies(pool);
  return kv;
}

HostKv* HostKvStore::find(const KvPool& pool) {
  for (Entry& e : pools_)
    if (e.id == pool.id()) return e.kv.get();
  return nullptr;
}

SeqKv HostKvStore::of(const KvCache& seq) { return SeqKv(seq, *find(seq.pool())); }

}  // namespace phaselab
