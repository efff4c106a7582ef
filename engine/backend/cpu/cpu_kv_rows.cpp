// The CPU backends' side of the KV transfer (backend.h: read_kv_rows,
// append_kv_rows): rows copied between a blob and the host store.
#include <cstring>

#include "cpu_backend.h"

namespace phaselab {

namespace {

// fn(il, pos, j) for every row of [pos0, pos0 + n) that rows holds: j is
// its index among layer il's rows there.
template <class F>
void each_row(int n_layer, int pos0, int n, const KvRows& rows, F fn) {
  for (int il = 0; il < n_layer; il++) {
    const int from = std::max(pos0, rows.first[il]);
    for (int pos = from; pos < pos0 + n; pos++) fn(il, pos, static_cast<size_t>(pos - from));
  }
}

}  // namespace

Status CpuBackend::read_kv_rows(const KvCache& kv, int pos0, int n, const KvRows& rows) {
  if (!kv_store_.find(kv.pool())) return invalid_argument("KV export: this backend never ran the sequence's pool");
  if (pos0 < 0 || pos0 + n > kv.n_past()) return invalid_argument("KV export: positions beyond the sequence");
  const size_t rb = kv.pool().row_bytes();
  SeqKv seq = kv_store_.of(kv);
  Status st = Status::ok();
  each_row(kv.pool().n_layer(), pos0, n, rows, [&](int il, int pos, size_t j) {
    if (!kv.has_row(il, pos)) {
      st = internal_error("KV export: layer " + std::to_string(il) + " has no row at position " + std::to_string(pos));
      return;
    }
    std::memcpy(rows.k[il] + j * rb, seq.k(il, pos), rb);
    std::memcpy(rows.v[il] + j * rb, seq.v(il, pos), rb);
  });
  return st;
}

Status CpuBackend::append_kv_rows(KvCache& kv, const int32_t* tokens, int n, const KvRows& rows) {
  const int p = kv.n_past();
  if (Status st = kv.reserve(n); !st) {
    kv.truncate(p);
    return st;
  }
  auto store = kv_store_.prepare(kv.pool());
  if (!store) {
    kv.truncate(p);
    return store.status();
  }
  const size_t rb = kv.pool().row_bytes();
  SeqKv seq = kv_store_.of(kv);
  each_row(kv.pool().n_layer(), p, n, rows, [&](int il, int pos, size_t j) {
    std::memcpy(seq.k(il, pos), rows.k[il] + j * rb, rb);
    std::memcpy(seq.v(il, pos), rows.v[il] + j * rb, rb);
  });
  kv.append(tokens, n);
  return Status::ok();
}

}  // namespace phaselab
