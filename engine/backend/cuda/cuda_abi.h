/* The boundary between the engine and libphaselab_cuda.so, in plain C.
 *
 * Why C: the library is loaded at run time (engine/backend/cuda_loader.cpp)
 * and may be built apart from the engine that loads it (a package of its
 * own, a test build of the CUDA emulator). C++ objects (a Model, a KvCache,
 * a Backend, std::string, std::shared_ptr) crossing that boundary tie both
 * sides to one compiler, one standard library and one version of every
 * class, with nothing to check it. Here only integers, pointers and POD
 * structs cross, and the library says which layout it was built with: its
 * table starts with its own size, the ABI version and the size of every
 * struct below, and the loader refuses a library whose numbers differ from
 * its own, saying which.
 *
 * Who does what: the engine side (cuda_loader.cpp) is the Backend. It keeps
 * the books (checks a batch, reserves and appends positions in the host's
 * KvCache) and hands the library views of what the device must know: the
 * weights as pointers with their types and shapes, the config, the pool's
 * geometry, and per sequence its tokens, its block table with each block's
 * generation and window part. The library (engine/backend/cuda/) owns the
 * device: it uploads the weights, mirrors the pool's blocks, recomputes what
 * it lacks and runs the passes.
 *
 * Every call that can fail returns 0 or a phaselab::StatusCode (status.h)
 * and writes the reason into the caller's buffer (err, err_size).
 * Arrays: (n) is a count of elements. */
#ifndef PHASELAB_CUDA_ABI_H
#define PHASELAB_CUDA_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bump on any change of a struct or a function below. 6: the C table (5 and
 * before: C++ objects crossed, with phaselab_cuda_abi()). 7: the reserve
 * carries old_tail's generation (a copy only from what the device holds).
 * 9: PhlCudaConfig.rope_attn_factor. 10: PhlCudaSwitches.q8_act, bf16_weights.
 * 11: mixture of experts (PhlCudaLayer's router and experts, PhlCudaConfig's
 * expert counts). 12: PhlCudaSwitches.fused_tails. 13: gpt-oss (PhlCudaLayer's
 * output bias, sinks, expert biases and RoPE table; PhlCudaConfig's gating
 * and expert activation). 14: sampled draws on the device (PhlCudaDraw,
 * PhlCudaChunk.draw, PhlCudaSwitches.device_sampling, fetch_logits). */
#define PHASELAB_CUDA_ABI_VERSION 14
/* Positions per K/V block: the host pool's (KvPool::kBlockTokens) and the
 * kernels' (cuda::kKvBlockTokens); both sides assert it. */
#define PHASELAB_CUDA_KV_BLOCK_TOKENS 16

/* A matrix in the GGUF layout: n_out rows of n_in values, row_bytes apart,
 * in its block format (type: the ggml type id, phaselab::TensorType). */
typedef struct PhlCudaWeight {
  const void* data;
  uint32_t type;
  int32_t n_in, n_out;
  uint64_t row_bytes;
} PhlCudaWeight;

/* n floats; n = 0: the model has no such vector. */
typedef struct PhlCudaVector {
  const float* data;
  int64_t n;
} PhlCudaVector;

typedef struct PhlCudaLayer {
  PhlCudaVector attn_norm, bq, bk, bv, q_norm, k_norm, post_attn_norm, ffn_norm, post_ffw_norm;
  PhlCudaWeight wq, wk, wv, wo, w_gate, w_up, w_down;
  /* A mixture-of-experts layer (router.data non-null; then no w_gate, w_up,
   * w_down): the router [n_embd -> n_expert] and each expert tensor as one
   * matrix of n_expert * rows-per-expert rows (expert e's from row e * n_ff_exp,
   * or e * n_embd for down_exps). */
  PhlCudaWeight router, gate_exps, up_exps, down_exps;
  int32_t window;   /* > 0: a sliding-window layer's window (ModelConfig::window_of) */
  float rope_base;  /* ModelConfig::rope_base_of */
  /* gpt-oss (n = 0 elsewhere): the attention output's bias (n_embd), each
   * query head's sink logit (n_head), the router's bias (n_expert) and each
   * expert's biases (n_expert * n_ff_exp for gate and up, n_expert * n_embd
   * for down). */
  PhlCudaVector bo, attn_sinks, router_b, gate_exps_b, up_exps_b, down_exps_b;
  /* RoPE of this layer: per rotation pair i (n_rot / 2) the angle per
   * position, base^(-2i / n_rot) with the freq factors and the scaling
   * (linear, YaRN) folded in, and what cos and sin are multiplied by
   * (ref::rope_pair_freqs; the CPU's angles are pos times these). */
  const double* rope_inv_freq;
  float rope_mscale;
} PhlCudaLayer;

/* What the passes read of ModelConfig (the flags are 0 or 1). */
typedef struct PhlCudaConfig {
  int32_t n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab, n_rot;
  float rms_eps, embd_scale, attn_scale, attn_logit_softcap, final_logit_softcap;
  float rope_attn_factor; /* cos and sin times this (phi3; else 1); PhlCudaLayer.rope_mscale includes it */
  int32_t gelu; /* GELU-tanh gating, else SiLU */
  int32_t attn_bias, qk_norm, rope_neox, post_norms;
  /* Mixture of experts (0: dense): experts per layer and per token, each
   * expert's width, and whether the chosen experts' weights are renormalised
   * to sum 1. expert_top_k_first: the K largest logits, then a softmax over
   * them (gpt-oss), else a softmax over all experts first. expert_act: the
   * experts' gate (cuda::GateAct: 0 SiLU, 1 GELU-tanh, 2 gpt-oss's). */
  int32_t n_expert, n_expert_used, n_ff_exp, expert_weights_norm;
  int32_t expert_top_k_first, expert_act;
} PhlCudaConfig;

/* The model's weights, in host memory for the length of create(). */
typedef struct PhlCudaModel {
  PhlCudaConfig config;
  PhlCudaWeight tok_embd, output; /* output: unused where tied */
  int32_t tied_output;            /* 1: the logits come from tok_embd */
  PhlCudaVector output_norm, rope_freq_factors;
  const PhlCudaLayer* layers; /* (n_layer) */
  uint64_t weight_bytes;      /* all of it, for the memory check */
} PhlCudaModel;

/* phaselab::CudaSwitches but the library, which the loader chose. */
typedef struct PhlCudaSwitches {
  int32_t graphs, tiled_attention, gemm_min_rows, profile;
  int32_t q8_act, bf16_weights, fused_tails, device_sampling;
} PhlCudaSwitches;

/* The host's KvPool as the device mirrors it: known by id, laid out by its
 * blocks, value type (0 f32, 1 f16, 2 bf16, 3 q8_0: phaselab::KvType) and
 * window parts (n_local_layers > 0: the sliding-window layers keep their
 * K/V in window parts, n_window_blocks of them, for a window of `window`). */
typedef struct PhlCudaPool {
  uint64_t id;
  int32_t n_blocks, kv_type;
  int32_t n_local_layers, n_window_blocks, window;
  int32_t n_layer;
  const uint8_t* layer_local;  /* (n_layer) 1: a sliding-window layer (KvPool::is_local) */
  const int32_t* layer_index;  /* (n_layer) its index among its kind (KvPool::layer_index) */
} PhlCudaPool;

/* One sequence's books (a KvCache of that pool), read by the library during
 * one call: positions [0, n_past) are the host's; tokens are theirs (what a
 * recomputation runs); per entry of the block table, the block, its
 * generation (KvPool::generation: a block handed out again is a new one) and
 * its window part (KvPool::window_slot; -1: none). */
typedef struct PhlCudaSeq {
  const int32_t* tokens; /* (n_past) */
  int32_t n_past, n_ctx;
  int32_t n_table;
  const int32_t* table;         /* (n_table) */
  const uint32_t* generation;   /* (n_table) */
  const int32_t* window_slot;   /* (n_table) */
} PhlCudaSeq;

/* What KvCache::reserve changed, for the device to mirror: the sequence had
 * n_past positions and a partly filled last block old_tail (-1: none, of
 * generation old_tail_generation) with window part old_window_slot, read
 * before the reserve; seq is the books after it (the tail block may be a
 * copy now: copy on write). n_tokens 0: only the copy, which the engine
 * loop's planning made before the pass. */
typedef struct PhlCudaReserve {
  int32_t n_past, n_tokens;
  int32_t old_tail, old_window_slot;
  uint32_t old_tail_generation;
} PhlCudaReserve;

/* A sampled draw's passes over the vocabulary on the device
 * (phaselab::DeviceDraw, whose fields these are): the rules in, what came
 * back out; cand: room for cap (logit float, id int32) pairs, the first
 * n_cand of them written where n_cand <= cap (else none: the host fetches
 * the row). */
typedef struct PhlCudaDraw {
  int32_t untruncated, top_k, use_min_p;
  float top_p, log_min_p, inv_t;
  double u;
  int32_t token, complete;
  float max_logit, cutoff;
  double total;
  uint32_t n_cand, cap;
  void* cand;
} PhlCudaDraw;

/* One sequence's share of a pass (phaselab::SeqChunk): tokens at positions
 * seq->n_past .. + n_tokens (seq: the books after the reserve, before the
 * append). logits_mode: 0 none, 1 last, 2 all (phaselab::LogitsMode);
 * logits (n_vocab or n_tokens * n_vocab floats) unless argmax is set in
 * mode last, where *argmax gets the argmax instead, or draw, where *draw
 * gets its results. */
typedef struct PhlCudaChunk {
  const PhlCudaSeq* seq;
  const int32_t* tokens; /* (n_tokens) */
  int32_t n_tokens, logits_mode;
  float* logits;
  int32_t* argmax;
  PhlCudaDraw* draw;
} PhlCudaChunk;

/* What probe() finds of device 0. */
typedef struct PhlCudaProbe {
  double peak_gbps, peak_tflops;
  uint64_t total_mem, free_mem;
} PhlCudaProbe;

typedef struct PhlCudaDevice PhlCudaDevice; /* the library's backend, opaque */

typedef struct PhlCudaTable {
  uint32_t size;        /* sizeof(PhlCudaTable) */
  uint32_t abi_version; /* PHASELAB_CUDA_ABI_VERSION */
  /* sizeof each struct above, in the order declared */
  uint32_t weight_size, vector_size, layer_size, config_size, model_size, switches_size, pool_size, seq_size,
      reserve_size, chunk_size, probe_size, draw_size;

  /* 1 and a description ("NVIDIA H200 (compute 9.0, 143771 MiB)") in msg
   * when device 0 is usable; 0 and the reason otherwise. */
  int32_t (*probe)(PhlCudaProbe* out, char* msg, size_t msg_size);
  /* Uploads the model and allocates the work buffers for passes of up to
   * max_batch tokens. */
  int32_t (*create)(const PhlCudaModel* model, int32_t max_batch, const PhlCudaSwitches* sw, PhlCudaDevice** out,
                    char* err, size_t err_size);
  void (*destroy)(PhlCudaDevice* dev);
  /* Bytes of K/V the device holds (or will hold) for the pool. */
  uint64_t (*kv_bytes)(const PhlCudaDevice* dev, const PhlCudaPool* pool);
  /* Positions run through the model so far, recomputation included. */
  uint64_t (*positions_computed)(const PhlCudaDevice* dev);
  /* Before a pass, in this order: the device pool for the chunks' host pool
   * (made anew, empty, when the pool changed); then, per sequence, restore:
   * the device computes the positions of the books it lacks; then, per
   * sequence, after KvCache::reserve (failed or not), reserved. */
  int32_t (*mirror_pool)(PhlCudaDevice* dev, const PhlCudaPool* pool, char* err, size_t err_size);
  int32_t (*restore)(PhlCudaDevice* dev, const PhlCudaSeq* seq, char* err, size_t err_size);
  int32_t (*reserved)(PhlCudaDevice* dev, const PhlCudaSeq* seq, const PhlCudaReserve* r, char* err, size_t err_size);
  /* One pass over the chunks (checked by the engine: phaselab::check_batch);
   * their logits or argmaxes are written when it returns. */
  int32_t (*forward)(PhlCudaDevice* dev, const PhlCudaChunk* chunks, int32_t n_chunks, char* err, size_t err_size);
  /* The KV transfer (version 8): rows of seq (of the mirrored pool) of
   * positions [pos0, pos0 + n), per layer il those from first[il] on, at
   * k[il] and v[il], contiguous, of the pool's row size. write 0: device to
   * host (the device must hold them: restore first); write 1: host to
   * device, after the host's reserve (mirrored: reserved), and the positions
   * count as computed. */
  int32_t (*kv_rows)(PhlCudaDevice* dev, const PhlCudaSeq* seq, int32_t pos0, int32_t n, const int32_t* first,
                     uint8_t* const* k, uint8_t* const* v, int32_t write, char* err, size_t err_size);
  /* The logits of chunk i of the last forward (a draw's, whose candidates
   * did not suffice) to out (n_vocab floats), until the next forward. */
  int32_t (*fetch_logits)(PhlCudaDevice* dev, int32_t i, float* out, char* err, size_t err_size);
} PhlCudaTable;

/* The library's one export. */
typedef const PhlCudaTable* (*PhlCudaTableFn)(void);
#define PHASELAB_CUDA_TABLE_SYMBOL "phaselab_cuda_table"

#ifdef __cplusplus
}
#endif

#endif /* PHASELAB_CUDA_ABI_H */
