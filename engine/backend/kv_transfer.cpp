// The KV transfer of the disaggregated policy (backend.h: export_kv,
// import_kv): a sequence's K/V leave one backend as plain bytes and enter
// another, laid out by the destination pool's own blocks. The backends move
// the rows (Backend::read_kv_rows, append_kv_rows): the CPU ones from and
// to their host store, the CUDA one from and to the device.
#include <algorithm>

#include "phaselab/backend.h"

namespace phaselab {

Status Backend::read_kv_rows(const KvCache&, int, int, const KvRows&) {
  return unsupported(name() + " backend: it cannot hand K/V over");
}

Status Backend::append_kv_rows(KvCache&, const int32_t*, int, const KvRows&) {
  return unsupported(name() + " backend: it cannot take K/V handed over");
}

namespace {

// The first position whose layer-il rows the query at position n sees.
int first_needed(const KvCache& kv, int il, int n) {
  return kv.pool().is_local(il) ? kv.first_window_block(n) * KvPool::kBlockTokens : 0;
}

// Layer il's K rows start at at[il] in the blob, its V rows count[il] rows
// later; rows of positions [p, p + m) from there.
struct BlobRows {
  std::vector<uint8_t*> k, v;
  void point(KvBlob& blob, int n, int p) {
    const size_t layers = blob.first.size(), rb = blob.row_bytes;
    k.resize(layers);
    v.resize(layers);
    size_t at = 0;
    for (size_t il = 0; il < layers; il++) {
      const int first = blob.first[il], count = n - first;
      const size_t skip = static_cast<size_t>(std::max(0, std::min(p, n) - first));
      k[il] = blob.bytes.data() + at + skip * rb;
      v[il] = blob.bytes.data() + at + (count + skip) * rb;
      at += 2 * static_cast<size_t>(count) * rb;
    }
  }
};

}  // namespace

Status export_kv(Backend& backend, const KvCache& kv, KvBlob* blob) {
  if (!backend.can_transfer_kv()) return backend.read_kv_rows(kv, 0, 0, KvRows{});
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
  BlobRows rows;
  rows.point(*blob, n, 0);
  return backend.read_kv_rows(kv, 0, n, KvRows{blob->first.data(), rows.k.data(), rows.v.data()});
}

Status import_kv(Backend& backend, KvCache& kv, const KvBlob& blob, int chunk_tokens) {
  const KvPool& pool = kv.pool();
  const int n = static_cast<int>(blob.tokens.size()), n_layer = pool.n_layer();
  if (kv.n_past() != 0) return invalid_argument("KV import: the sequence must be empty");
  if (blob.type != pool.type() || blob.row_bytes != pool.row_bytes() || static_cast<int>(blob.first.size()) != n_layer)
    return invalid_argument("KV import: the K/V come from a pool of another model or K/V type");
  if (n > kv.n_ctx()) return invalid_argument("KV import: the sequence is longer than the context");
  // (The rows are only read: BlobRows points into the blob.)
  KvBlob& bytes = const_cast<KvBlob&>(blob);
  BlobRows rows;
  const int step = std::max(1, chunk_tokens);
  for (int p = 0; p < n; p += step) {
    const int m = std::min(step, n - p);
    rows.point(bytes, n, p);
    if (Status st = backend.append_kv_rows(kv, blob.tokens.data() + p, m, KvRows{blob.first.data(), rows.k.data(), rows.v.data()});
        !st) {
      kv.clear();
      return st;
    }
  }
  return Status::ok();
}

}  // namespace phaselab
