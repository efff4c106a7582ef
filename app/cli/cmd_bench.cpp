// phaselab-cli bench: llama-bench style throughput. pp<N>: prefill of N prompt
// tokens; tg<N>: N decode steps of one token each; both from an empty cache,
// or with -d D after D tokens already in it ("pp512 @ d2000", as llama-bench
// names them). One warm-up run, then mean and standard deviation of tokens/s
// over the repeats (the engine's measure_pp_tg, phaselab/throughput.h). On
// the CPU the machine's peaks are measured first (phaselab/machine.h) so
// decode reads as a fraction of the read bandwidth and prefill as a fraction
// of the compute peak (phaselab/metrics.h).
//
// The file reads in three parts: the options, the measurements (pp/tg,
// speculative, chat turns), and the report (JSON or a table and notes).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#include "bench_probes.h"
#include "cli_util.h"
#include "commands.h"
#include "engine_setup.h"
#include "phaselab/machine.h"
#include "phaselab/memory.h"
#include "phaselab/metrics.h"
#include "phaselab/prompt.h"
#include "phaselab/schedule_policy.h"
#include "phaselab/session.h"
#include "phaselab/throughput.h"

namespace phaselab::cli {

namespace {

// ---- Options ----

// text as a whole decimal integer from lo to hi, or none.
std::optional<int> int_in(const std::string& text, int lo, int hi) {
  int v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v < lo || v > hi) return std::nullopt;
  return v;
}

// "0,2000,8000": depths from 0 to 1 << 20, each once, in the order given.
Result<std::vector<int>> parse_depths(const std::string& text) {
  std::vector<int> out;
  for (const std::string& item : split_commas(text)) {
    const std::optional<int> v = int_in(item, 0, 1 << 20);
    if (!v) return invalid_argument("'" + item + "' is not a depth (a token count from 0 to 1048576; e.g. -d 0,2000)");
    if (std::find(out.begin(), out.end(), *v) == out.end()) out.push_back(*v);
  }
  if (out.empty()) return invalid_argument("no depth given (e.g. -d 2000 or -d 0,2000,8000)");
  return out;
}

// --ab SWITCH: the tests with one of the CPU switches that may change
// between passes in two states, alternating (measure_ab).
struct AbSpec {
  CpuSwitches a, b;
  std::string label_a, label_b;
};

// "decode-rows", "row-tiles", "prefetch-l2" (each off against on), "prefetch=BYTES" or
// "stream-prefetch=BYTES" (the distance in effect against BYTES),
// "stream-ways=N" (the ways in effect against N), "stream-chunks=N" (the
// chunks a thread in effect against N), from the switches sw in effect.
Result<AbSpec> parse_ab(const std::string& text, const CpuSwitches& sw) {
  AbSpec ab;
  ab.a = ab.b = sw;
  if (text == "decode-rows") {
    ab.a.decode_rows = false, ab.b.decode_rows = true;
    ab.label_a = "decode rows off", ab.label_b = "decode rows on";
  } else if (text == "row-tiles") {
    ab.a.row_tiles = false, ab.b.row_tiles = true;
    ab.label_a = "row tiles off", ab.label_b = "row tiles on";
  } else if (text == "prefetch-l2") {
    ab.a.decode_prefetch_l2 = false, ab.b.decode_prefetch_l2 = true;
    ab.label_a = "prefetch non-temporal", ab.label_b = "prefetch into L2";
  } else if (text.rfind("prefetch=", 0) == 0 || text.rfind("stream-prefetch=", 0) == 0) {
    const bool stream = text[0] == 's';
    const std::string v = text.substr(text.find('=') + 1);
    const std::optional<int> bytes = int_in(v, 0, kMaxPrefetchBytes);
    if (!bytes)
      return invalid_argument("'" + v + "' is not a prefetch distance (bytes from 0 to " + std::to_string(kMaxPrefetchBytes) +
                              "; e.g. --ab " + (stream ? "stream-" : "") + "prefetch=16384)");
    const std::string what = stream ? "stream prefetch " : "prefetch ";
    ab.label_a = what + std::to_string(stream ? sw.stream_prefetch_bytes : sw.decode_prefetch_bytes);
    (stream ? ab.b.stream_prefetch_bytes : ab.b.decode_prefetch_bytes) = *bytes;
    ab.label_b = what + std::to_string(*bytes);
  } else if (text.rfind("stream-ways=", 0) == 0) {
    const std::string v = text.substr(text.find('=') + 1);
    const std::optional<int> ways = int_in(v, 1, kMaxStreamWays);
    if (!ways)
      return invalid_argument("'" + v + "' is not a number of ways (1 to " + std::to_string(kMaxStreamWays) +
                              "; e.g. --ab stream-ways=4)");
    ab.label_a = "stream ways " + std::to_string(sw.stream_ways);
    ab.b.stream_ways = *ways;
    ab.label_b = "stream ways " + std::to_string(*ways);
  } else if (text.rfind("stream-chunks=", 0) == 0) {
    const std::string v = text.substr(text.find('=') + 1);
    const std::optional<int> chunks = int_in(v, 1, kMaxStreamChunks);
    if (!chunks)
      return invalid_argument("'" + v + "' is not a number of chunks a thread (1 to " +
                              std::to_string(kMaxStreamChunks) + "; e.g. --ab stream-chunks=1)");
    ab.label_a = "stream chunks " + std::to_string(sw.stream_chunks);
    ab.b.stream_chunks = *chunks;
    ab.label_b = "stream chunks " + std::to_string(*chunks);
  } else {
    return invalid_argument("'" + text +
                            "' is not a switch to alternate: decode-rows, row-tiles, prefetch-l2, prefetch=BYTES, "
                            "stream-prefetch=BYTES, stream-ways=N or stream-chunks=N");
  }
  return ab;
}

struct BenchOptions {
  int n_prompt = 512, n_gen = 128, reps = 5, turns = 0;
  std::vector<int> depths;
  std::optional<AbSpec> ab;
};

Result<BenchOptions> read_bench_options(const Args& args) {
  BenchOptions o;
  auto n_prompt = args.get_int("--n-prompt", 512, 0, 1 << 16);
  auto n_gen = args.get_int("--n-gen", 128, 0, 1 << 16);
  auto reps = args.get_int("--repetitions", 5, 1, 1000);
  for (const Status& st : {n_prompt.status(), n_gen.status(), reps.status()}) PHASELAB_TRY(st);
  o.n_prompt = *n_prompt, o.n_gen = *n_gen, o.reps = *reps;
  auto depths = parse_depths(args.get_or("--n-depth", "0"));
  if (!depths) return depths.status().with_context("-d");
  o.depths = std::move(*depths);
  auto turns = args.get_int("--chat-turns", 0, 0, 50);
  if (!turns) return turns.status();
  o.turns = *turns;
  if (args.has("--ab")) {
    auto ab = parse_ab(args.get_or("--ab", ""), backend_options_from_environment().cpu);
    if (!ab) return ab.status().with_context("--ab");
    o.ab = std::move(*ab);
  }
  return o;
}

// ---- Measurements ----

struct BenchResult {
  std::string test;
  int n_prompt = 0, n_gen = 0, n_depth = 0;
  double mean = 0, sd = 0;
  std::vector<double> samples;
  int ab = -1;  // --ab: 0 or 1, the state (the pair's other result is next to it); -1: none
};

// pp and tg at every depth. Random tokens (fixed seed) avoid special-casing
// any text.
Result<std::vector<BenchResult>> measure_throughput(Session& s, const BenchOptions& o) {
  std::mt19937 rng(42);
  std::uniform_int_distribution<int32_t> pick(0, s.model().config().n_vocab - 1);
  std::vector<BenchResult> results;
  for (int depth : o.depths) {
    ThroughputRun run;
    run.depth.resize(depth);
    for (auto& t : run.depth) t = pick(rng);
    run.repetitions = o.reps;
    for (ThroughputTest test : {ThroughputTest::pp, ThroughputTest::tg}) {
      const bool decode = test == ThroughputTest::tg;
      const int n = decode ? o.n_gen : o.n_prompt;
      if (n == 0) continue;
      run.test = test;
      run.tokens.resize(n);
      for (auto& t : run.tokens) t = pick(rng);
      const std::string name = (decode ? "tg" : "pp") + std::to_string(n) + (depth > 0 ? " @ d" + std::to_string(depth) : "");
      auto add = [&](Throughput& tps, int ab, const std::string& label) {
        BenchResult r;
        r.test = label.empty() ? name : name + " [" + label + "]";
        r.n_prompt = decode ? 0 : n;
        r.n_gen = decode ? n : 0;
        r.n_depth = depth;
        r.mean = tps.mean;
        r.sd = tps.sd;
        r.samples = std::move(tps.samples);
        r.ab = ab;
        results.push_back(std::move(r));
      };
      if (o.ab) {
        auto ab = measure_ab(s, run, o.ab->a, o.ab->b);
        s.backend().apply_cpu_switches(backend_options_from_environment().cpu);  // (measure_ab leaves state a)
        if (!ab) return ab.status();
        add(ab->a, 0, o.ab->label_a);
        add(ab->b, 1, o.ab->label_b);
        continue;
      }
      auto tps = measure_pp_tg(s, run);
      if (!tps) return tps.status();
      add(*tps, -1, "");
    }
  }
  return results;
}

// Speculative: the same greedy request with and without drafting.
struct SpecResult {
  double plain_tps = 0, spec_tps = 0, acceptance = 0, tokens_per_pass = 0;
  int drafted = 0, accepted = 0;
  bool same_output = true;
};

Result<SpecResult> measure_speculative(Session& s, const EngineSetup& setup, const BenchOptions& bo) {
  const std::string text =
      "The old lighthouse stood at the edge of the cliff, its white paint peeling in long strips. Every night the "
      "keeper climbed the spiral stairs, wound the clockwork, and lit the great lamp, so that ships far out at sea "
      "would know where the rocks were hidden beneath the waves.";
  // A rewrite task a base model follows too: one worked example, then the
  // text to copy again.
  const auto prompt =
      render_prompt(s.model().tokenizer(), setup.chat_format,
                    PromptInput::text_of("Original: " + text + "\nCopy: " + text + "\nOriginal: " + text + "\nCopy:"))
          .tokens;
  GenerateOptions o;
  o.n_predict = bo.n_gen;
  o.sampling.temperature = 0;
  o.ignore_eos = true;
  SpecResult spec;
  std::vector<double> plain_samples, spec_samples;
  std::vector<int32_t> plain_tokens;
  for (int rep = 0; rep <= bo.reps; rep++) {
    for (int mode = 0; mode < 2; mode++) {
      o.draft = mode ? setup.draft.get() : nullptr;
      o.spec_k = setup.spec_k;
      s.kv().clear();
      auto r = s.generate(prompt, o);
      if (!r) return r.status();
      if (rep == 0) {  // warm-up
        if (mode == 0) plain_tokens = r->tokens;
        else spec.same_output = r->tokens == plain_tokens;
        continue;
      }
      (mode ? spec_samples : plain_samples).push_back(r->metrics.decode_tps);
      if (mode) {
        spec.drafted = r->metrics.spec_drafted;
        spec.accepted = r->metrics.spec_accepted;
        spec.acceptance = r->metrics.spec_acceptance;
        spec.tokens_per_pass = r->metrics.tokens_per_pass;
      }
    }
  }
  auto mean = [](const std::vector<double>& v) {
    double x = 0;
    for (double y : v) x += y;
    return x / v.size();
  };
  spec.plain_tps = mean(plain_samples);
  spec.spec_tps = mean(spec_samples);
  return spec;
}

// Sampled decode: the same request decoded greedily and with temperature 1
// and top-p 0.95 (the OpenAI API's defaults plus the usual nucleus), both
// through Session::generate, alternating; each run's sample is the request's
// decode tokens/s, so the sampler's time per token is what separates them.
Result<std::vector<BenchResult>> measure_sampled(Session& s, const EngineSetup& setup, const BenchOptions& bo) {
  const auto prompt = render_prompt(s.model().tokenizer(), setup.chat_format,
                                    PromptInput::text_of("Once upon a time, in a small town by the sea, there lived"))
                          .tokens;
  GenerateOptions o;
  o.n_predict = bo.n_gen;
  o.ignore_eos = true;
  std::vector<double> samples[2];
  for (int rep = 0; rep <= bo.reps; rep++)
    for (int mode = 0; mode < 2; mode++) {
      o.sampling = SamplingParams{};
      o.sampling.temperature = mode == 0 ? 0.f : 1.f;
      o.sampling.top_k = 0;
      o.sampling.top_p = mode == 0 ? 1.f : 0.95f;
      o.sampling.min_p = 0.f;
      o.sampling.seed = static_cast<uint64_t>(rep);
      s.kv().clear();
      auto r = s.generate(prompt, o);
      if (!r) return r.status();
      if (rep > 0) samples[mode].push_back(r->metrics.decode_tps);  // run 0 warms up
    }
  std::vector<BenchResult> out;
  for (int mode = 0; mode < 2; mode++) {
    BenchResult r;
    r.test = "tg" + std::to_string(bo.n_gen) + (mode == 0 ? " greedy" : " t=1 top-p=0.95");
    r.n_gen = bo.n_gen;
    r.samples = samples[mode];
    for (double x : r.samples) r.mean += x / r.samples.size();
    for (double x : r.samples) r.sd += (x - r.mean) * (x - r.mean);
    r.sd = r.samples.size() > 1 ? std::sqrt(r.sd / (r.samples.size() - 1)) : 0.0;
    out.push_back(std::move(r));
  }
  return out;
}

// Chat: TTFT of the last of N scripted turns, with the prefix cache (only
// the new turn is prefilled) and without (the whole conversation is).
struct ChatResult {
  double ttft_cached = 0, ttft_cold = 0;
  int n_prompt = 0, n_reused = 0;
};

Result<ChatResult> measure_chat_turns(Session& s, const ChatFormat& format, int turns) {
  static const char* kQuestions[] = {
      "Tell me about the sea.", "What lives in it?", "Which of them is the largest?", "How deep can it dive?",
      "What does it eat?",      "Where does it sleep?", "How long does it live?", "Can people see it?"};
  ChatResult chat;
  for (int mode = 0; mode < 2; mode++) {
    const bool cached = mode == 0;
    s.kv().clear();
    std::vector<ChatMessage> msgs;
    GenerateOptions o;
    o.n_predict = 48;
    o.sampling.temperature = 0;
    o.prefix_cache = cached;
    for (int t = 0; t < turns; t++) {
      msgs.push_back({"user", kQuestions[t % 8]});
      const RenderedPrompt prompt = render_prompt(s.model().tokenizer(), format, PromptInput::chat_of(msgs));
      o.stop = prompt.stop;
      auto r = s.generate(prompt.tokens, o);
      if (!r) return r.status();
      msgs.push_back({"assistant", r->text});
      if (t + 1 == turns) {
        (cached ? chat.ttft_cached : chat.ttft_cold) = r->metrics.ttft_ms;
        chat.n_prompt = r->metrics.n_prompt;
        if (cached) chat.n_reused = r->metrics.n_reused;
      }
    }
  }
  return chat;
}

// ---- Report ----

// Everything measured, and what each result reads as on this machine (the
// engine divides: phaselab/metrics.h).
struct BenchReport {
  Session& s;
  const EngineSetup& setup;
  const BenchOptions& o;
  const MachinePeaks& peaks;
  std::vector<BenchResult> results;
  std::optional<SpecResult> spec;
  std::optional<ChatResult> chat;
  std::string backend;
  int threads = 0;
  double rss = 0, size_mib = 0;
  double weight_gb = 0;     // read by every decoded token
  double peak_gbps = 0;     // a GPU's peak (0 on the CPU)
  double machine_gbps = 0;  // the machine's read bandwidth
  double ops_per_token = 0;
  ComputePeak compute;
  const BenchProbes& probes;  // the machine around the tests; peaks is its probes.peaks()

  BenchReport(Session& s_, const EngineSetup& setup_, const BenchOptions& o_, const BenchProbes& probes_,
              int threads_)
      : s(s_), setup(setup_), o(o_), peaks(probes_.peaks()), backend(s_.backend().name()), threads(threads_),
        probes(probes_) {
    const Model& m = s.model();
    rss = peak_rss_mib();
    size_mib = m.file().file_size() / 1048576.0;
    weight_gb = m.active_weight_bytes() / 1e9;  // a MoE model's active experts only
    peak_gbps = backend == "cuda" ? probe_cuda(backend_options_from_environment().cuda.library).peak_gbps : 0.0;
    machine_gbps = peaks.read_bandwidth / 1e9;
    ops_per_token = prefill_ops_per_token(m);
    compute = compute_peak(backend, peaks.int8_ops, peaks.fp32_flops);
  }

  std::string model_name() const {
    const ModelConfig& c = s.model().config();
    return c.name.empty() ? c.arch_str : c.name;
  }
  // Attention reads K and V of every position a token sees, in each layer
  // (a sliding-window layer at most its window): per decoded token, averaged
  // over the test's steps.
  double kv_read_gb(const BenchResult& r) const {
    if (r.n_gen == 0) return 0.0;
    const ModelConfig& c = s.model().config();
    const double row_bytes = 2.0 * kv_row_bytes(s.kv().type(), c.n_embd_kv());
    double positions = 0;
    for (int il = 0; il < c.n_layer; il++)
      for (int i = 0; i < r.n_gen; i++) {
        const int seen = r.n_depth + i + 1, window = c.window_of(il);
        positions += window > 0 ? std::min(seen, window) : seen;
      }
    return positions * row_bytes / r.n_gen / 1e9;
  }
  // Decode reads every weight (and the K/V it attends to) once per pass: tg
  // makes one token a pass.
  PhaseLoad decode(const BenchResult& r, double peak_bytes_per_s) const {
    return decode_load((weight_gb + kv_read_gb(r)) * 1e9, r.n_gen > 0 ? r.mean : 0.0, 1.0, peak_bytes_per_s);
  }
  double read_peak_bytes_per_s() const { return (peak_gbps > 0 ? peak_gbps : machine_gbps) * 1e9; }
  // Speculative: the weights are read once per target pass, which yields
  // tokens_per_pass tokens (the K/V reads are left out: sg starts from an
  // empty cache and its prompt is short).
  PhaseLoad spec_decode(double peak_bytes_per_s) const {
    return decode_load(weight_gb * 1e9, spec->spec_tps, spec->tokens_per_pass, peak_bytes_per_s);
  }
  double decode_gbps(const BenchResult& r) const { return decode(r, 0).achieved / 1e9; }
  // Against the device's peak on a GPU, else the machine's read bandwidth.
  double bandwidth_fraction(const BenchResult& r) const { return decode(r, read_peak_bytes_per_s()).fraction; }
  // Prefill against its roofline: passes of max_batch tokens at most, each
  // reading the weights once; compute-bound from the machine balance on.
  PhaseLoad prefill(const BenchResult& r) const {
    PrefillRun run;
    run.ops_per_token = ops_per_token;
    run.weight_bytes = weight_gb * 1e9;
    run.n_tokens = r.n_prompt;
    run.max_pass_tokens = s.backend().max_batch();
    run.tokens_per_s = r.n_prompt > 0 ? r.mean : 0.0;
    return prefill_load(run, compute, read_peak_bytes_per_s());
  }

  // Where --ab's two states run the same code: decode rows and row tiles
  // are AVX-512 kernels of repacked weights (the prefetch and stream
  // switches act on every decode path of repacked weights).
  std::string ab_note() const {
    const CpuSwitches sw = backend_options_from_environment().cpu;
    const bool kernels = backend == "cpu-avx512-vnni" && sw.repack;
    if (o.ab->a.decode_prefetch_bytes == o.ab->b.decode_prefetch_bytes &&
        o.ab->a.decode_prefetch_l2 == o.ab->b.decode_prefetch_l2 &&
        o.ab->a.stream_prefetch_bytes == o.ab->b.stream_prefetch_bytes && o.ab->a.stream_ways == o.ab->b.stream_ways &&
        o.ab->a.stream_chunks == o.ab->b.stream_chunks && !kernels)
      return "; NOTE: this backend's kernels have no decode rows or row tiles (AVX-512 kernels of repacked weights): "
             "both states ran the same code";
    return "";
  }

  // The CPU decode path's choices in effect (PHASELAB_CPU_* variables), so
  // that a result says what it was measured with.
  std::string cpu_switches() const {
    const CpuSwitches sw = backend_options_from_environment().cpu;
    return "repack " + std::string(sw.repack ? "on" : "off") + ", huge pages " + (sw.huge_pages ? "on" : "off") +
           ", decode prefetch " + std::to_string(sw.decode_prefetch_bytes) + " bytes ahead " +
           (sw.decode_prefetch_l2 ? "into L2" : "non-temporal") +
           " (over 16 MiB: " + std::to_string(sw.stream_prefetch_bytes) + ", in " + std::to_string(sw.stream_ways) +
           (sw.stream_ways == 1 ? " way, " : " ways, ") + std::to_string(sw.stream_chunks) +
           (sw.stream_chunks == 1 ? " chunk a thread)" : " chunks a thread)") +
           ", row tiles " + (sw.row_tiles ? "on" : "off") + ", decode rows " + (sw.decode_rows ? "on" : "off") +
           (sw.isa_cap.empty() ? "" : ", ISA cap " + sw.isa_cap);
  }
  void print_json() const;
  void print_table() const;
  void print_prefill(const BenchResult& r) const;
};

void BenchReport::print_json() const {
  const Model& m = s.model();
  nlohmann::json arr = nlohmann::json::array();
  for (const auto& r : results)
    arr.push_back({{"test", r.test},
                   {"ab_state", r.ab < 0 || !o.ab ? std::string() : r.ab == 0 ? o.ab->label_a : o.ab->label_b},
                   {"n_prompt", r.n_prompt},
                   {"n_gen", r.n_gen},
                   {"tokens_per_s", r.mean},
                   {"tokens_per_s_sd", r.sd},
                   {"samples", r.samples},
                   {"repetitions", o.reps},
                   {"backend", backend},
                   {"threads", threads},
                   {"model", m.path()},
                   {"model_size_mib", size_mib},
                   {"n_params", parameter_count(m)},
                   {"n_params_active", active_parameter_count(m)},
                   {"experts", m.config().n_expert},
                   {"experts_used", m.config().n_expert_used},
                   {"type_mix", m.type_mix()},
                   {"kv_cache_mib", s.kv_bytes() / 1048576.0},
                   {"kv_type", kv_type_name(s.kv().type())},
                   {"n_depth", r.n_depth},
                   {"weights_gb_per_token", weight_gb},
                   {"kv_read_gb_per_token", kv_read_gb(r)},
                   {"decode_gbps", decode_gbps(r)},
                   {"device_peak_gbps", peak_gbps},
                   {"decode_bandwidth_fraction", bandwidth_fraction(r)},
                   {"prefill_gops", r.n_prompt > 0 ? ops_per_token * r.mean / 1e9 : 0.0},
                   {"prefill_bound", r.n_prompt > 0 ? (prefill(r).compute ? "compute" : "memory") : ""},
                   {"prefill_fraction", prefill(r).fraction},
                   {"prefill_compute_fraction", compute.ops_per_s > 0 && r.n_prompt > 0 ? ops_per_token * r.mean / compute.ops_per_s : 0.0},
                   {"prefill_tokens_per_pass", prefill(r).tokens_per_pass},
                   {"prefill_balance_tokens", prefill(r).balance_tokens},
                   {"machine_read_gbps", machine_gbps},
                   {"machine_fp32_gflops", peaks.fp32_flops / 1e9},
                   {"machine_int8_gops", peaks.int8_ops / 1e9},
                   {"machine_peak_threads", peaks.threads},
                   {"machine_llc_mib", peaks.llc_bytes / 1048576.0},
                   {"machine_llc_read_gbps", peaks.llc_read_bandwidth / 1e9},
                   {"machine_read_buffer_mib", peaks.buffer_bytes >> 20},
                   {"machine_peaks_plausible", peaks.plausible},
                   {"machine_peaks_note", peaks.note},
                   {"peak_rss_mib", rss},
                   {"cpu_switches", cpu_switches()}});
  for (auto& row : arr) probes.add_json(row);  // the pp and tg rows
  if (spec)
    arr.push_back({{"test", "sg" + std::to_string(o.n_gen)},
                   {"n_prompt", 0},
                   {"n_gen", o.n_gen},
                   {"tokens_per_s", spec->spec_tps},
                   {"tokens_per_s_plain", spec->plain_tps},
                   {"speedup", spec->spec_tps / spec->plain_tps},
                   {"spec", setup.draft->name()},
                   {"spec_k", setup.spec_k},
                   {"spec_drafted", spec->drafted},
                   {"spec_accepted", spec->accepted},
                   {"spec_acceptance", spec->acceptance},
                   {"tokens_per_pass", spec->tokens_per_pass},
                   {"decode_gbps", spec_decode(0).achieved / 1e9},
                   {"decode_bandwidth_fraction", spec_decode(read_peak_bytes_per_s()).fraction},
                   {"same_output_as_plain", spec->same_output},
                   {"backend", backend},
                   {"threads", threads},
                   {"model", m.path()},
                   {"peak_rss_mib", rss}});
  if (chat)
    arr.push_back({{"test", "chat" + std::to_string(o.turns)},
                   {"n_prompt", chat->n_prompt},
                   {"n_reused", chat->n_reused},
                   {"ttft_ms_prefix_cache", chat->ttft_cached},
                   {"ttft_ms_no_prefix_cache", chat->ttft_cold},
                   {"backend", backend},
                   {"threads", threads},
                   {"model", m.path()},
                   {"peak_rss_mib", rss}});
  std::printf("%s\n", arr.dump(2).c_str());
}

// A pass shorter than the machine balance cannot reach the compute peak: it
// is shown against the read bandwidth, and the balance is named either way.
void BenchReport::print_prefill(const BenchResult& r) const {
  const PhaseLoad p = prefill(r);
  if (p.compute)
    std::printf("\n%s: %.1f %s, %.1f%% of the machine's %s peak %.0f %s", r.test.c_str(), p.achieved / 1e9,
                compute.unit(), 100 * p.fraction, compute.name(), compute.ops_per_s / 1e9, compute.unit());
  else
    std::printf("\n%s: memory-bound, passes of %.0f tokens each read the %.3f GB of weights: %.1f GB/s, %.1f%% of the "
                "machine's read bandwidth %.1f GB/s",
                r.test.c_str(), p.tokens_per_pass, weight_gb, p.achieved / 1e9, 100 * p.fraction, p.peak / 1e9);
  if (p.balance_tokens > 0 && p.compute)
    std::printf(" (passes of %.0f tokens; compute-bound from ~%.0f tokens per pass)", p.tokens_per_pass,
                p.balance_tokens);
  else if (p.balance_tokens > 0)
    std::printf(" (compute-bound from ~%.0f tokens per pass)", p.balance_tokens);
  std::printf("\n");
}

void BenchReport::print_table() const {
  const Model& m = s.model();
  std::printf("| model | size | type mix | backend | threads | test | t/s |\n");
  std::printf("| --- | ---: | --- | --- | ---: | ---: | ---: |\n");
  for (const auto& r : results)
    std::printf("| %s | %.2f MiB | %s | %s | %d | %s | %.2f ± %.2f |\n", model_name().c_str(), size_mib,
                m.type_mix().c_str(), backend.c_str(), threads, r.test.c_str(), r.mean, r.sd);
  if (spec)
    std::printf("| %s | | | %s +%s k=%d | %d | sg%d | %.2f (plain %.2f, x%.2f) |\n", model_name().c_str(),
                backend.c_str(), setup.draft->name().c_str(), setup.spec_k, threads, o.n_gen, spec->spec_tps,
                spec->plain_tps, spec->spec_tps / spec->plain_tps);
  if (peaks.read_bandwidth > 0) std::printf("\nmachine: %s\n", describe_machine_peaks(peaks).c_str());
  probes.print_probe_line("the fractions below");
  if (const ModelConfig& c = s.model().config(); c.is_moe())
    std::printf("mixture of experts: %d of %d experts per token, %.3f of %.3f GB of weights read per token\n",
                c.n_expert_used, c.n_expert, weight_gb, s.model().weight_bytes() / 1e9);
  probes.print_placement_lines();
  if (backend.rfind("cpu-", 0) == 0 && backend != "cpu-reference")
    std::printf("cpu switches: %s (PHASELAB_CPU_REPACK, _HUGEPAGES, _PREFETCH_BYTES, _PREFETCH_L2, _STREAM_PREFETCH_BYTES, _STREAM_WAYS, _STREAM_CHUNKS, _ROW_TILES, _DECODE_ROWS, _ISA)\n", cpu_switches().c_str());
  for (const auto& r : results) {
    if (r.n_prompt > 0 && compute.ops_per_s > 0) print_prefill(r);
    if (r.n_gen > 0) {
      if (r.n_depth > 0)
        std::printf("\n%s: %.1f GB/s of weights and K/V (%.3f + %.3f GB per token)", r.test.c_str(), decode_gbps(r),
                    weight_gb, kv_read_gb(r));
      else
        std::printf("\n%s: %.1f GB/s of %sweights (%.3f GB per token)", r.test.c_str(), decode_gbps(r),
                    s.model().config().is_moe() ? "active " : "", weight_gb);
      if (peak_gbps > 0) std::printf(", %.1f%% of the device's peak %.0f GB/s", 100 * bandwidth_fraction(r), peak_gbps);
      else if (machine_gbps > 0)
        std::printf(", %.1f%% of the machine's read bandwidth %.1f GB/s", 100 * bandwidth_fraction(r), machine_gbps);
      if (peak_gbps <= 0 && weights_fit_in_llc(peaks, weight_gb * 1e9))
        std::printf(" (the weights fit in the %zu MiB last-level cache, which reads %.1f GB/s: %.1f%% of that)",
                    peaks.llc_bytes >> 20, peaks.llc_read_bandwidth / 1e9,
                    100 * decode(r, peaks.llc_read_bandwidth).fraction);
      std::printf("\n");
    }
  }
  for (size_t i = 1; i < results.size(); i++) {
    const BenchResult &a = results[i - 1], &b = results[i];
    if (a.ab != 0 || b.ab != 1) continue;
    std::vector<double> ratios;  // run by run: both states measured in the same run's minutes
    for (size_t k = 0; k < a.samples.size() && k < b.samples.size(); k++) ratios.push_back(b.samples[k] / a.samples[k]);
    std::sort(ratios.begin(), ratios.end());
    std::printf("\nA/B %s: %s / %s = %.3f (per run %.3f to %.3f, median %.3f; %zu runs, %s%s)\n",
                b.test.substr(0, b.test.find(" [")).c_str(), o.ab->label_b.c_str(), o.ab->label_a.c_str(), b.mean / a.mean,
                ratios.empty() ? 0.0 : ratios.front(), ratios.empty() ? 0.0 : ratios.back(),
                ratios.empty() ? 0.0 : ratios[ratios.size() / 2], ratios.size(),
                b.n_gen > 0 ? "alternating token by token" : "alternating run by run",
                ab_note().c_str());
  }
  if (spec) {
    std::printf("\nspeculative: drafted %d, accepted %d (%.0f%%), %.2f tokens per target pass, output %s plain greedy\n",
                spec->drafted, spec->accepted, 100 * spec->acceptance, spec->tokens_per_pass,
                spec->same_output ? "identical to" : "DIFFERENT from");
    // The weights are read once per target pass, not once per token.
    const PhaseLoad d = spec_decode(read_peak_bytes_per_s());
    std::printf("sg%d: %.1f target passes/s (%.2f tokens/s / %.2f tokens per pass), %.1f GB/s of weights", o.n_gen,
                target_passes_per_s(spec->spec_tps, spec->tokens_per_pass), spec->spec_tps, d.tokens_per_pass,
                d.achieved / 1e9);
    if (d.peak > 0)
      std::printf(", %.1f%% of the %s %.1f GB/s", 100 * d.fraction,
                  peak_gbps > 0 ? "device's peak" : "machine's read bandwidth", d.peak / 1e9);
    std::printf("\n");
  }
  if (chat)
    std::printf("\nchat turn %d: prompt %d tokens; TTFT %.1f ms with the prefix cache (%d tokens reused), %.1f ms "
                "without\n",
                o.turns, chat->n_prompt, chat->ttft_cached, chat->n_reused, chat->ttft_cold);
  const std::string window = s.kv().pool().window_note();
  std::printf("\npeak RSS %.1f MiB (model file %.1f MiB, KV cache %.1f MiB %s%s%s)\n", rss, size_mib,
              s.kv_bytes() / 1048576.0, kv_type_name(s.kv().type()), window.empty() ? "" : "; ", window.c_str());
}

}  // namespace

int cmd_bench(int argc, char** argv) {
  std::vector<OptionSpec> opts = engine_options();
  opts.insert(opts.end(), {{"--n-prompt", "-p", true},
                           {"--n-gen", "-n", true},
                           {"--repetitions", "-r", true},
                           {"--n-depth", "-d", true},
                           {"--chat-turns", "", true},
                           {"--sampled", "", false},
                           {"--json", "", false},
                           {"--no-peaks", "", false},
                           {"--batch", "", true},
                           {"--ab", "", true},
                           {"--help", "-h", false}});
  for (const OptionSpec& o : serving_bench_options()) opts.push_back(o);
  auto args = Args::parse(argc, argv, opts);
  if (!args) return report(args.status());
  if (args->has("--help")) {
    std::printf("usage: phaselab-cli bench -m MODEL [-p 512] [-n 128] [-d 0] [-r 5] [-t N] [--backend cpu] [--no-peaks] [--json]\n"
                "  pp<N>: prefill of N tokens; tg<N>: N single-token decode steps; -p 0 or -n 0 skips a test.\n"
                "  -d D[,D...]: run each test after D tokens already in the cache (\"tg128 @ d2000\"): attention\n"
                "  then reads D positions of K/V per layer (a sliding-window layer at most its window).\n"
                "  On the CPU the machine's peaks are measured before and after the tests (about a second\n"
                "  each: read bandwidth with every physical core, FP32 and int8 compute), and decode is shown\n"
                "  as a fraction of the better read bandwidth, prefill of the better compute peak; a note says\n"
                "  when the two probes, or the CPUs' placement, differ; --no-peaks skips that.\n"
                "  With --spec lookup|draft: also sg<N>, greedy generation of N tokens on a built-in\n"
                "  rewrite-the-text prompt with and without speculation (acceptance, speed-up).\n"
                "  --chat-turns N: TTFT of the N-th turn of a scripted chat, with and without prefix reuse.\n"
                "  --sampled: also tg<N> greedy and tg<N> t=1 top-p=0.95, N tokens generated from a short text\n"
                "  prompt each way, alternating: what sampling costs per token.\n"
                "  --batch 1,2,4,8,16,32: for each batch size B, B sequences of -p tokens (default 128) prefilled\n"
                "  together, then -n decode steps (default 32) for all B at once: aggregate tokens/s, each\n"
                "  sequence's TPOT, and the batch where decode turns compute-bound (-r defaults to 1).\n"
                "  --ab decode-rows|row-tiles|prefetch-l2|prefetch=BYTES|stream-prefetch=BYTES|stream-ways=N|\n"
                "  stream-chunks=N: each test with that CPU switch in two states (off and on; prefetch-l2:\n"
                "  decode's prefetches non-temporal, then into L2; the distance in effect and BYTES: prefetch\n"
                "  for decode's matrices, stream-prefetch for those over 16 MiB, such as the output matrix;\n"
                "  the ways in effect and N: each of a thread's chunks of those read as N streams; the\n"
                "  chunks in effect and N: those split into N chunks a thread, claimed in turn), alternating in\n"
                "  the same minutes (tg token by token, pp run by run): both states' tokens/s and their ratio,\n"
                "  run by run. For choosing a switch on a machine whose speed drifts between runs.\n%s",
                kEngineHelp);
    std::printf("\nusage: phaselab-cli bench --serving -m MODEL [--policy LIST] [--streams 4] [--long-prompt 2000] [--json]\n"
                "       phaselab-cli bench --serving --url URL [-m MODEL] [workload flags] [--json]\n%s%s%s",
                kServingBenchHelp[0], kSchedulePolicyHelp, kServingBenchHelp[1]);
    return kExitOk;
  }
  if (args->has("--ab") && (args->has("--serving") || args->has("--batch")))
    return usage_error("--ab alternates a switch in the pp and tg tests; it does not apply to --serving or --batch");
  if (args->has("--serving")) return bench_serving(*args);
  if (args->has("--batch")) return bench_batch_sweep(*args);
  auto bo = read_bench_options(*args);
  if (!bo) return report(bo.status());
  if (bo->n_prompt == 0 && bo->n_gen == 0) return usage_error("nothing to measure: -p and -n are both 0");
  const int max_depth = *std::max_element(bo->depths.begin(), bo->depths.end());
  // The context holds the deepest, longest test (unless --ctx-size says otherwise).
  const int need = max_depth + std::max(bo->n_prompt, bo->n_gen);
  // --chat-turns measures a chat: its session keeps the window at each
  // prompt's end, as the app's does.
  const bool chat_session = args->has("--chat-turns");
  auto setup = open_session(*args, need + (args->has("--spec") || args->has("--draft") || chat_session ? 1024 : 0), chat_session);
  if (!setup) return report(setup.status());
  Session& s = *setup->session;
  if (need > s.n_ctx())
    return usage_error("the test needs " + std::to_string(need) + " tokens of context but the session has " +
                       std::to_string(s.n_ctx()) + ": pass --ctx-size");

  const int n_threads = *args->get_int("--threads", default_threads(), 1, 256);
  BenchProbes probes(s.backend().name(), args->has("--no-peaks"), n_threads);
  auto results = measure_throughput(s, *bo);
  if (!results) return report(results.status());
  probes.tests_done();
  std::optional<SpecResult> spec;
  if (setup->draft != nullptr && bo->n_gen > 0) {
    auto r = measure_speculative(s, *setup, *bo);
    if (!r) return report(r.status());
    spec = *r;
  }
  if (args->has("--sampled") && bo->n_gen > 0) {
    auto r = measure_sampled(s, *setup, *bo);
    if (!r) return report(r.status());
    results->insert(results->end(), r->begin(), r->end());
  }
  std::optional<ChatResult> chat;
  if (bo->turns > 0) {
    auto r = measure_chat_turns(s, setup->chat_format, bo->turns);
    if (!r) return report(r.status());
    chat = *r;
  }

  // The peaks again after the tests (BenchProbes::probe_again); the peak
  // RSS is the tests', read first.
  const double rss_tests = peak_rss_mib();
  probes.probe_again();

  BenchReport rep(s, *setup, *bo, probes, n_threads);
  rep.rss = rss_tests;
  rep.results = std::move(*results);
  rep.spec = spec;
  rep.chat = chat;
  if (args->has("--json")) rep.print_json();
  else rep.print_table();
  return kExitOk;
}

}  // namespace phaselab::cli
