// The Backend interface. Backends read and append to a KvCache (kv_cache.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "phaselab/kv_cache.h"
#include "phaselab/model.h"
#include "phaselab/status.h"

namespace phaselab {

enum class LogitsMode {
  none,  // only fill the KV cache (all prefill chunks but the last)
  last,  // [n_vocab] for the last token
  all,   // [n_tokens, n_vocab] (speculative verification, tests)
};

// One sequence's share of a batched forward pass: tokens at positions
// kv->n_past() .. + n_tokens, and where its logits go.
struct DeviceDraw;  // sampler.h

struct SeqChunk {
  KvCache* kv = nullptr;            // a sequence appears at most once per pass
  const int32_t* tokens = nullptr;  // [n_tokens]
  int n_tokens = 0;
  LogitsMode mode = LogitsMode::none;
  float* logits = nullptr;          // last: [n_vocab]; all: [n_tokens, n_vocab]; none: unused
  // Mode last, greedy decoding: where set, *argmax = the argmax of the
  // logits (the lowest id among equal maxima). A backend with
  // has_device_greedy() then leaves logits unwritten: one int leaves the
  // device instead of n_vocab floats. (The CPU and CUDA backends fill it; the
  // default forward_batch refuses it.)
  int32_t* argmax = nullptr;
  // Mode last, sampled decoding (Sampler::device_drawable): where set, a
  // backend with has_device_sampling() runs the draw's passes over the
  // vocabulary where the logits are and fills *draw's results
  // (Sampler::sample_device) instead of logits; fetch_logits gives the row
  // where those do not suffice.
  DeviceDraw* draw = nullptr;
};

// What every backend's forward_batch checks before it changes anything: at
// least one chunk; each with a sequence, tokens and, when it asks for
// logits, somewhere to put them (or, where argmax_may_replace_logits, an
// argmax for mode last); a device draw only there and only in mode last,
// without an argmax; no sequence twice; token ids in the vocabulary; at
// most max_batch tokens in all, which go to *n_tokens.
Status check_batch(const SeqChunk* chunks, int n_chunks, int n_vocab, int max_batch, bool argmax_may_replace_logits,
                   int* n_tokens);

// Where one pass of the KV transfer reads or writes rows, per layer il:
// k[il] and v[il] hold layer il's K and V rows of positions
// [max(pos0, first[il]), pos0 + n), contiguous, KvPool::row_bytes() each.
struct KvRows {
  const int* first = nullptr;  // (n_layer)
  uint8_t* const* k = nullptr; // (n_layer)
  uint8_t* const* v = nullptr; // (n_layer)
};

struct CpuSwitches;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // Largest n_tokens one forward() accepts; callers split longer prompts.
  virtual int max_batch() const = 0;
  // Runs tokens at positions kv.n_past() .. + n_tokens, appends their K/V to
  // kv and writes logits as mode says. Fails (without touching kv) when the
  // tokens do not fit in kv's context.
  virtual Status forward(const int32_t* tokens, int n_tokens, KvCache& kv, float* logits, LogitsMode mode) = 0;
  // Several sequences in one pass (continuous batching): every token of every
  // chunk is a row of the same matrix products, so the weights are read once
  // for all of them, and attention runs per sequence through its own block
  // table. The chunks' tokens together are at most max_batch(). Each
  // sequence gets exactly the K/V and logits its own forward() would give.
  // Fails before any sequence changes if a chunk is invalid or its positions
  // cannot be reserved (blocks reserved for earlier chunks stay reserved;
  // KvCache::truncate(n_past()) returns them).
  // batched_forward() says whether the backend shares the pass; the default
  // runs the chunks one after another.
  virtual bool batched_forward() const { return false; }
  virtual Status forward_batch(const SeqChunk* chunks, int n_chunks) {
    for (int i = 0; i < n_chunks; i++) {
      for (int j = 0; j < i; j++)
        if (chunks[i].kv == chunks[j].kv) return invalid_argument("a sequence appears twice in one batch");
      if (chunks[i].argmax)  // (the argmax is the overriding backends' to pick)
        return unsupported(name() + " backend: no argmax in a batch pass; pick it from the logits");
      if (chunks[i].draw)
        return unsupported(name() + " backend: no draws on the device; sample from the logits");
    }
    for (int i = 0; i < n_chunks; i++)
      PHASELAB_TRY(forward(chunks[i].tokens, chunks[i].n_tokens, *chunks[i].kv, chunks[i].logits, chunks[i].mode));
    return Status::ok();
  }
  // Self-speculative drafting (speculative.h, SpeculativeMode::self_draft):
  // one pass of chunk with the layers il where skip[il] != 0 left out — the
  // residual stream goes past them unchanged and their K/V rows at these
  // positions are not written (the verification that follows writes every
  // layer's). skip has n_layer entries. head, where given, stands in for
  // the output matrix (n_embd -> head->n_out, in host memory): the logits
  // are then head->n_out values a row, e.g. a draft's short list of the
  // vocabulary. can_skip_layers() says whether forward_skipping works; the
  // default refuses.
  virtual bool can_skip_layers() const { return false; }
  virtual Status forward_skipping(const SeqChunk& chunk, const std::vector<uint8_t>& skip,
                                  const WeightView* head = nullptr) {
    (void)chunk, (void)skip, (void)head;
    return unsupported(name() + " backend: no passes with layers skipped (self-speculative drafting): run on the CPU "
                                "backend, or choose prompt lookup or a draft model");
  }
  // The residual stream of one chunk (layer pruning's measurements,
  // prune.h): residuals gets (n_layer + 1, n_tokens, n_embd) floats, index 0
  // the embeddings, index l + 1 the stream after layer l. The chunk's K/V
  // are appended as by forward. The default refuses.
  virtual Status forward_residuals(const SeqChunk& chunk, std::vector<float>* residuals) {
    (void)chunk, (void)residuals;
    return unsupported(name() + " backend: it does not give its residual stream; measure on the CPU backend");
  }
  // The feed-forward's inner activations of one chunk (FFN width pruning's
  // measurement, prune.h): adds, for every layer l and neuron j, the sum over
  // the chunk's tokens of h_j^2 (h = act(gate x) * (up x), what ffn_down
  // multiplies) to (*sumsq)[l * n_ff + j], which the caller sizes
  // (n_layer * n_ff) and zeroes. The chunk's K/V are appended as by
  // forward. The default refuses.
  virtual Status forward_ffn_activations(const SeqChunk& chunk, std::vector<double>* sumsq) {
    (void)chunk, (void)sumsq;
    return unsupported(name() + " backend: it does not give its feed-forward activations; measure on the CPU backend");
  }
  // Greedy decoding where the logits need not leave the backend (the CUDA
  // backend picks the argmax on the device and copies back one int): a
  // forward_batch chunk of mode last with SeqChunk::argmax set. (A pass of
  // one token per sequence is the CUDA backend's decode pass, replayed from
  // its graph.)
  virtual bool has_device_greedy() const { return false; }
  // Sampled decoding where the logits need not leave the backend either
  // (SeqChunk::draw; the CUDA backend's kernels copy back the few thousand
  // candidates a draw needs instead of n_vocab floats). fetch_logits copies
  // the logits of chunk i of the last forward_batch (mode last, draw set)
  // to out[n_vocab], until the next pass: for the draws whose candidates did
  // not suffice.
  virtual bool has_device_sampling() const { return false; }
  virtual Status fetch_logits(int i, float* out) {
    (void)i, (void)out;
    return unsupported(name() + " backend: its logits are already on the host");
  }
  // The CPU switches that may change between passes (decode_rows,
  // row_tiles, decode_prefetch_bytes, decode_prefetch_l2,
  // stream_prefetch_bytes, stream_ways, stream_chunks; the others are
  // fixed at load), for
  // measurements that alternate them (measure_ab, bench --ab). None changes
  // a result (the kernels are bitwise equal). False where the backend has
  // no such switches.
  virtual bool apply_cpu_switches(const CpuSwitches& sw) {
    (void)sw;
    return false;
  }
  // Positions run through the model so far: every token of every pass,
  // recomputation included (what prefix reuse saves shows here; tests check
  // that a backend recomputes nothing behind the cache's back).
  virtual uint64_t positions_computed() const { return 0; }
  // Where this backend keeps K/V: host (in host memory, the CPU backends'
  // store) or device (on a GPU). Either way the backend holds the bytes,
  // laid out by the pool's blocks (the pool keeps the books only). A host
  // backend refuses a device-storage pool.
  virtual KvStorage kv_storage() const { return KvStorage::host; }
  // Bytes of K/V the backend holds (or will hold, from its first pass) for
  // the sequences of pool; 0 for a backend that keeps none of it.
  virtual uint64_t kv_bytes(const KvPool& pool) const {
    (void)pool;
    return 0;
  }
  // Runs fn(i) once for every i in [0, n), on the backend's host threads
  // where it has them (the CPU backends' pool: no thread is started and
  // nothing allocated per call), else one after another on the calling
  // thread; waits for all. fn must not throw. The engine loop draws the
  // tokens of a pass's sequences this way.
  virtual void run_host_tasks(int n, const std::function<void(int)>& fn) {
    for (int i = 0; i < n; i++) fn(i);
  }
  // Pins the backend's worker threads to cpus (the thread that calls
  // forward pins itself: pin_this_thread, thread_pool.h); false for a
  // backend without host threads, or where the platform refuses.
  virtual bool pin_threads(const std::vector<int>& cpus) {
    (void)cpus;
    return false;
  }
  // The KV transfer (export_kv, import_kv below): whether the backend can
  // read a sequence's K/V rows out and take rows in.
  virtual bool can_transfer_kv() const { return false; }
  // Copies kv's rows of positions [pos0, pos0 + n) into rows.
  virtual Status read_kv_rows(const KvCache& kv, int pos0, int n, const KvRows& rows);
  // Appends n positions of tokens to kv with the given rows as their K/V
  // (reserve, write, append) instead of computing them. Fails as
  // KvCache::reserve does (positions it had reserved given back).
  virtual Status append_kv_rows(KvCache& kv, const int32_t* tokens, int n, const KvRows& rows);
};


// A sequence's K/V as plain bytes, to hand it from one backend's pool to
// another's: the disaggregated policy's "KV transfer" (schedule_policy.h).
// Per layer il, rows of positions [first[il], n): K rows, then V rows, each
// KvPool::row_bytes() long. first[il] is 0 for a full-attention layer and,
// for a sliding-window layer, the first position the next query sees (the
// earlier rows are not needed to go on).
struct KvBlob {
  std::vector<int32_t> tokens;  // (n) the sequence's tokens
  std::vector<int> first;       // (n_layer)
  std::vector<uint8_t> bytes;
  KvType type = KvType::f16;
  size_t row_bytes = 0;
};
// Reads kv's K/V from the backend that computed them (can_transfer_kv);
// blob's buffers are reused.
Status export_kv(Backend& backend, const KvCache& kv, KvBlob* blob);
// Writes blob into kv (empty, in a pool of the same model and K/V type) as
// the backend that will run it lays K/V out: positions are reserved and
// appended in steps of at most chunk_tokens, as a prefill of that many
// tokens per pass would (the pool's window parts are sized for that). An
// out_of_memory error when the pool is out of blocks (kv is then empty).
Status import_kv(Backend& backend, KvCache& kv, const KvBlob& blob, int chunk_tokens);

// The switches of each backend, as option fields. make_backend's caller
// fills them (backend_options_from_environment() reads the PHASELAB_*
// variables, the one place that does); the backends read nothing else.
// The largest decode prefetch distance the switches take (1 MiB).
constexpr int kMaxPrefetchBytes = 1 << 20;
// The decode prefetch distance measured best on this kind of core (bench
// --ab prefetch=BYTES, Gemma 3 270M tg128, docs/benchmarks.md): 4096 bytes
// on Zen 3 (AMD family 19h without AVX-512; about 2.7 KiB was best), 8192
// elsewhere: on Zen 4 (family 19h with AVX-512) with the prefetches into
// L2 (default_decode_prefetch_l2; 4096 had been best non-temporal there),
// on Zen 5 (4096 measured 0.958x); no Intel figure yet.
int default_decode_prefetch_bytes();
// Whether single-token decode's prefetches of the rows ahead go into L2
// (prefetcht1) rather than non-temporal (prefetchnta), measured best on
// this kind of core (bench --ab prefetch-l2, docs/benchmarks.md): on Zen 4,
// whose cores decode Gemma 3 270M's 640-wide Q5_0 rows near their compute
// limit (a core's decode rows kernel reads 29-31 GB/s from L2; from memory
// 20-23 GB/s non-temporal, 24.5-26.4 into L2 at 8192 bytes), into L2
// measured 1.01-1.05x Gemma 3 270M's tg128 and 1.13-1.19x the
// Qwen3-30B-A3B twin's tg32 against non-temporal at the same 8192 bytes,
// and 1.04-1.06x Gemma's against the distance before, non-temporal at 4096
// (PHASELAB_CPU_PREFETCH_L2=0 PHASELAB_CPU_PREFETCH_BYTES=4096 restores
// that); elsewhere non-temporal (not yet measured).
bool default_decode_prefetch_l2();
// The same for the matrices past 16 MiB, which a decode step streams from
// memory one row a call with the hardware's stream prefetcher at work (a
// small model's output matrix): 0 on Zen 4 (AMD family 19h with AVX-512),
// where a microbenchmark of Gemma 3 270M's 178 MB output matrix read 35-39
// GB/s with no software prefetch against 32-36 at 2048-4096 bytes and
// 29-34 at 8192, and bench --ab put its tg128 at 1.15-1.18x of 4096 (a
// larger model's big feed-forward matrices are not yet measured); elsewhere
// default_decode_prefetch_bytes() (on Zen 5 the prefetch was what took
// that stream from 60 to 71-81 GB/s).
int default_stream_prefetch_bytes();
// The most ways a decode step's thread reads such a matrix in (CpuSwitches::stream_ways).
constexpr int kMaxStreamWays = 8;
// How many ways a thread reads each chunk of such a matrix in, measured best
// on this kind of core (bench --ab stream-ways=N, Gemma 3 270M tg128,
// docs/benchmarks.md): 4 on Zen 4 (AMD family 19h with AVX-512), where with
// the VM's two vCPUs on different CCDs (more memory bandwidth for each)
// four ways measured 1.04-1.09x one and with them on one CCD 0.99-1.01x;
// 1 elsewhere (not yet measured).
int default_stream_ways();
// The most chunks a thread may get of such a matrix (CpuSwitches::stream_chunks).
constexpr int kMaxStreamChunks = 64;
struct CpuSwitches {
  std::string isa_cap;  // "" the best the CPU supports; "portable" | "avx2" | "avx-vnni" caps it (PHASELAB_CPU_ISA)
  bool repack = true;   // repack matrices at load (PHASELAB_CPU_REPACK=0 keeps the file's layout)
  // The repacked weights in 2 MiB pages (madvise MADV_HUGEPAGE, where the
  // kernel's transparent huge pages allow it), for fewer TLB misses while
  // decode streams them (PHASELAB_CPU_HUGEPAGES=0 turns it off). On: a
  // mixture-of-experts token reads 24 experts' matrices of under 1 MiB per
  // layer, each across ~216 small pages; in huge pages the Qwen3-30B-A3B
  // twin decoded 2.6-7% faster on AMD Zen 5 (3 alternating pairs), and its
  // load was not slower. Dense models measured level (Gemma 3 270M tg128:
  // Zen 3, 4 pairs, 71.1 off vs 70.2 on; Zen 5, 3 pairs, within the noise).
  bool huge_pages = true;
  // Single-token decode: prefetch the weight row this many bytes ahead of
  // the one being read, in whole rows (0: the hardware prefetcher alone;
  // PHASELAB_CPU_PREFETCH_BYTES). A prefetch a few rows ahead had been
  // +15% on AMD Zen 3 (Gemma 3 270M tg128: 78.1 against 67.8 tok/s); a
  // distance in bytes keeps the stream as far ahead for short rows (a
  // packed 640-wide Q5_0 row is 440 bytes, a Q8_0 one 680): 8 KiB against 4
  // rows, Gemma 3 270M tg128 on AMD Zen 5, see docs/benchmarks.md. The
  // best distance depends on the core: default_decode_prefetch_bytes().
  int decode_prefetch_bytes = default_decode_prefetch_bytes();  // at most kMaxPrefetchBytes
  // Those prefetches into L2 (prefetcht1) rather than non-temporal
  // (prefetchnta), in the decode rows kernels (PrefetchHint) and the one-row
  // path alike: default_decode_prefetch_l2() (PHASELAB_CPU_PREFETCH_L2). The
  // matrices past 16 MiB (stream_prefetch_bytes) keep prefetchnta.
  bool decode_prefetch_l2 = default_decode_prefetch_l2();
  // The distance for a matrix over 16 MiB in single-token decode (a small
  // model's output matrix; a large model's feed-forward matrices too, where
  // it is not yet measured), default_stream_prefetch_bytes()
  // (PHASELAB_CPU_STREAM_PREFETCH_BYTES; 0: none). Repacked weights only.
  int stream_prefetch_bytes = default_stream_prefetch_bytes();  // at most kMaxPrefetchBytes
  // Each chunk (stream_chunks) of such a matrix in a decode step read by
  // its thread as this many ascending streams, a row of each in turn (PHASELAB_CPU_STREAM_WAYS, 1 to
  // kMaxStreamWays; 1: one stream): more misses in flight than the
  // hardware prefetcher keeps for one stream. default_stream_ways(). With
  // stream_prefetch_bytes set, each way prefetches that far ahead (W times
  // the distance in flight).
  int stream_ways = default_stream_ways();
  // Such a matrix in a product of fewer than 4 tokens (a decode step; a
  // prompt's last-token logits) split into this many chunks per thread
  // (PHASELAB_CPU_STREAM_CHUNKS, 1 to kMaxStreamChunks; decode's other
  // products take one a thread; where a fused product holds such a
  // matrix, all of its matrices), claimed one at a time: a thread that
  // finishes first takes more of the rows, rather than waiting for the
  // other. With one chunk a thread, one thread waited on the other's half
  // of Gemma 3 270M's output matrix (on the Zen 4 VM the second half read
  // 2-26% slower, whichever thread read it); bench --ab stream-chunks=1
  // measured 0.94-0.99x of 8 on one CCD, 4 0.994, 16 0.996-1.020, 32
  // 1.000 (docs/benchmarks.md). Measured on Zen 4 only; the balance it
  // buys is any machine's. Repacked weights only (the file's layout keeps
  // two chunks a thread).
  int stream_chunks = 8;
  // Prefill's Q5_0 and Q8_0 products as row tiles (16 rows interleaved, 4
  // tokens a call; cpu_kernels.h kRowTile) where the kernels have them
  // (AVX-512); off: the paired 2-row x 8-token kernels (PHASELAB_CPU_ROW_TILES=0).
  bool row_tiles = true;
  // Decode's products (fewer than 4 tokens) 4 rows a kernel call
  // (cpu_kernels.h kDecodeRows) where the kernels have them (AVX-512): the
  // rows' chains overlap and their sums share one tree. On Zen 5, bench --ab
  // decode-rows: Gemma 3 270M tg 0.99-1.02x (medians 1.02-1.03), the Qwen3
  // MoE twin 1.04-1.10x; off: one row a call (PHASELAB_CPU_DECODE_ROWS=0).
  bool decode_rows = true;
};
struct CudaSwitches {
  bool graphs = true;           // replay decode passes as CUDA graphs (PHASELAB_CUDA_GRAPHS=0: off)
  bool tiled_attention = true;  // the tiled attention kernel for long chunks (PHASELAB_CUDA_ATTN_TILED=0: off)
  int gemm_min_rows = 16;       // rows from which matrix products use cuBLAS GEMMs (PHASELAB_CUDA_GEMM_MIN)
  bool profile = false;         // time each step of a pass (PHASELAB_CUDA_PROFILE)
  // Matrix-vector products of the block formats as dp4a integer dot products
  // with the input in 8 bits (PHASELAB_CUDA_Q8=0: float products throughout).
  bool q8_act = true;
  // A resident BF16 copy of every layer matrix for the prefill GEMMs where
  // the GPU has memory to spare (half of what is free, leaving 1 GiB), rather
  // than dequantizing slabs per pass (PHASELAB_CUDA_BF16_WEIGHTS=0: off).
  bool bf16_weights = true;
  // Work done by the last blocks of the kernel before it rather than by a
  // launch of its own (PHASELAB_CUDA_FUSED_TAILS: a mask of these, 0 none):
  // 1 a decoded token's residual adds and norms (after the output projection
  // and the FFN down), 2 its QK-norm, RoPE and K/V store (after the Q/K/V
  // product), 4 the FFN activation's 8-bit copy for the down product, 8 the
  // merge of the attention's key ranges.
  int fused_tails = 4;
  // Sampled draws' passes over the vocabulary on the device, a few thousand
  // candidates copied back instead of the logits (SeqChunk::draw;
  // PHASELAB_CUDA_SAMPLING=0: the logits come back and the host samples).
  bool device_sampling = true;
  std::string library;          // libphaselab_cuda.so to load; "" the installed one (PHASELAB_CUDA_LIB)
};

// The fast CPU backend (the default): 8-bit quantized activations, integer
// SIMD dot products (the best instruction set the CPU has, at most
// sw.isa_cap; with portable_only always portable C++), a persistent thread
// pool.
Result<std::unique_ptr<Backend>> make_cpu_backend(std::shared_ptr<const Model> model, int n_threads,
                                                  int max_batch = 64, bool portable_only = false,
                                                  const CpuSwitches& sw = {});

// What the CUDA backend can do on this machine: a usable device (with its
// peaks, for the phase meter) or the reason there is none.
struct CudaProbe {
  bool available = false;
  std::string description;  // "NVIDIA H200 (compute 9.0, 143771 MiB)"
  std::string reason;       // why not, when unavailable
  double peak_gbps = 0, peak_tflops = 0;
  size_t total_mem = 0, free_mem = 0;
};
// library: the libphaselab_cuda.so to load (CudaSwitches::library); "" the
// installed one.
CudaProbe probe_cuda(const std::string& library = "");

// The CUDA backend, loaded at run time from libphaselab_cuda.so, whose plain
// C interface (engine/backend/cuda/cuda_abi.h, versioned, checked at load)
// the engine side wraps as a Backend. Fails with the reason (no library, a
// library of another interface version, no device, too little memory) so
// that callers can report it and use the CPU backend instead. sw: its switches, the library
// to load among them (the backend reads no environment). host_threads: the
// threads of its run_host_tasks, where the engine loop samples the tokens
// of a pass (a lone sequence's draw split over the vocabulary): at most
// kCudaHostThreads; <= 0: one per physical core (up to that).
constexpr int kCudaHostThreads = 8;
Result<std::unique_ptr<Backend>> make_cuda_backend(std::shared_ptr<const Model> model, int max_batch = 64,
                                                   const CudaSwitches& sw = {}, int host_threads = 0);

// The instruction set of the CPU kernels make_cpu_backend uses here under
// isa_cap (CpuSwitches::isa_cap): "avx512-vnni", "avx-vnni", "avx2" or
// "portable".
std::string cpu_kernels_isa(const std::string& isa_cap = "");

// The plain reference path: dequantizes weight rows on the fly, float math,
// no SIMD beyond what the compiler does. The oracle for every other backend.
Result<std::unique_ptr<Backend>> make_cpu_reference_backend(std::shared_ptr<const Model> model, int n_threads,
                                                            int max_batch = 64);

// The backends make_backend makes.
enum class BackendKind {
  cpu,            // the fast CPU backend (the default): SIMD kernels
  cpu_portable,   // the fast CPU backend's arithmetic in portable C++ (no SIMD)
  cpu_reference,  // the plain reference path, the oracle
  cuda,           // the CUDA backend; unless told not to, the fast CPU one when it cannot run
};
inline constexpr BackendKind kBackendKinds[] = {BackendKind::cpu, BackendKind::cpu_portable, BackendKind::cpu_reference,
                                                BackendKind::cuda};
// "cpu", "cpu-portable", "cpu-reference", "cuda": the names the CLI's
// --backend, the GUI's settings and the comparison's variants use.
std::string_view to_string(BackendKind kind);
// The kind of a name; an unknown name is an error that lists the kinds.
Result<BackendKind> parse_backend_kind(std::string_view name);

// One way to make a backend from a kind, for the CLI, the GUI and the
// comparison alike.
struct BackendOptions {
  BackendKind kind = BackendKind::cpu;
  int n_threads = 0;         // CPU threads; <= 0: default_thread_count()
  int max_batch = 64;        // tokens per forward pass at most
  bool fallback = true;      // cuda unavailable: use the fast CPU backend (and say why) instead of failing
  int fallback_max_batch = 0;  // that CPU backend's passes; <= 0: max_batch (set_default_passes)
  CpuSwitches cpu;           // the CPU backends' switches
  CudaSwitches cuda;         // the CUDA backend's switches
};
// Default options whose switches (cpu, cuda) are those the PHASELAB_CPU_* and
// PHASELAB_CUDA_* variables set: the one place that reads them, so that the
// CLI, the GUI and the comparison honour the same documented variables.
BackendOptions backend_options_from_environment();
struct BackendChoice {
  std::unique_ptr<Backend> backend;
  std::string fallback_reason;  // non-empty when the kind asked for could not be used, and why
};
// Tokens per forward pass when the user names none, before the model is
// known: 64 on the CPU, 512 on CUDA, where a pass costs about the same
// launches whatever its size (Gemma 3 270M pp512 on an H200: 84279 tok/s in
// one pass of 512 against 18581 in passes of 64; docs/benchmarks.md).
int default_max_batch(BackendKind kind);
// The same once the model is known. On the fast CPU backend every pass
// reads all the blocks' weights again, so longer passes prefill faster
// (Gemma 3 270M pp512 on the 2-vCPU Zen 4 VM, two CCDs: 1264-1308 tok/s in
// passes of 64, 1424-1438 in one of 512); but a cancel waits for the pass
// under way to end. So: the largest of 512, 256, 128 tokens whose pass is
// at most kCpuPassOps of the blocks' matrices (prefill_ops_per_token), else
// 64. By the blocks' parameters: 512 up to 125M (Gemma 3 270M has ~100M:
// 0.2 G operations a token), 256 up to 250M, 128 up to 500M, 64 above. The
// portable and reference backends, many times slower, keep 64.
int default_max_batch(BackendKind kind, const Model& model);
inline constexpr double kCpuPassOps = 128e9;  // ~0.4 s of prefill on two Zen 4 cores (~300 G int8 operations/s)
// That rule for the CPU, from a prompt token's operations.
int default_cpu_max_batch(double prefill_ops_per_token);
// The passes of a front end whose user named none: bo->max_batch the
// default of bo->kind for this model, and where CUDA is asked for, the CPU
// fallback's passes (fallback_max_batch) by the CPU's rule, so that a model
// of billions of parameters does not prefill on the CPU in CUDA's passes of
// 512 tokens (a pass of seconds that a cancel waits for). Both at least
// at_least tokens: a command's own floor, such as a decode pass that takes
// a token of each of its sequences.
void set_default_passes(BackendOptions* bo, const Model& model, int at_least = 1);
// The same from a prompt token's operations (prefill_ops_per_token).
void set_default_passes(BackendOptions* bo, double prefill_ops_per_token, int at_least = 1);
// A floor set later (a scheduling policy's chunk, a decode pass's
// sequences): max_batch and, where set, fallback_max_batch at least tokens.
void raise_passes(BackendOptions* bo, int tokens);
// The names of the kinds (kBackendKinds' order), for help texts and menus.
const std::vector<std::string>& backend_kinds();
Result<BackendChoice> make_backend(std::shared_ptr<const Model> model, const BackendOptions& opt);

}  // namespace phaselab
