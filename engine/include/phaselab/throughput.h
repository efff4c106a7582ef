// Prefill (pp) and decode (tg) throughput, measured one way for every front
// end: phaselab-cli bench (llama-bench's pp512 / tg128, optionally "@ d2000"
// after tokens already in the cache) and the comparison (compare.h, whose tg
// decodes as the variant would: its KV cache and speculative settings).
//
// Each run starts from a cleared cache, fills it with the depth tokens
// (untimed, one prefill), then times the test. One untimed warm-up run comes
// first; the result is the mean and sample standard deviation of the timed
// runs' tokens/s.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <vector>

#include "phaselab/session.h"
#include "phaselab/status.h"

namespace phaselab {

enum class ThroughputTest {
  pp,  // the tokens in one prefill (no logits): tokens / time
  tg,  // decode: the tokens as single-token steps, or Session::generate (ThroughputRun::generate)
};

struct ThroughputRun {
  ThroughputTest test = ThroughputTest::pp;
  // pp: the prompt. tg: the tokens decoded one per step; with generate, the
  // prompt the answer follows.
  std::vector<int32_t> tokens;
  std::vector<int32_t> depth;  // in the cache before each run (untimed); empty: none
  int repetitions = 5;         // timed runs (after one warm-up)
  // tg only: generate with these options instead (greedy, the KV cache and
  // speculation as a variant decodes); each run's sample is the request's
  // decode_tps. null: bare single-token steps.
  const GenerateOptions* generate = nullptr;
  const std::atomic<bool>* cancel = nullptr;  // read before each run (and inside generate)
  std::function<void(int run)> on_run;        // before each run: 0 is the warm-up, then 1..repetitions
};

struct Throughput {
  double mean = 0, sd = 0;      // tokens/s; sd 0 for a single run
  std::vector<double> samples;  // one per timed run
  // tg with a draft (ThroughputRun::generate's draft), over the timed runs:
  // tokens drafted and accepted, target passes while decoding, and generated
  // tokens per target pass (0 without speculation).
  int spec_drafted = 0, spec_accepted = 0, target_passes = 0;
  double spec_acceptance = 0, tokens_per_pass = 0;
};

// cancelled() when cancel was set before a run; a failed evaluation's error
// otherwise.
Result<Throughput> measure_pp_tg(Session& session, const ThroughputRun& run);

// One test with the backend's CPU switches in two states, a and b
// (Backend::apply_cpu_switches), taken in turns within the same minutes so
// that a machine whose speed drifts (a shared VM) affects both alike: tg
// token by token (each run's sample for a state is its tokens over their
// time; the state of the first token swapped every run), pp run by run (the
// order swapped every repetition).
// The session's backend is left in state a. run.generate is not supported.
struct AbThroughput {
  Throughput a, b;
};
Result<AbThroughput> measure_ab(Session& session, const ThroughputRun& run, const CpuSwitches& a, const CpuSwitches& b);

}  // namespace phaselab
