// The CUDA backend's pass planning: the rows of a pass (one or more
// sequences' chunks) and what the kernels read of them.

#include "cuda_backend_impl.h"

namespace phaselab {

// Lays out parts_ as the rows of one pass and uploads what the kernels
// read: each row's token, position and block table (RowMap), and the rows
// whose logits are wanted. Parts of fewer than kTiledAttentionMin tokens
// (decode) come first, so that one launch of the per-query attention
// serves them all; each longer part (prefill) follows with rows of its
// own for the tiled kernel. Logits rows follow the parts' order. Part i's
// block table (and window-slot table) is in slot i; only entries that
// changed since the slot's last upload travel. pad_to > T: rows T .. pad_to are padding (token 0 at
// position 0 of the pad slot, whose one block no sequence has) for a
// captured graph's fixed batch size.
Status CudaDevice::plan(int pad_to) {
  const int n_parts = static_cast<int>(parts_.size());
  PHASELAB_TRY(ensure_slots(n_parts));
  const int B = max_batch_;
  int32_t* tok = meta_stage_;
  int32_t* pos = meta_stage_ + B;
  int32_t* at = meta_stage_ + 2 * B;
  int32_t* lrows = meta_stage_ + 3 * B;
  pass_ = Pass{};
  tiled_.clear();
  int T = 0;
  for (int tiled = 0; tiled < 2; tiled++)
    for (int i = 0; i < n_parts; i++) {
      Part& p = parts_[i];
      const bool wants_tiled = use_tiled_attention_ && p.n >= kTiledAttentionMin && tiled_fits_;
      if (wants_tiled != (tiled == 1)) continue;
      if (wants_tiled) tiled_.push_back(TiledChunk{T, p.n, p.p0 + p.n});
      row_of_[i] = T;
      for (int j = 0; j < p.n; j++, T++) {
        tok[T] = p.tokens[j];
        pos[T] = p.p0 + j;
        at[T] = i * table_cap_;
      }
      if (!wants_tiled) pass_.n_small = T;
      pass_.split_ctx = std::max(pass_.split_ctx, std::min(p.seq->n_ctx, table_cap_ * kBlock));
    }
  for (; T < pad_to; T++) {
    tok[T] = 0;
    pos[T] = 0;
    at[T] = n_slots_ * table_cap_;  // the pad slot
  }
  pass_.T = T;
  if (pad_to > 0) pass_.n_small = T;  // padding only with no tiled parts
  bool decode = true;
  for (const Part& p : parts_) decode = decode && p.n == 1;
  pass_.gemm = cublas_ && !decode && T >= gemm_min_tokens_;
  bool contiguous = true;
  for (int i = 0; i < n_parts; i++) {
    const Part& p = parts_[i];
    const int first = p.mode == kLogitsLast ? p.n - 1 : 0;
    const int n = p.mode == kLogitsLast ? 1 : p.mode == kLogitsAll ? p.n : 0;
    for (int j = first; j < first + n; j++) {
      lrows[pass_.n_logits] = row_of_[i] + j;
      contiguous = contiguous && lrows[pass_.n_logits] == lrows[0] + pass_.n_logits;
      pass_.n_logits++;
    }
  }
  if (pad_to > 0) pass_.n_logits = T;  // a graph computes every row's (padding's too)
  pass_.logits_first = pad_to > 0 ? 0 : pass_.n_logits > 0 && contiguous ? lrows[0] : -1;
  CUDA_TRY(cudaMemcpyAsync(meta_, meta_stage_, kUploadFields * B * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
  for (int i = 0; i < n_parts; i++) {
    const int32_t* table = parts_[i].seq->table;
    std::vector<int>& up = slot_uploaded_[i];
    const int used = (parts_[i].p0 + parts_[i].n + kBlock - 1) / kBlock;
    if (used > table_cap_ || used > parts_[i].seq->n_table)
      return internal_error("a block table longer than its pool (" + std::to_string(used) + " entries)");
    int from = 0;
    while (from < used && from < static_cast<int>(up.size()) && up[from] == table[from]) from++;
    if (from == used) continue;
    int32_t* stage = tables_stage_ + static_cast<size_t>(i) * table_cap_;
    std::memcpy(stage + from, table + from, (used - from) * sizeof(int32_t));
    CUDA_TRY(cudaMemcpyAsync(tables_ + static_cast<size_t>(i) * table_cap_ + from, stage + from,
                             (used - from) * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    up.assign(table, table + used);
  }
  if (layout_.n_local > 0 && !ring_mode_)
    for (int i = 0; i < n_parts; i++) PHASELAB_TRY(upload_window_table(i));
  return Status::ok();
}

// Part i's window-slot table, for the blocks the pass reads or writes in
// the local layers ([first_window_block(p0), the last one written]): the
// slot of each block's window part (outside restore()'s ring mode, each of
// them has one). Entries before are stale and never read.
Status CudaDevice::upload_window_table(int i) {
  const Part& p = parts_[i];
  std::vector<int>& up = wslot_uploaded_[i];
  int32_t* stage = wtables_stage_ + static_cast<size_t>(i) * table_cap_;
  const int used = (p.p0 + p.n + kBlock - 1) / kBlock;
  int lo = -1, hi = -1;
  for (int e = first_window_block(p.p0); e < used; e++) {
    const int w = p.seq->window_slot[e];
    const int slot = w >= 0 ? w : layout_.pad_window_part();  // (never: the host holds them)
    if (up[e] == slot) continue;
    stage[e] = up[e] = slot;
    if (lo < 0) lo = e;
    hi = e;
  }
  if (lo < 0) return Status::ok();
  CUDA_TRY(cudaMemcpyAsync(wtables_ + static_cast<size_t>(i) * table_cap_ + lo, stage + lo,
                           (hi - lo + 1) * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
  return Status::ok();
}

// After a pass over parts_: the blocks hold the positions it wrote, and
// nothing after them.
void CudaDevice::mark_written() {
  for (const Part& p : parts_) {
    const int32_t* table = p.seq->table;
    for (int i = p.p0 / kBlock; i * kBlock < p.p0 + p.n; i++)
      set_filled(table[i], p.seq->generation[i], std::min(kBlock, p.p0 + p.n - i * kBlock));
    computed_ += static_cast<uint64_t>(p.n);
  }
}

}  // namespace phaselab
