// The KV transfer of the disaggregated policy (backend.h: export_kv,
// import_kv): a sequence's K/V leave one CPU backend's store as plain bytes
// and enter another's, laid out by the destination pool's own blocks.
#include <chrono>
#include <cstring>

#include "host_kv_store.h"
#include "phaselab/backend.h"

namespace phaselab {

namespace {

// The first position whose layer-il rows the query at position n sees.
int first_needed(const KvCache& kv, int il, int n) {
  return kv.pool().is_local(il) ? kv.first_window_block(n) * KvPool::kBlockTokens : 0;
}

}  // namespace

Status export_kv(Backend& backend, const KvCache& kv, KvBlob* blob) {
  HostKvStore* store = host_kv_store(backend);
  if (!store || !store->find(kv.pool()))
    return unsupported(backend.name() + " backend: its K/V are not in host memory, so they cannot be handed over "
                       "(the disaggregated policy runs on the CPU backends)");
  const KvPool& pool = kv.pool();
  const int n = kv.n_past(), n_layer = pool.n_layer();
  const size_t rb = pool.row_bytes();
  blob->tokens = kv.tokens();
  blob->type = pool.type();
  blob->row_bytes = rb;
  blob->first.resize(n_layer);
  size_t total = 0;
  for (int il = 0; il < n_layer; il++) {
    blob->first[il] = std::min(first_needed(kv, il, n), n);
    total += 2 * static_cast<size_t>(n - blob->first[il]) * rb;
  }
  blob->bytes.resize(total);
  SeqKv rows = store->of(kv);
  uint8_t* out = blob->bytes.data();
  for (int il = 0; il < n_layer; il++)
    for (int key = 1; key >= 0; key--)
      for (int pos = blob->first[il]; pos < n; pos++, out += rb) {
        if (!kv.has_row(il, pos))
          return internal_error("KV export: layer " + std::to_string(il) + " has no row at position " +
                                std::to_string(pos));
        std::memcpy(out, key ? rows.k(il, pos) : rows.v(il, pos), rb);
      }
  return Status::ok();
}

Status import_kv(Backend& backend, KvCache& kv, const KvBlob& blob, int chunk_tokens) {
  HostKvStore* store = host_kv_store(backend);
  if (!store)
    return unsupported(backend.name() + " backend: its K/V are not in host memory, so it cannot take K/V handed over "
                       "(the disaggregated policy runs on the CPU backends)");
  KvPool& pool = kv.pool();
  const int n = static_cast<int>(blob.tokens.size()), n_layer = pool.n_layer();
  if (kv.n_past() != 0) return invalid_argument("KV import: the sequence must be empty");
  if (blob.type != pool.type() || blob.row_bytes != pool.row_bytes() || static_cast<int>(blob.first.size()) != n_layer)
    return invalid_argument("KV import: the K/V come from a pool of another model or K/V type");
  if (n > kv.n_ctx()) return invalid_argument("KV import: the sequence is longer than the context");
  const size_t rb = blob.row_bytes;
  // Where layer il's K rows start in the blob (its V rows follow them).
  std::vector<size_t> at(n_layer);
  for (size_t il = 0, off = 0; il < at.size(); il++) {
    at[il] = off;
    off += 2 * static_cast<size_t>(n - blob.first[il]) * rb;
  }
  const int step = std::max(1, chunk_tokens);
  for (int p = 0; p < n; p += step) {
    const int m = std::min(step, n - p);
    if (Status st = kv.reserve(m); !st) {
      kv.clear();
      return st;
    }
    auto bytes = store->prepare(pool);
    if (!bytes) {
      kv.clear();
      return bytes.status();
    }
    SeqKv rows = store->of(kv);
    for (int il = 0; il < n_layer; il++) {
      const int count = n - blob.first[il];
      for (int pos = std::max(p, blob.first[il]); pos < p + m; pos++) {
        const size_t j = static_cast<size_t>(pos - blob.first[il]);
        std::memcpy(rows.k(il, pos), blob.bytes.data() + at[il] + j * rb, rb);
        std::memcpy(rows.v(il, pos), blob.bytes.data() + at[il] + (count + j) * rb, rb);
      }
    }
    kv.append(blob.tokens.data() + p, m);
  }
  return Status::ok();
}

}  // namespace phaselab
