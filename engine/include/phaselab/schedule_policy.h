// How the engine loop shares its passes between prompts (prefill) and
// running answers (decode): the serving policies of the Serving lab,
// `serve --policy` and `bench --serving`.
//
//   prefill-first      a waiting prompt is prefilled whole (in passes of the
//                      backend's batch size) before the decodes resume: the
//                      running streams stall for the whole prefill. The
//                      baseline that shows the problem.
//   chunked:N          at most N tokens per pass: every running stream's next
//                      token first, then chunks of the prompts with what the
//                      budget leaves (Sarathi-Serve, vLLM's chunked prefill).
//                      A stall is bounded by one pass of N tokens ("chunked":
//                      N = the backend's batch size).
//   chunked:auto       chunked, with the prompt tokens of a pass that also
//                      decodes chosen by time: at most what adds half a
//                      decode-only pass, as the loop measures its passes
//                      (Sarathi-Serve's budget from a latency target, found
//                      online instead of by profiling). A stall is then about
//                      1.5 decode gaps on any machine; prompts take longer.
//                      The server's default.
//   disaggregated:P+D  a prefill worker (its own backend, P threads, its own
//                      KV pool) computes each prompt and its first token, then
//                      hands the sequence to the decode worker (D threads):
//                      the K/V of the prompt are copied from the prefill
//                      pool into the decode pool (the "KV transfer", counted
//                      in bytes and time), as DistServe, Splitwise and NVIDIA
//                      Dynamo do between machines. Decodes never wait for a
//                      prefill; the cost is the copy and the cores the
//                      prefill worker holds. On the CPU each worker's threads
//                      are pinned to cores of their own (P, then D) where the
//                      machine allows it; with the CUDA backend the workers
//                      are two backends on two streams of the GPU.
#pragma once

#include <string>
#include <string_view>

#include "phaselab/status.h"

namespace phaselab {

struct SchedulePolicy {
  enum class Kind { prefill_first, chunked, disaggregated };
  Kind kind = Kind::chunked;
  int chunk_tokens = 0;                        // chunked: tokens per pass; <= 0: the backend's batch size
  bool timed = false;                          // chunked:auto (chunk_tokens 0)
  int prefill_threads = 1, decode_threads = 1;  // disaggregated: P and D

  // chunked:auto's share: prompt tokens beside decodes add at most this
  // fraction of a decode-only pass's time.
  static constexpr double kAutoPrefillShare = 0.5;

  // "prefill-first", "chunked", "chunked:256", "chunked:auto", "disaggregated:1+1": what
  // parse_schedule_policy reads back.
  std::string name() const;
  bool operator==(const SchedulePolicy&) const = default;
};

// Reads a policy's name; an error lists the forms.
Result<SchedulePolicy> parse_schedule_policy(std::string_view text);
extern const char* const kSchedulePolicyHelp;  // the forms, one line each, for --help texts

// What the disaggregated policy moved from the prefill worker to the decode
// worker: sequences handed over, K/V bytes copied, and the time the copies
// took (export on the prefill side plus import on the decode side).
struct KvTransferStats {
  uint64_t transfers = 0;
  uint64_t bytes = 0;
  double ms = 0;
};

}  // namespace phaselab
