// make_backend and its options: the environment's switches, the kinds, the
// CUDA-to-CPU fallback (decided there for every front end).
#include <QtTest>
#include <array>
#include <cstdlib>
#include <cstring>

#include "backend/cpu/cpu_kernels.h"
#include "phaselab/backend.h"
#include "phaselab/kv_cache.h"
#include "phaselab/model.h"
#include "tiny_model.h"

using namespace phaselab;

namespace {

constexpr const char* kSwitchVars[] = {"PHASELAB_CPU_ISA",         "PHASELAB_CPU_REPACK",    "PHASELAB_CPU_HUGEPAGES",
                                       "PHASELAB_CPU_PREFETCH_BYTES", "PHASELAB_CPU_PREFETCH_L2", "PHASELAB_CPU_STREAM_PREFETCH_BYTES", "PHASELAB_CPU_STREAM_WAYS", "PHASELAB_CPU_STREAM_CHUNKS", "PHASELAB_CPU_ROW_TILES", "PHASELAB_CPU_DECODE_ROWS", "PHASELAB_CUDA_GRAPHS",
                                       "PHASELAB_CUDA_ATTN_TILED", "PHASELAB_CUDA_GEMM_MIN", "PHASELAB_CUDA_PROFILE",
                                       "PHASELAB_CUDA_Q8", "PHASELAB_CUDA_BF16_WEIGHTS", "PHASELAB_CUDA_LIB"};

void clear_switch_vars() {
  for (const char* v : kSwitchVars) unsetenv(v);
}

}  // namespace

class TestBackendFactory : public QObject {
  Q_OBJECT
 private slots:
  void init() { clear_switch_vars(); }
  void cleanup() { clear_switch_vars(); }

  void unset_variables_leave_the_defaults() {
    const BackendOptions o = backend_options_from_environment();
    const CpuSwitches cpu;
    const CudaSwitches cuda;
    QCOMPARE(o.cpu.isa_cap, cpu.isa_cap);
    QCOMPARE(o.cpu.repack, cpu.repack);
    QCOMPARE(o.cpu.huge_pages, cpu.huge_pages);
    QCOMPARE(o.cpu.decode_prefetch_bytes, cpu.decode_prefetch_bytes);
    QCOMPARE(o.cpu.stream_prefetch_bytes, cpu.stream_prefetch_bytes);
    QCOMPARE(cpu.decode_prefetch_bytes, default_decode_prefetch_bytes());
    QCOMPARE(o.cpu.decode_prefetch_l2, cpu.decode_prefetch_l2);
    QCOMPARE(cpu.decode_prefetch_l2, default_decode_prefetch_l2());
    QCOMPARE(cpu.stream_prefetch_bytes, default_stream_prefetch_bytes());
    QVERIFY(cpu.decode_prefetch_bytes > 0 && cpu.decode_prefetch_bytes <= kMaxPrefetchBytes);
    QVERIFY(cpu.stream_prefetch_bytes >= 0 && cpu.stream_prefetch_bytes <= kMaxPrefetchBytes);
    QCOMPARE(o.cpu.stream_ways, cpu.stream_ways);
    QCOMPARE(cpu.stream_ways, default_stream_ways());
    QVERIFY(cpu.stream_ways >= 1 && cpu.stream_ways <= kMaxStreamWays);
    QCOMPARE(o.cpu.stream_chunks, cpu.stream_chunks);
    QCOMPARE(cpu.stream_chunks, 8);
    QCOMPARE(o.cpu.row_tiles, cpu.row_tiles);
    QVERIFY(cpu.row_tiles);  // on by default
    QCOMPARE(o.cpu.decode_rows, cpu.decode_rows);
    QVERIFY(cpu.decode_rows);  // on by default
    QCOMPARE(o.cuda.graphs, cuda.graphs);
    QCOMPARE(o.cuda.tiled_attention, cuda.tiled_attention);
    QCOMPARE(o.cuda.gemm_min_rows, cuda.gemm_min_rows);
    QCOMPARE(o.cuda.profile, cuda.profile);
    QCOMPARE(o.cuda.q8_act, cuda.q8_act);
    QCOMPARE(o.cuda.bf16_weights, cuda.bf16_weights);
    QCOMPARE(o.cuda.library, cuda.library);
  }

  void the_documented_variables_set_the_switches() {
    setenv("PHASELAB_CPU_ISA", "avx2", 1);
    setenv("PHASELAB_CPU_REPACK", "0", 1);
    setenv("PHASELAB_CPU_HUGEPAGES", "0", 1);  // on by default
    setenv("PHASELAB_CPU_PREFETCH_BYTES", "9000", 1);
    setenv("PHASELAB_CPU_PREFETCH_L2", default_decode_prefetch_l2() ? "0" : "1", 1);  // the other state
    setenv("PHASELAB_CPU_STREAM_PREFETCH_BYTES", "99999999", 1);  // past the cap: the cap
    setenv("PHASELAB_CPU_STREAM_WAYS", "64", 1);                  // the same
    setenv("PHASELAB_CPU_STREAM_CHUNKS", "1000", 1);              // the same
    setenv("PHASELAB_CPU_ROW_TILES", "0", 1);
    setenv("PHASELAB_CPU_DECODE_ROWS", "0", 1);
    setenv("PHASELAB_CUDA_GRAPHS", "0", 1);
    setenv("PHASELAB_CUDA_ATTN_TILED", "0", 1);
    setenv("PHASELAB_CUDA_GEMM_MIN", "100000", 1);
    setenv("PHASELAB_CUDA_PROFILE", "1", 1);
    setenv("PHASELAB_CUDA_Q8", "0", 1);
    setenv("PHASELAB_CUDA_BF16_WEIGHTS", "0", 1);
    setenv("PHASELAB_CUDA_LIB", "/tmp/libphaselab_cuda_emu.so", 1);
    const BackendOptions o = backend_options_from_environment();
    QCOMPARE(o.cpu.isa_cap, std::string("avx2"));
    QVERIFY(!o.cpu.repack);
    QVERIFY(!o.cpu.huge_pages);
    QCOMPARE(o.cpu.decode_prefetch_bytes, 9000);
    QCOMPARE(o.cpu.decode_prefetch_l2, !default_decode_prefetch_l2());
    QCOMPARE(o.cpu.stream_prefetch_bytes, kMaxPrefetchBytes);
    QCOMPARE(o.cpu.stream_ways, kMaxStreamWays);
    QCOMPARE(o.cpu.stream_chunks, kMaxStreamChunks);
    QVERIFY(!o.cpu.row_tiles);
    QVERIFY(!o.cpu.decode_rows);
    QVERIFY(!o.cuda.graphs);
    QVERIFY(!o.cuda.tiled_attention);
    QCOMPARE(o.cuda.gemm_min_rows, 100000);
    QVERIFY(o.cuda.profile);
    QVERIFY(!o.cuda.q8_act);
    QVERIFY(!o.cuda.bf16_weights);
    QCOMPARE(o.cuda.library, std::string("/tmp/libphaselab_cuda_emu.so"));
  }

  void only_zero_turns_a_flag_off_and_a_bad_distance_keeps_the_default() {
    setenv("PHASELAB_CPU_REPACK", "1", 1);
    setenv("PHASELAB_CUDA_GRAPHS", "", 1);
    setenv("PHASELAB_CUDA_PROFILE", "0", 1);
    setenv("PHASELAB_CUDA_GEMM_MIN", "-3", 1);
    setenv("PHASELAB_CPU_PREFETCH_BYTES", "-1", 1);
    setenv("PHASELAB_CPU_STREAM_PREFETCH_BYTES", "-5", 1);
    setenv("PHASELAB_CPU_STREAM_WAYS", "0", 1);
    setenv("PHASELAB_CPU_STREAM_CHUNKS", "0", 1);
    setenv("PHASELAB_CPU_PREFETCH_L2", "off", 1);  // not "0": on
    const BackendOptions o = backend_options_from_environment();
    QVERIFY(o.cpu.decode_prefetch_l2);
    QCOMPARE(o.cpu.stream_ways, CpuSwitches{}.stream_ways);
    QCOMPARE(o.cpu.stream_chunks, CpuSwitches{}.stream_chunks);
    QCOMPARE(o.cpu.decode_prefetch_bytes, CpuSwitches{}.decode_prefetch_bytes);
    QCOMPARE(o.cpu.stream_prefetch_bytes, CpuSwitches{}.stream_prefetch_bytes);
    QVERIFY(o.cpu.repack);
    QVERIFY(o.cuda.graphs);
    QVERIFY(!o.cuda.profile);
    QCOMPARE(o.cuda.gemm_min_rows, CudaSwitches{}.gemm_min_rows);
  }

  void the_isa_cap_caps_the_cpu_kernels() {
    QCOMPARE(cpu_kernels_isa("portable"), std::string("portable"));
    QCOMPARE(cpu_kernels_isa(), std::string(cpu::best_kernels().isa));
    if (cpu::avx2_kernels()) {
      QCOMPARE(cpu_kernels_isa("avx2"), std::string("avx2"));
      QVERIFY(cpu_kernels_isa("avx-vnni") != "avx512-vnni");
    }
    BackendOptions o;
    o.n_threads = 1;
    o.max_batch = 8;
    o.cpu.isa_cap = "portable";
    auto c = make_backend(testing::shared_stories(), o);
    QVERIFY2(c.is_ok(), c.status().message().c_str());
    QCOMPARE(c->backend->name(), std::string("cpu-portable"));
    QVERIFY(c->fallback_reason.empty());
  }

  void cuda_unavailable_falls_back_to_the_cpu_with_its_switches_and_the_reason() {
    if (probe_cuda().available) QSKIP("a CUDA device is available here");
    BackendOptions o;
    o.kind = BackendKind::cuda;
    o.n_threads = 1;
    o.max_batch = 8;
    o.cpu.isa_cap = "portable";
    auto c = make_backend(testing::shared_stories(), o);
    QVERIFY2(c.is_ok(), c.status().message().c_str());
    QCOMPARE(c->backend->name(), std::string("cpu-portable"));
    QVERIFY(!c->fallback_reason.empty());
    QCOMPARE(c->backend->max_batch(), 8);  // no fallback_max_batch: the passes asked for
    o.fallback_max_batch = 16;
    auto d = make_backend(testing::shared_stories(), o);
    QVERIFY2(d.is_ok(), d.status().message().c_str());
    QCOMPARE(d->backend->max_batch(), 16);  // the CPU's own
    o.fallback = false;  // a comparison: no substitute
    QVERIFY(!make_backend(testing::shared_stories(), o).is_ok());
  }

  // A front end's defaults: CUDA's 512 and, for its CPU fallback, the CPU's
  // rule, both at least the command's floor; later floors raise both.
  void cuda_defaults_give_the_cpu_fallback_the_cpus_passes() {
    BackendOptions o;
    o.kind = BackendKind::cuda;
    set_default_passes(&o, 14e9);  // a 7B model's 2 x 7G operations a token
    QCOMPARE(o.max_batch, 512);
    QCOMPARE(o.fallback_max_batch, 64);
    set_default_passes(&o, 14e9, 100);
    QCOMPARE(o.max_batch, 512);
    QCOMPARE(o.fallback_max_batch, 100);
    set_default_passes(&o, 0, 1);
    QCOMPARE(o.fallback_max_batch, 512);
    set_default_passes(&o, 14e9);
    raise_passes(&o, 256);  // a policy's chunks of 256 tokens
    QCOMPARE(o.max_batch, 512);
    QCOMPARE(o.fallback_max_batch, 256);
    raise_passes(&o, 1024);
    QCOMPARE(o.max_batch, 1024);
    QCOMPARE(o.fallback_max_batch, 1024);
    // The CPU kinds have no fallback: their own passes, and none set.
    o.kind = BackendKind::cpu;
    set_default_passes(&o, 14e9, 8);
    QCOMPARE(o.max_batch, 64);
    QCOMPARE(o.fallback_max_batch, 0);
    set_default_passes(&o, 0);
    QCOMPARE(o.max_batch, 512);
    raise_passes(&o, 600);
    QCOMPARE(o.max_batch, 600);
    QCOMPARE(o.fallback_max_batch, 0);
    o.kind = BackendKind::cpu_portable;
    set_default_passes(&o, 0, 100);
    QCOMPARE(o.max_batch, 100);
    QCOMPARE(o.fallback_max_batch, 0);
    o.kind = BackendKind::cpu_reference;
    set_default_passes(&o, *testing::shared_stories());
    QCOMPARE(o.max_batch, 64);
  }

  // The fast CPU backend's default pass: the longest of 512, 256, 128
  // tokens whose pass stays within kCpuPassOps, else 64 (a cancel waits for
  // the pass under way); CUDA's is 512 whatever the model.
  void the_default_pass_shortens_as_the_model_grows() {
    QCOMPARE(default_cpu_max_batch(0), 512);
    QCOMPARE(default_cpu_max_batch(kCpuPassOps / 512), 512);
    QCOMPARE(default_cpu_max_batch(kCpuPassOps / 512 * 1.01), 256);
    QCOMPARE(default_cpu_max_batch(kCpuPassOps / 256), 256);
    QCOMPARE(default_cpu_max_batch(kCpuPassOps / 128), 128);
    QCOMPARE(default_cpu_max_batch(kCpuPassOps / 128 * 1.01), 64);
    QCOMPARE(default_cpu_max_batch(14e9), 64);  // a 7B model's 2 x 7G
    QCOMPARE(default_max_batch(BackendKind::cpu, *testing::shared_stories()), 512);
    QCOMPARE(default_max_batch(BackendKind::cpu), 64);
    QCOMPARE(default_max_batch(BackendKind::cuda, *testing::shared_stories()), 512);
    // The portable and reference backends, many times slower, keep 64.
    QCOMPARE(default_max_batch(BackendKind::cpu_portable, *testing::shared_stories()), 64);
    QCOMPARE(default_max_batch(BackendKind::cpu_reference, *testing::shared_stories()), 64);
    const std::string path = testing::default_model_path();
    if (path.empty()) {
      if (std::getenv("CI")) QFAIL("default model missing: scripts/fetch-model.sh should have fetched it");
      QSKIP("default model not fetched (run scripts/fetch-model.sh)");
    }
    auto model = Model::load(path);
    QVERIFY2(model.is_ok(), model.status().message().c_str());
    // Gemma 3 270M: ~0.2 G operations a prompt token (its blocks' 100M weights).
    QCOMPARE(default_max_batch(BackendKind::cpu, **model), 512);
  }

  void every_kind_has_one_name_that_parses_back() {
    QCOMPARE(backend_kinds().size(), std::size(kBackendKinds));
    for (size_t i = 0; i < std::size(kBackendKinds); i++) {
      const BackendKind k = kBackendKinds[i];
      QCOMPARE(std::string(to_string(k)), backend_kinds()[i]);
      auto parsed = parse_backend_kind(to_string(k));
      QVERIFY(parsed.is_ok());
      QVERIFY(*parsed == k);
    }
    QCOMPARE(std::string(to_string(BackendKind::cpu_portable)), std::string("cpu-portable"));
    QCOMPARE(std::string(to_string(BackendKind::cpu_reference)), std::string("cpu-reference"));
  }

  void an_unknown_kind_is_refused_with_the_kinds() {
    auto k = parse_backend_kind("tpu");
    QVERIFY(!k.is_ok());
    QVERIFY(k.status().message().find("unknown backend 'tpu'") != std::string::npos);
    for (const std::string& name : backend_kinds()) QVERIFY(k.status().message().find(name) != std::string::npos);
  }

  // The decode path's switches change where the weights live and what is
  // prefetched, never the arithmetic: decoded logits are bitwise equal with
  // huge pages on or off, any prefetch distance and hint, and decode rows on or off
  // (kDecodeRows rows a kernel call; a tiny qwen2, whose Q4_K
  // matrices are repacked; a small Qwen3 MoE, whose Q4_K experts are
  // repacked, each layer's tensor one stretch, and decoded by matvec_many.
  // All repacked matrices share one buffer, past the 2 MiB from which huge
  // pages are asked for in both models, so the two runs differ in that.
  // Whether the kernel grants them depends on the machine's THP setting).
  void decode_switches_leave_the_logits_bitwise_equal_data() {
    QTest::addColumn<QString>("arch");
    QTest::newRow("qwen2") << "qwen2";
    QTest::newRow("qwen3moe-q4_k") << "qwen3moe-q4_k";
    // Q5_0 (packed on AVX-512) 320 wide: a group, a half group and two
    // blocks a row; Q and K are refined products, so a lone token's take
    // the refined decode rows (RepackedFormat::dot1_rows2) where decode
    // rows are on, and the two calls per 4 rows where they are off.
    QTest::newRow("gemma3-q5_0") << "gemma3-q5_0";
  }
  void decode_switches_leave_the_logits_bitwise_equal() {
    QFETCH(QString, arch);
    testing::TinySpec spec = testing::tiny_spec(arch == "gemma3-q5_0" ? "gemma3" : arch.toStdString());
    if (arch == "gemma3-q5_0") {
      spec.matrix_type = TensorType::Q5_0;
      spec.n_embd = 320;
      spec.n_ff = 640;
    }
    if (spec.n_expert > 0) spec.n_expert = 64;
    const std::string path = testing::write_tiny_model(spec, "tiny_switches_" + arch.toStdString() + ".gguf");
    auto model = Model::load(path);
    QVERIFY2(model.is_ok(), model.status().message().c_str());
    std::shared_ptr<const Model> m(*model);
    const std::vector<int32_t> tokens = {1, 260, 261, 262, 100, 101, 7, 42};
    // One token per pass (the decode path), then passes of 2 and 3 tokens
    // (decode batches: the decode rows token by token).
    auto decode = [&](const CpuSwitches& sw, int threads = 2) {
      auto b = make_cpu_backend(m, threads, 8, false, sw);
      if (!b) qFatal("%s", b.status().message().c_str());
      auto kv = KvCache::create(m->config(), 64);
      if (!kv) qFatal("%s", kv.status().message().c_str());
      const int nv = m->config().n_vocab;
      std::vector<float> all, rows(3 * nv);
      for (int32_t t : tokens) {
        if (Status st = (*b)->forward(&t, 1, **kv, rows.data(), LogitsMode::last); !st) qFatal("forward: %s", st.message().c_str());
        all.insert(all.end(), rows.begin(), rows.begin() + nv);
      }
      for (int n : {2, 3}) {
        if (Status st = (*b)->forward(tokens.data(), n, **kv, rows.data(), LogitsMode::all); !st)
          qFatal("forward: %s", st.message().c_str());
        all.insert(all.end(), rows.begin(), rows.begin() + n * nv);
      }
      return all;
    };
    CpuSwitches base;
    base.huge_pages = false;
    base.decode_prefetch_bytes = 0;
    base.decode_prefetch_l2 = false;
    base.stream_prefetch_bytes = 0;
    base.decode_rows = false;
    const auto want = decode(base);
    struct Variant {
      bool huge;
      int ahead;
      bool l2;
      bool rows;
    };
    // (3 threads: chunk ends that are not the matrices' or the experts' ends.)
    for (const Variant v : {Variant{true, 0, false, false}, Variant{false, 4096, false, true},
                            Variant{true, 65536, true, true}, Variant{false, 8192, true, true}}) {
      CpuSwitches sw = base;
      sw.huge_pages = v.huge;
      sw.decode_prefetch_bytes = v.ahead;
      sw.decode_prefetch_l2 = v.l2;
      sw.stream_prefetch_bytes = v.ahead / 2;
      sw.decode_rows = v.rows;
      const auto got = decode(sw, v.ahead == 65536 ? 3 : 2);
      QVERIFY(got.size() == want.size());
      QVERIFY2(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0,
               qPrintable(QString("huge pages %1, prefetch %2 (into L2 %3), decode rows %4")
                              .arg(v.huge)
                              .arg(v.ahead)
                              .arg(v.l2)
                              .arg(v.rows)));
    }
    // The switches that may change between passes (apply_cpu_switches, as
    // bench --ab alternates them), changed before every token: the same logits.
    auto b = make_cpu_backend(m, 2, 8, false, base);
    QVERIFY2(b.is_ok(), b.status().message().c_str());
    auto kv = KvCache::create(m->config(), 64);
    QVERIFY(kv.is_ok());
    const int nv = m->config().n_vocab;
    std::vector<float> all, rows(3 * nv);
    for (size_t i = 0; i < tokens.size() + 2; i++) {
      CpuSwitches sw = base;
      sw.decode_rows = i % 2 == 1;
      sw.decode_prefetch_bytes = i % 3 == 0 ? 0 : 8192;
      sw.decode_prefetch_l2 = i % 4 >= 2;
      sw.stream_prefetch_bytes = i % 3 == 1 ? 0 : 4096;
      QVERIFY((*b)->apply_cpu_switches(sw));
      const int n = i < tokens.size() ? 1 : static_cast<int>(i - tokens.size()) + 2;  // then passes of 2 and 3
      const int32_t* t = n == 1 ? &tokens[i] : tokens.data();
      QVERIFY((*b)->forward(t, n, **kv, rows.data(), n == 1 ? LogitsMode::last : LogitsMode::all));
      all.insert(all.end(), rows.begin(), rows.begin() + n * nv);
    }
    QVERIFY(all.size() == want.size());
    QVERIFY2(std::memcmp(all.data(), want.data(), all.size() * sizeof(float)) == 0, "switches changed between passes");
  }

  // A matrix past 16 MiB (Gemma 3 270M's 178 MB output matrix: the test
  // needs the default model) read by each thread in 1 to 8 ways, fixed or
  // changed before every decoded token, with 2 and 3 threads (shares of
  // 131072 rows, and of 87384, 87384 and 87376: 3 and 5 ways leave rows
  // over for the one-row loop), in 1 to 64 chunks a thread (claimed in
  // turn, so which thread reads which rows varies): bitwise the logits of
  // one way and one chunk a thread. (The output matrix is not a refined
  // product: the ways' precise branch is not run.)
  void stream_ways_and_chunks_leave_the_logits_bitwise_equal() {
    const std::string path = testing::default_model_path();
    if (path.empty()) {
      if (std::getenv("CI")) QFAIL("default model missing: scripts/fetch-model.sh should have fetched it");
      QSKIP("default model not fetched (run scripts/fetch-model.sh)");
    }
    auto model = Model::load(path);
    QVERIFY2(model.is_ok(), model.status().message().c_str());
    std::shared_ptr<const Model> m(*model);
    const std::vector<int32_t> tokens = {2, 2063, 10779, 78113, 236769, 236749};
    const int nv = m->config().n_vocab;
    auto decode = [&](int threads, int fixed_ways, int chunks) {
      CpuSwitches sw;
      sw.stream_ways = fixed_ways > 0 ? fixed_ways : 1;
      sw.stream_chunks = chunks > 0 ? chunks : 1;
      auto b = make_cpu_backend(m, threads, 8, false, sw);
      if (!b) qFatal("%s", b.status().message().c_str());
      auto kv = KvCache::create(m->config(), 64);
      if (!kv) qFatal("%s", kv.status().message().c_str());
      std::vector<float> all, row(nv);
      for (size_t i = 0; i < tokens.size(); i++) {
        if (fixed_ways == 0) {  // (1, 2, 3, 4, 8, 5)
          sw.stream_ways = i == 4 ? 8 : i == 5 ? 5 : static_cast<int>(i) + 1;
          if (!(*b)->apply_cpu_switches(sw)) qFatal("apply_cpu_switches refused");
        }
        if (chunks == 0) {  // (1, 8, 3, 64, 2, 7)
          sw.stream_chunks = std::array{1, 8, 3, 64, 2, 7}[i % 6];
          if (!(*b)->apply_cpu_switches(sw)) qFatal("apply_cpu_switches refused");
        }
        if (Status st = (*b)->forward(&tokens[i], 1, **kv, row.data(), LogitsMode::last); !st)
          qFatal("forward: %s", st.message().c_str());
        all.insert(all.end(), row.begin(), row.end());
      }
      return all;
    };
    const auto want = decode(2, 1, 1);
    struct Case {
      int threads, ways, chunks;  // 0: changed before every token
    };
    for (const Case& c : {Case{2, 4, 1}, Case{3, 4, 1}, Case{2, 3, 1}, Case{3, 5, 1}, Case{2, 0, 1}, Case{3, 0, 1},
                          Case{2, 4, 8}, Case{3, 3, 8}, Case{2, 1, 64}, Case{2, 4, 0}, Case{3, 0, 0}}) {
      const auto got = decode(c.threads, c.ways, c.chunks);
      QVERIFY(got.size() == want.size());
      const auto state = [](int v) { return v == 0 ? QString("changing") : QString::number(v); };
      QVERIFY2(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0,
               qPrintable(QString("%1 threads, ways %2, chunks %3").arg(c.threads).arg(state(c.ways)).arg(state(c.chunks))));
    }
  }

  // Prefill's row tiles switched between passes (apply_cpu_switches, as
  // bench --ab row-tiles does): a tiny Q8_0 Qwen3 whose 256-wide rows take
  // them, 45 tokens in one pass, gives bitwise the same logits with the
  // tiles off, on, and switched off and on again in one backend (whose
  // tile scratch is made at load whatever the switch says then).
  void row_tiles_switched_between_passes_leave_the_logits_bitwise_equal() {
    const std::string path = testing::write_tiny_model(testing::tiny_spec("qwen3-wide"), "tiny_switches_qwen3-wide.gguf");
    auto model = Model::load(path);
    QVERIFY2(model.is_ok(), model.status().message().c_str());
    std::shared_ptr<const Model> m(*model);
    const int nv = m->config().n_vocab, n = 45;
    std::vector<int32_t> tokens(n);
    for (int i = 0; i < n; i++) tokens[i] = 1 + (i * 37) % (nv - 1);
    CpuSwitches off;
    off.row_tiles = false;
    auto prefill = [&](Backend& b) {
      auto kv = KvCache::create(m->config(), 64);
      if (!kv) qFatal("%s", kv.status().message().c_str());
      std::vector<float> logits(static_cast<size_t>(n) * nv);
      if (Status st = b.forward(tokens.data(), n, **kv, logits.data(), LogitsMode::all); !st)
        qFatal("forward: %s", st.message().c_str());
      return logits;
    };
    auto b_off = make_cpu_backend(m, 2, 64, false, off);
    QVERIFY2(b_off.is_ok(), b_off.status().message().c_str());
    const auto want = prefill(**b_off);
    QVERIFY((*b_off)->apply_cpu_switches(CpuSwitches{}));  // tiles on: the scratch was made at load
    const auto on = prefill(**b_off);
    QVERIFY((*b_off)->apply_cpu_switches(off));
    const auto off_again = prefill(**b_off);
    for (const auto* got : {&on, &off_again})
      QVERIFY2(std::memcmp(got->data(), want.data(), want.size() * sizeof(float)) == 0, "row tiles switched between passes");
  }

  // gpt-oss (its routing, biases and sinks), MXFP4 matrices and RoPE
  // scaling run on the CUDA backend too: where a device runs it is chosen,
  // and where none does the fallback names the device's reason, never the
  // model's features (which it did while they ran on the CPU only). (On the
  // CUDA emulator test_cuda checks these models' logits against the CPU.)
  void gpt_oss_mxfp4_and_rope_scaling_are_cuda_models() {
    testing::TinySpec mx = testing::tiny_spec("llama");
    mx.matrix_type = TensorType::MXFP4;
    testing::TinySpec scaled = testing::tiny_spec("llama");
    scaled.yarn_factor = 4;
    scaled.rope_scaling = "linear";
    const bool device = probe_cuda().available;
    for (const auto& spec : {testing::tiny_spec("gpt-oss"), mx, scaled}) {
      auto model = Model::load(testing::write_tiny_model(spec, "tiny_cuda_kinds.gguf"));
      QVERIFY2(model.is_ok(), model.status().message().c_str());
      std::shared_ptr<const Model> m(*model);
      BackendOptions o;
      o.kind = BackendKind::cuda;
      o.n_threads = 1;
      auto c = make_backend(m, o);
      QVERIFY2(c.is_ok(), c.status().message().c_str());
      if (device) {
        QCOMPARE(c->backend->name(), std::string("cuda"));
        continue;
      }
      QVERIFY(c->backend->name().rfind("cpu", 0) == 0);
      for (const char* feature : {"expert routing", "MXFP4", "RoPE scaling"})
        QVERIFY2(c->fallback_reason.find(feature) == std::string::npos, c->fallback_reason.c_str());
    }
  }

  void each_cpu_kind_makes_its_backend() {
    BackendOptions o;
    o.n_threads = 1;
    o.max_batch = 8;
    o.kind = BackendKind::cpu_portable;
    auto portable = make_backend(testing::shared_stories(), o);
    QVERIFY2(portable.is_ok(), portable.status().message().c_str());
    QCOMPARE(portable->backend->name(), std::string("cpu-portable"));
    o.kind = BackendKind::cpu_reference;
    auto reference = make_backend(testing::shared_stories(), o);
    QVERIFY2(reference.is_ok(), reference.status().message().c_str());
    QCOMPARE(reference->backend->name(), std::string("cpu-reference"));
    o.kind = BackendKind::cpu;
    auto fast = make_backend(testing::shared_stories(), o);
    QVERIFY2(fast.is_ok(), fast.status().message().c_str());
    QCOMPARE(fast->backend->name(), "cpu-" + cpu_kernels_isa());
  }
};

QTEST_APPLESS_MAIN(TestBackendFactory)
#include "test_backend_factory.moc"
