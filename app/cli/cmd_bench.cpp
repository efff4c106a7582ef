// phaselab-cli bench: llama-bench style throughput. pp<N>: prefill of N prompt
// tokens from an empty cache; tg<N>: N decode steps of one token each from an
// empty cache. One warm-up run, then mean and standard deviation of tokens/s
// over the repeats.
#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>

#include "cli_util.h"
#include "commands.h"
#include "engine_setup.h"
#include "phaselab/session.h"

namespace phaselab::cli {

namespace {

struct BenchResult {
  std::string test;
  int n_prompt = 0, n_gen = 0;
  double mean = 0, sd = 0;
  std::vector<double> samples;
};

double peak_rss_mib() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1024.0;  // Linux reports KiB
}

Result<double> run_once(Session& s, const std::vector<int32_t>& tokens, bool decode) {
  s.kv().clear();
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<float>* no_logits = nullptr;
  if (decode) {
    std::vector<int32_t> one(1);
    for (int32_t t : tokens) {
      one[0] = t;
      PHASELAB_TRY(s.eval(one, no_logits));
    }
  } else {
    PHASELAB_TRY(s.eval(tokens, no_logits));
  }
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return static_cast<double>(tokens.size()) / sec;
}

}  // namespace

int cmd_bench(int argc, char** argv) {
  auto args = Args::parse(argc, argv,
                          {{"--model", "-m", true},      {"--n-prompt", "-p", true}, {"--n-gen", "-n", true},
                           {"--repetitions", "-r", true}, {"--threads", "-t", true}, {"--backend", "", true},
                           {"--batch-size", "-b", true},  {"--ctx-size", "-c", true}, {"--json", "", false},
                           {"--help", "-h", false}});
  if (!args) return report(args.status());
  if (args->has("--help")) {
    std::printf("usage: phaselab-cli bench -m MODEL [-p 512] [-n 128] [-r 5] [-t N] [--backend cpu] [--json]\n"
                "  pp<N>: prefill of N tokens; tg<N>: N single-token decode steps; -p 0 or -n 0 skips a test\n");
    return kExitOk;
  }
  auto n_prompt = args->get_int("--n-prompt", 512, 0, 1 << 16);
  auto n_gen = args->get_int("--n-gen", 128, 0, 1 << 16);
  auto reps = args->get_int("--repetitions", 5, 1, 1000);
  for (const Status& st : {n_prompt.status(), n_gen.status(), reps.status()})
    if (!st.is_ok()) return report(st);
  if (*n_prompt == 0 && *n_gen == 0) return usage_error("nothing to measure: -p and -n are both 0");
  // The context holds the longest test (unless --ctx-size says otherwise).
  auto setup = open_session(*args, std::max(*n_prompt, *n_gen));
  if (!setup) return report(setup.status());
  Session& s = *setup->session;
  const int need = std::max(*n_prompt, *n_gen);
  if (need > s.n_ctx())
    return usage_error("the test needs " + std::to_string(need) + " tokens of context but the session has " +
                       std::to_string(s.n_ctx()) + ": pass --ctx-size");

  // Random tokens (fixed seed) avoid special-casing any text.
  std::mt19937 rng(42);
  std::uniform_int_distribution<int32_t> pick(0, s.model().config().n_vocab - 1);
  std::vector<BenchResult> results;
  for (int phase = 0; phase < 2; phase++) {
    const bool decode = phase == 1;
    const int n = decode ? *n_gen : *n_prompt;
    if (n == 0) continue;
    std::vector<int32_t> tokens(n);
    for (auto& t : tokens) t = pick(rng);
    BenchResult r;
    r.test = (decode ? "tg" : "pp") + std::to_string(n);
    r.n_prompt = decode ? 0 : n;
    r.n_gen = decode ? n : 0;
    auto warm = run_once(s, tokens, decode);
    if (!warm) return report(warm.status());
    for (int i = 0; i < *reps; i++) {
      auto tps = run_once(s, tokens, decode);
      if (!tps) return report(tps.status());
      r.samples.push_back(*tps);
    }
    double sum = 0, sq = 0;
    for (double x : r.samples) sum += x;
    r.mean = sum / r.samples.size();
    for (double x : r.samples) sq += (x - r.mean) * (x - r.mean);
    r.sd = r.samples.size() > 1 ? std::sqrt(sq / (r.samples.size() - 1)) : 0;
    results.push_back(r);
  }

  const Model& m = s.model();
  const double size_mib = m.file().file_size() / 1048576.0;
  const std::string backend = s.backend().name();
  const int threads = *args->get_int("--threads", default_threads(), 1, 256);
  const double rss = peak_rss_mib();
  if (args->has("--json")) {
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& r : results)
      arr.push_back({{"test", r.test},
                     {"n_prompt", r.n_prompt},
                     {"n_gen", r.n_gen},
                     {"tokens_per_s", r.mean},
                     {"tokens_per_s_sd", r.sd},
                     {"samples", r.samples},
                     {"repetitions", *reps},
                     {"backend", backend},
                     {"threads", threads},
                     {"model", m.path()},
                     {"model_size_mib", size_mib},
                     {"n_params", [&] {
                        uint64_t n = 0;
                        for (const auto& t : m.file().tensors()) n += t.n_elements;
                        return n;
                      }()},
                     {"type_mix", m.type_mix()},
                     {"kv_cache_mib", s.kv().bytes() / 1048576.0},
                     {"peak_rss_mib", rss}});
    std::printf("%s\n", arr.dump(2).c_str());
    return kExitOk;
  }
  std::printf("| model | size | type mix | backend | threads | test | t/s |\n");
  std::printf("| --- | ---: | --- | --- | ---: | ---: | ---: |\n");
  for (const auto& r : results)
    std::printf("| %s | %.2f MiB | %s | %s | %d | %s | %.2f ± %.2f |\n", m.config().name.empty() ? m.config().arch_str.c_str() : m.config().name.c_str(),
                size_mib, m.type_mix().c_str(), backend.c_str(), threads, r.test.c_str(), r.mean, r.sd);
  std::printf("\npeak RSS %.1f MiB (model file %.1f MiB, KV cache %.1f MiB)\n", rss, size_mib, s.kv().bytes() / 1048576.0);
  return kExitOk;
}

}  // namespace phaselab::cli
