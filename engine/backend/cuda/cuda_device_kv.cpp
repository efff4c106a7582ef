// The CUDA backend's K/V on the device: the paged pool mirroring the host's
// KvPool (cuda_backend_impl.h says how), its block tables, the recomputation
// of positions the device lacks (restore) and the copy on write of a
// reserve (reserved). The host's books come as cuda_abi.h's views.

#include "cuda_backend_impl.h"

namespace phaselab {

// The device pool mirroring the host pool (as many blocks, its value
// type, one more block that only padding rows write), and attention
// scratch for its positions; made anew (all blocks empty) when the pool
// changes.
Status CudaDevice::mirror_pool(const PhlCudaPool& pool) {
  if (pool.id == pool_id_ && pool.n_blocks == layout_.n_blocks) return Status::ok();
  drop_graphs();                              // the graphs hold the old buffers' addresses
  CUDA_TRY(cudaStreamSynchronize(stream_));  // nothing in flight may still use the old buffers
  for (void* p : {static_cast<void*>(pool_k_), static_cast<void*>(pool_v_), static_cast<void*>(pool_wk_),
                  static_cast<void*>(pool_wv_), static_cast<void*>(scratch_)})
    free_device(p);
  pool_k_ = pool_v_ = pool_wk_ = pool_wv_ = nullptr;
  scratch_ = nullptr;
  pool_id_ = 0;  // until the new buffers exist
  // A sequence's table has at most as many entries as the pool has blocks.
  const int table_cap = pool.n_blocks;
  const KvLayout layout = layout_of(pool);
  size_t free_b = 0, total_b = 0;
  CUDA_TRY(cudaMemGetInfo(&free_b, &total_b));
  const size_t scratch_n = std::max<size_t>(partials_floats(table_cap * kBlock), 1);
  const size_t need = layout.bytes() + scratch_n * sizeof(float) + 4 * static_cast<size_t>(table_cap) * sizeof(int32_t);
  if (need > free_b && bf16_bytes_ > 0) {  // the K/V before the prefill's BF16 copies
    drop_bf16_weights();
    CUDA_TRY(cudaMemGetInfo(&free_b, &total_b));
  }
  if (need > free_b)
    return out_of_memory("the KV cache for " + std::to_string(pool.n_blocks * kBlock) + " positions needs " +
                         std::to_string(need >> 20) + " MiB of GPU memory, " + std::to_string(free_b >> 20) +
                         " MiB are free: lower the context size");
  for (const auto& [store, window] : {std::pair{&pool_k_, false}, std::pair{&pool_v_, false},
                                      std::pair{&pool_wk_, true}, std::pair{&pool_wv_, true}}) {
    const uint64_t bytes = layout.store_bytes(window);
    if (bytes == 0) continue;
    CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(store), bytes));
    allocations_.push_back(*store);
  }
  layout_ = layout;
  layer_local_.assign(c_.n_layer, 0);
  layer_index_.assign(c_.n_layer, 0);
  for (int il = 0; il < c_.n_layer; il++) {
    layer_local_[il] = pool.layer_local[il] ? 1 : 0;
    layer_index_[il] = pool.layer_index[il];
  }
  PHASELAB_TRY(alloc(&scratch_, scratch_n));
  filled_.assign(pool.n_blocks, BlockFill{});
  pool_id_ = pool.id;
  pool_window_ = pool.window;
  table_cap_ = table_cap;
  n_slots_ = 0;  // the tables are made for the new capacity
  return ensure_slots(1);
}

// Block tables for n sequences per pass (slots 0 .. n - 1) and the pad
// slot after them; grown by doubling (which drops the graphs).
Status CudaDevice::ensure_slots(int n) {
  if (n <= n_slots_) return Status::ok();
  const int slots = std::max(n, std::min(2 * n_slots_, max_batch_));
  drop_graphs();
  CUDA_TRY(cudaStreamSynchronize(stream_));
  for (int32_t** t : {&tables_, &wtables_}) {
    free_device(*t);
    *t = nullptr;
  }
  for (int32_t** t : {&tables_stage_, &wtables_stage_}) {
    if (*t) cudaFreeHost(*t);
    *t = nullptr;
  }
  n_slots_ = 0;
  const size_t entries = static_cast<size_t>(slots + 1) * table_cap_;
  for (int32_t** t : {&tables_, &wtables_}) {
    CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(t), entries * sizeof(int32_t)));
    allocations_.push_back(*t);
  }
  for (int32_t** t : {&tables_stage_, &wtables_stage_})
    CUDA_TRY(cudaMallocHost(reinterpret_cast<void**>(t), entries * sizeof(int32_t)));
  slot_uploaded_.assign(slots, std::vector<int>());
  for (auto& up : slot_uploaded_) up.reserve(table_cap_);
  wslot_uploaded_.assign(slots, std::vector<int>(layout_.n_local > 0 ? table_cap_ : 0, -1));
  row_of_.assign(slots, 0);
  // The pad slot: its first entry is the extra block (the pool's n_blocks), and
  // in the window-slot tables the extra window part.
  const size_t pad_at = static_cast<size_t>(slots) * table_cap_;
  tables_stage_[pad_at] = layout_.n_blocks;
  wtables_stage_[pad_at] = layout_.pad_window_part();
  CUDA_TRY(cudaMemcpyAsync(tables_ + pad_at, tables_stage_ + pad_at, sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
  CUDA_TRY(cudaMemcpyAsync(wtables_ + pad_at, wtables_stage_ + pad_at, sizeof(int32_t), cudaMemcpyHostToDevice,
                           stream_));
  n_slots_ = slots;
  return Status::ok();
}

CudaDevice::KvLayout CudaDevice::layout_of(const PhlCudaPool& pool) const {
  KvLayout l;
  l.elem = elem_of(pool.kv_type);
  l.n_local = pool.n_local_layers;
  l.n_full = c_.n_layer - l.n_local;
  l.n_blocks = pool.n_blocks;
  l.n_embd_kv = static_cast<size_t>(c_.n_embd_kv());
  if (l.n_local > 0) {
    l.n_window = pool.n_window_blocks;
    l.ring = (pool.window + ring_chunk() - 2) / kBlock + 2;
  }
  return l;
}

// The most partial-result floats any batch size needs for n_ctx keys.
size_t CudaDevice::partials_floats(int n_ctx) const {
  size_t most = 0;
  for (int T = 1; T <= max_batch_; T++) {
    most = std::max(most, cuda::attention_partials_floats(T, c_.n_head, c_.head_dim,
                                                          cuda::attention_splits(T, c_.n_head, n_ctx)));
    if (T >= kTiledAttentionMin)  // the tiled kernel's ranges, at most n_ctx keys
      most = std::max(most, cuda::attention_partials_floats(
                                T, c_.n_head, c_.head_dim,
                                cuda::attention_tiled_splits(T, c_.n_head, c_.n_head_kv, n_ctx, sm_count_)));
  }
  return most;
}

// Layer il of the paged cache, for the kernels: the full layers' store
// through the block tables, or the window parts' through the window-slot
// tables.
cuda::KvPages CudaDevice::pages(int il) const {
  const size_t rows = kBlock * layout_.n_embd_kv;  // values of one layer's part of a block
  const size_t layer = cuda::kv_values_bytes(layout_.elem, layer_index_[il] * rows);
  if (layer_local_[il] && ring_mode_)  // (one sequence: its table_at is 0)
    return cuda::KvPages{ring_k_ + layer, ring_v_ + layer, ring_table_, layout_.n_local * rows, layout_.elem};
  if (layer_local_[il])
    return cuda::KvPages{pool_wk_ + layer, pool_wv_ + layer, wtables_, layout_.n_local * rows, layout_.elem};
  return cuda::KvPages{pool_k_ + layer, pool_v_ + layer, tables_, layout_.n_full * rows, layout_.elem};
}

// Makes the device hold what the host holds for seq: recomputes, from the
// host's tokens, the positions of its blocks the device has not computed
// (from the first block whose slots it lacks). Where a block of those
// positions, or of their window, has no window part (the pool gave it
// back: the sequence had moved past it), the local layers' K/V go to a
// ring of parts allocated for the recomputation (ring mode), from which
// each pass copies what the blocks with parts keep, and the recomputation
// starts from the beginning (the ring holds no earlier window). (The device
// lacks positions when its pool was made for another cache since; it
// then lacks them all.)
//
// Why this loop over positions is not one more generation loop, and does
// not go through the engine's (issue 30: generation exists once): it
// restores K/V inside one backend call. It samples nothing, appends nothing
// and asks for no logits; it runs positions whose tokens the host already
// holds and counts as computed, only because this device's copy of their
// K/V is missing; and it must be done before the pass that reads them, in
// the same forward_batch. The engine could not schedule it either: which
// positions the device lacks is this side's knowledge (filled_), and to the
// host's books they need no pass at all.
Status CudaDevice::restore(const PhlCudaSeq& seq) {
  const int n = seq.n_past;
  const int32_t* table = seq.table;
  int p = n;
  for (int i = 0; i * kBlock < n; i++) {
    const int have = filled(table[i], seq.generation[i]);
    const int need = std::min(kBlock, n - i * kBlock);
    if (have < need) {
      p = i * kBlock + have;
      break;
    }
  }
  if (p >= n) return Status::ok();
  const int n_table = (n + kBlock - 1) / kBlock;
  bool ring = false;
  if (layout_.n_local > 0)
    for (int i = first_window_block(p); i < n_table && !ring; i++) ring = seq.window_slot[i] < 0;
  if (ring) {
    p = 0;
    if (Status st = make_ring(); !st) {
      free_ring();
      return st;
    }
  }
  ring_mode_ = ring;
  Status st = Status::ok();
  while (p < n && st.is_ok()) {
    const int c = std::min(ring ? ring_chunk() : max_batch_, n - p);
    parts_.clear();
    parts_.push_back(Part{&seq, seq.tokens + p, p, c, kLogitsNone});
    st = run_pass();
    // The slots this pass wrote, into the window parts of blocks that
    // have one (only those: the rest of a shared block's part is another
    // sequence's).
    for (int i = p / kBlock; ring && st.is_ok() && i * kBlock < p + c; i++)
      if (const int w = seq.window_slot[i]; w >= 0)
        st = copy_ring_slots(w, i % layout_.ring, std::max(p, i * kBlock) - i * kBlock,
                             std::min(p + c, (i + 1) * kBlock) - i * kBlock);
    if (st.is_ok()) st = cuda_status(cudaStreamSynchronize(stream_), "cudaStreamSynchronize", __FILE__, __LINE__);
    prof_.collect("prefill", c);
    p += c;
  }
  ring_mode_ = false;
  if (ring) free_ring();
  if (!st) {  // what the failed passes marked computed may not have reached the window parts
    cudaStreamSynchronize(stream_);
    for (int i = 0; i < n_table; i++) set_filled(table[i], seq.generation[i], 0);
  }
  return st;
}

// Slots [s0, s1) of every local layer, from ring part r to window part w.
Status CudaDevice::copy_ring_slots(int w, int r, int s0, int s1) {
  const size_t part = layout_.window_block_bytes();
  if (s0 == 0 && s1 == kBlock) return copy_part(pool_wk_, pool_wv_, ring_k_, ring_v_, part, w, r);
  const size_t row = cuda::kv_values_bytes(layout_.elem, layout_.n_embd_kv), layer = kBlock * row;
  for (int li = 0; li < layout_.n_local; li++) {
    const size_t at = li * layer + s0 * row, bytes = (s1 - s0) * row;
    CUDA_TRY(cudaMemcpyAsync(pool_wk_ + w * part + at, ring_k_ + r * part + at, bytes, cudaMemcpyDeviceToDevice, stream_));
    CUDA_TRY(cudaMemcpyAsync(pool_wv_ + w * part + at, ring_v_ + r * part + at, bytes, cudaMemcpyDeviceToDevice, stream_));
  }
  return Status::ok();
}

void CudaDevice::free_ring() {
  cudaStreamSynchronize(stream_);  // nothing queued may still use it
  for (void* r : {static_cast<void*>(ring_k_), static_cast<void*>(ring_v_), static_cast<void*>(ring_table_)})
    free_device(r);
  ring_k_ = ring_v_ = nullptr;
  ring_table_ = nullptr;
}

// The ring of window parts for a recomputation (restore()), and its
// table: position p's rows in part (p / kBlock) % ring.
Status CudaDevice::make_ring() {
  free_ring();  // one a failed make_ring left
  const size_t bytes = layout_.window_block_bytes() * layout_.ring;
  size_t free_b = 0, total_b = 0;
  CUDA_TRY(cudaMemGetInfo(&free_b, &total_b));
  if (2 * bytes + table_cap_ * sizeof(int32_t) > free_b)
    return out_of_memory("recomputing a conversation's K/V on the GPU needs " + std::to_string((2 * bytes) >> 20) +
                         " MiB more, " + std::to_string(free_b >> 20) + " MiB are free: lower the context size");
  for (uint8_t** r : {&ring_k_, &ring_v_}) {
    CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(r), bytes));
    allocations_.push_back(*r);
  }
  CUDA_TRY(cudaMalloc(reinterpret_cast<void**>(&ring_table_), table_cap_ * sizeof(int32_t)));
  allocations_.push_back(ring_table_);
  std::vector<int32_t> t(table_cap_);
  for (int e = 0; e < table_cap_; e++) t[e] = e % layout_.ring;
  // On the stream the passes take (a plain cudaMemcpy would not be ordered
  // before them), and done before t goes.
  CUDA_TRY(cudaMemcpyAsync(ring_table_, t.data(), t.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
  CUDA_TRY(cudaStreamSynchronize(stream_));
  return Status::ok();
}

// KvCache::reserve(n_tokens), mirrored (the engine calls this after every
// reserve, even one that failed part way: the host may have made its copy
// of the last block already): blocks new to the table hold nothing the
// device computed, except the host's copy of a shared or published, partly
// filled last block (copy on write), whose filled slots the device copies
// too. (r's old tail and its window part were read before the host's
// reserve, which may give the old block's part to a new block; its K/V stay
// there until the pass writes.)
Status CudaDevice::reserved(const PhlCudaSeq& seq, const PhlCudaReserve& r) {
  const int n = r.n_past, T = r.n_tokens, first = n / kBlock;
  const int old_tail = r.old_tail, old_wslot = r.old_window_slot;
  const int last = std::min((n + T - 1) / kBlock, seq.n_table - 1);
  for (int i = first; i <= last; i++) {
    const int b = seq.table[i];
    if (i == first && old_tail >= 0) {
      if (b != old_tail && filled(old_tail, r.old_tail_generation) < n % kBlock) {
        set_filled(b, seq.generation[i], 0);  // the device lacks the source too: restore() computes them
      } else if (b != old_tail) {
        PHASELAB_TRY(copy_part(pool_k_, pool_v_, pool_k_, pool_v_, layout_.full_block_bytes(), b, old_tail));
        const int wslot = seq.window_slot[i];
        if (wslot >= 0 && old_wslot >= 0)
          PHASELAB_TRY(copy_part(pool_wk_, pool_wv_, pool_wk_, pool_wv_, layout_.window_block_bytes(), wslot,
                                 old_wslot));
        set_filled(b, seq.generation[i], n % kBlock);
      }
      continue;
    }
    set_filled(b, seq.generation[i], 0);
  }
  return Status::ok();
}

// The KV transfer's rows (cuda_abi.h: kv_rows). Within a block's part of a
// store, layer li's rows are kBlock consecutive rows (pages()), so each
// block gives one copy per layer for K and one for V.
Status CudaDevice::kv_rows(const PhlCudaSeq& seq, int pos0, int n, const int32_t* first, uint8_t* const* k,
                           uint8_t* const* v, bool write) {
  if (pool_id_ == 0) return invalid_argument("KV transfer: no pool is mirrored");
  if (pos0 < 0 || n < 0 || pos0 + n > (write ? seq.n_table * kBlock : seq.n_past))
    return invalid_argument("KV transfer: positions beyond the sequence");
  const size_t row = cuda::kv_values_bytes(layout_.elem, layout_.n_embd_kv);
  const auto kind = write ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
  for (int il = 0; il < c_.n_layer; il++) {
    const bool local = layer_local_[il] != 0;
    const size_t layer_at = layer_index_[il] * kBlock * row;
    const int from = std::max(pos0, first[il]);
    for (int pos = from; pos < pos0 + n;) {
      const int i = pos / kBlock, s0 = pos % kBlock, s1 = std::min(kBlock, s0 + (pos0 + n - pos));
      if (!write && filled(seq.table[i], seq.generation[i]) < s1)
        return internal_error("KV transfer: the device lacks position " + std::to_string(pos) + "'s K/V");
      uint8_t *dk, *dv;
      if (local) {
        const int w = seq.window_slot[i];
        if (w < 0) return internal_error("KV transfer: block " + std::to_string(i) + " has no window part");
        dk = pool_wk_ + w * layout_.window_block_bytes() + layer_at;
        dv = pool_wv_ + w * layout_.window_block_bytes() + layer_at;
      } else {
        dk = pool_k_ + seq.table[i] * layout_.full_block_bytes() + layer_at;
        dv = pool_v_ + seq.table[i] * layout_.full_block_bytes() + layer_at;
      }
      const size_t host_at = static_cast<size_t>(pos - from) * row, bytes = (s1 - s0) * row;
      uint8_t* hk = k[il] + host_at;
      uint8_t* hv = v[il] + host_at;
      dk += s0 * row;
      dv += s0 * row;
      CUDA_TRY(cudaMemcpyAsync(write ? dk : hk, write ? hk : dk, bytes, kind, stream_));
      CUDA_TRY(cudaMemcpyAsync(write ? dv : hv, write ? hv : dv, bytes, kind, stream_));
      pos += s1 - s0;
    }
  }
  CUDA_TRY(cudaStreamSynchronize(stream_));
  if (write)  // the blocks' slots up to the last position written now hold K/V
    for (int pos = pos0; pos < pos0 + n;) {
      const int i = pos / kBlock, s1 = std::min(kBlock, pos % kBlock + (pos0 + n - pos));
      if (filled(seq.table[i], seq.generation[i]) >= pos % kBlock) set_filled(seq.table[i], seq.generation[i], s1);
      pos = i * kBlock + s1;
    }
  return Status::ok();
}

// K and V of part src of one store (the blocks', the window parts' or the
// ring's: parts of `bytes` each) copied to part dst of another, or the same.
Status CudaDevice::copy_part(uint8_t* dk, uint8_t* dv, const uint8_t* sk, const uint8_t* sv, size_t bytes, int dst, int src) {
  if (bytes == 0) return Status::ok();
  CUDA_TRY(cudaMemcpyAsync(dk + dst * bytes, sk + src * bytes, bytes, cudaMemcpyDeviceToDevice, stream_));
  CUDA_TRY(cudaMemcpyAsync(dv + dst * bytes, sv + src * bytes, bytes, cudaMemcpyDeviceToDevice, stream_));
  return Status::ok();
}

}  // namespace phaselab
