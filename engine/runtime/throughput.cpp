#include "phaselab/throughput.h"

#include <chrono>
#include <cmath>

namespace phaselab {

namespace {

struct OneRun {
  double tps = 0;
  int drafted = 0, accepted = 0, passes = 0, generated = 0;  // generate only: speculation's counts, tokens after the first
};

// The cache cleared and filled with the run's depth tokens (untimed).
Status start_run(Session& s, const ThroughputRun& run) {
  s.kv().clear();
  std::vector<float>* no_logits = nullptr;
  if (!run.depth.empty()) PHASELAB_TRY(s.eval(run.depth, no_logits));
  return Status::ok();
}

// Mean and sample standard deviation of t's samples.
void finish(Throughput& t) {
  double sum = 0, sq = 0;
  for (double x : t.samples) sum += x;
  t.mean = t.samples.empty() ? 0 : sum / t.samples.size();
  for (double x : t.samples) sq += (x - t.mean) * (x - t.mean);
  t.sd = t.samples.size() > 1 ? std::sqrt(sq / (t.samples.size() - 1)) : 0;
}

// One run's tokens/s: the cache cleared and filled with the depth tokens,
// then the test's tokens timed.
Result<OneRun> run_once(Session& s, const ThroughputRun& run) {
  PHASELAB_TRY(start_run(s, run));
  std::vector<float>* no_logits = nullptr;
  if (run.test == ThroughputTest::tg && run.generate) {
    auto r = s.generate(run.tokens, *run.generate, {}, run.cancel);
    if (!r) return r.status();
    const auto& m = r->metrics;
    return OneRun{m.decode_tps, m.spec_drafted, m.spec_accepted, m.target_passes, m.n_generated - 1};  // the first came from the prefill
  }
  const auto t0 = std::chrono::steady_clock::now();
  if (run.test == ThroughputTest::tg) {
    std::vector<int32_t> one(1);
    for (int32_t t : run.tokens) {
      one[0] = t;
      PHASELAB_TRY(s.eval(one, no_logits));
    }
  } else {
    PHASELAB_TRY(s.eval(run.tokens, no_logits));
  }
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return OneRun{static_cast<double>(run.tokens.size()) / sec};
}

}  // namespace

Result<Throughput> measure_pp_tg(Session& session, const ThroughputRun& run) {
  if (run.repetitions < 1) return invalid_argument("a throughput test needs at least one timed run");
  if (run.tokens.empty()) return invalid_argument("a throughput test needs tokens to run");
  Throughput out;
  int64_t generated = 0;
  for (int i = 0; i <= run.repetitions; i++) {  // i = 0: the warm-up
    if (run.cancel && run.cancel->load()) return cancelled("measurement cancelled");
    if (run.on_run) run.on_run(i);
    auto one = run_once(session, run);
    if (!one) return one.status();
    if (i == 0) continue;
    out.samples.push_back(one->tps);
    out.spec_drafted += one->drafted;
    out.spec_accepted += one->accepted;
    out.target_passes += one->passes;
    generated += one->generated;
  }
  if (out.spec_drafted > 0) out.spec_acceptance = static_cast<double>(out.spec_accepted) / out.spec_drafted;
  if (out.spec_drafted > 0 && out.target_passes > 0)
    out.tokens_per_pass = static_cast<double>(generated) / out.target_passes;
  finish(out);
  return out;
}

Result<AbThroughput> measure_ab(Session& s, const ThroughputRun& run, const CpuSwitches& a, const CpuSwitches& b) {
  if (run.repetitions < 1) return invalid_argument("a throughput test needs at least one timed run");
  if (run.tokens.empty()) return invalid_argument("a throughput test needs tokens to run");
  if (run.generate) return invalid_argument("an A/B measurement times bare passes, not generate");
  if (run.test == ThroughputTest::tg && run.tokens.size() < 2)
    return invalid_argument("an A/B measurement of decode needs at least 2 tokens (one in each state): raise -n");
  Backend& be = s.backend();
  const CpuSwitches* state[2] = {&a, &b};
  if (!be.apply_cpu_switches(a))
    return unsupported(be.name() + " backend: no switches to alternate (an A/B measurement needs the CPU backend's fast kernels)");
  AbThroughput out;
  Throughput* result[2] = {&out.a, &out.b};
  std::vector<float>* no_logits = nullptr;
  for (int i = 0; i <= run.repetitions; i++) {  // i = 0: the warm-up
    if (run.cancel && run.cancel->load()) {
      be.apply_cpu_switches(a);
      return cancelled("measurement cancelled");
    }
    if (run.on_run) run.on_run(i);
    double sec[2] = {0, 0};
    int n[2] = {0, 0};
    Status st = Status::ok();
    if (run.test == ThroughputTest::tg) {
      st = start_run(s, run);
      std::vector<int32_t> one(1);
      for (size_t k = 0; st && k < run.tokens.size(); k++) {
        const int which = static_cast<int>((k + i) % 2);  // each run starts with the other state
        be.apply_cpu_switches(*state[which]);
        one[0] = run.tokens[k];
        const auto t0 = std::chrono::steady_clock::now();
        st = s.eval(one, no_logits);
        sec[which] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        n[which]++;
      }
    } else {
      for (int k = 0; st && k < 2; k++) {
        const int which = (k + i) % 2;
        be.apply_cpu_switches(*state[which]);
        st = start_run(s, run);
        if (!st) break;
        const auto t0 = std::chrono::steady_clock::now();
        st = s.eval(run.tokens, no_logits);
        sec[which] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        n[which] += static_cast<int>(run.tokens.size());
      }
    }
    be.apply_cpu_switches(a);
    if (!st) return st;
    if (i == 0) continue;
    if (n[0] == 0 || n[1] == 0 || sec[0] <= 0 || sec[1] <= 0) continue;  // (a run's two samples stay paired)
    for (int w = 0; w < 2; w++) result[w]->samples.push_back(n[w] / sec[w]);
  }
  finish(out.a);
  finish(out.b);
  return out;
}

}  // namespace phaselab
