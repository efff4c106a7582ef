// The serving benchmark (`phaselab-cli bench --serving`, the Serving lab):
// chat streams decoding while long-document prompts arrive, run under one or
// several scheduling policies (schedule_policy.h), measured per token.
//
//   workload   `streams` chat streams are closed loops: each sends its next
//              request (chat_prompt tokens, chat_answer tokens of answer)
//              when its previous one ends, from t = 0. Long-document requests
//              (long_prompt tokens, long_answer of answer) arrive from
//              long_start_s on as a Poisson process of long_rate per second
//              (seeded) until long_count have arrived; long_rate 0: all of
//              them at long_start_s. The run ends once every long request is
//              done, every stream has finished a request, and duration_s has
//              passed: the streams then send nothing new and their running
//              requests finish. Answers have fixed lengths (ignore_eos,
//              greedy). Prompts are distinct (a seeded generator, or a JSONL
//              file), so prefix caching cannot flatter a policy.
//   figures    TTFT of every request (and of the long ones alone), ITL over
//              every gap of every chat stream's answers, TPOT per request,
//              the longest gap (max stall), generated tokens / run time, and
//              goodput: the requests whose TTFT <= the TTFT target and whose
//              every gap <= the ITL target, per second and as a fraction.
//   output     the JSON contract of docs/serving.md (serving_report_json).
//
// The in-process driver (run_serving_in_process) is here; the same workload
// over HTTP against any OpenAI-compatible server is phaselab/serving_http.h.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "phaselab/backend.h"
#include "phaselab/kv_cache.h"
#include "phaselab/model.h"
#include "phaselab/schedule_policy.h"
#include "phaselab/session.h"
#include "phaselab/status.h"

namespace phaselab {

class Tokenizer;

struct ServingWorkload {
  int streams = 4;
  int chat_prompt = 32, chat_answer = 128;
  int long_prompt = 2000, long_answer = 16;
  int long_count = 1;
  double long_rate = 0;  // long requests per second after the first; 0: all at long_start_s
  double long_start_s = 2;
  double duration_s = 0;  // the run lasts at least this long (0: until the long requests are done)
  uint64_t seed = 1;
  bool baseline = true;  // a first run without long requests
  // Which set of generated prompts (the arrivals stay the seed's): the runs
  // of one plan each have their own, so that a server's prefix cache never
  // meets a prompt a former run sent (plan_serving_runs sets it).
  int prompt_set = 0;
};

struct ServingTargets {
  double ttft_ms = 5000, itl_ms = 250;
};

// What is wrong with a workload (a count out of range), or ok.
Status validate_workload(const ServingWorkload& w);

// When the long requests arrive, in seconds since the run started: the same
// for the same workload (its seed).
std::vector<double> long_arrivals_s(const ServingWorkload& w);

enum class ServingKind { chat, long_doc };
const char* to_string(ServingKind k);  // "chat", "long"

struct ServingPrompt {
  std::vector<int32_t> tokens;  // with the model's BOS when it adds one; empty without a tokenizer
  std::string text;             // what an HTTP request sends
};

// A prompt of a JSONL file: {"prompt": "...", "kind": "chat" | "long"}
// ("kind" optional: chat).
struct FilePrompt {
  std::string text;
  ServingKind kind = ServingKind::chat;
};
// Reads a JSONL file of prompts; an error names the line.
Result<std::vector<FilePrompt>> read_prompts_jsonl(const std::string& path);

// The prompts of a workload. Generated: ordinary English words chosen by a
// generator seeded from (seed, kind, stream, index), tokenized and cut to
// exactly the asked token count (BOS included); distinct for distinct
// requests. Without a tokenizer (HTTP without a local model) the text has
// that many words, about a token each. From a file: the file's prompts of
// the kind in order (again from the first when they run out: they then
// repeat, and a prefix cache sees it); generated ones where the file has
// none of a kind.
class PromptSource {
 public:
  PromptSource(const Tokenizer* tokenizer, ServingWorkload w, std::vector<FilePrompt> file = {});
  ServingPrompt prompt(ServingKind kind, int stream, int index) const;
  // The same source for one run of a plan: its generated prompts are the
  // set run.workload.prompt_set names (file prompts stay the file's).
  PromptSource for_run(const ServingWorkload& run) const;

 private:
  ServingPrompt generated(ServingKind kind, int stream, int index) const;
  const Tokenizer* tok_;
  ServingWorkload w_;
  std::vector<FilePrompt> chat_file_, long_file_;
};

// A request's options: its answer length (chat_answer or long_answer), run
// to the end whatever the model says (ignore_eos), greedy.
GenerateOptions serving_generate_options(const ServingWorkload& w, ServingKind kind);

// One request as the benchmark saw it; times in ms since the run started.
struct RequestTrace {
  int stream = 0;  // chat: 0..streams-1; long request k: streams + k
  ServingKind kind = ServingKind::chat;
  double arrive_ms = 0;  // when it was submitted
  int n_prompt = 0;
  std::vector<double> token_ms;  // when each generated token (or streamed piece) arrived
  int tokens = 0;                // generated tokens (a server's usage count where it gives one)
  bool ok = false;
  std::string error;
  double ttft_ms() const { return token_ms.empty() ? 0 : token_ms.front() - arrive_ms; }
};

// ---- Statistics (pure functions) ----

struct LatencySummary {
  size_t n = 0;
  double p50 = 0, p90 = 0, p99 = 0, max = 0, mean = 0;
};
// Percentiles as phaselab/stats.h's percentile(); all zero for no values.
LatencySummary summarize(std::vector<double> values);
// The gaps between consecutive tokens of each request's answer.
std::vector<double> token_gaps(const RequestTrace& r);
// Every gap of every ok chat request (what ITL and the max stall are of).
std::vector<double> chat_gaps(const std::vector<RequestTrace>& rs);
// TTFT of every ok request, or of those of one kind.
std::vector<double> ttfts(const std::vector<RequestTrace>& rs);
std::vector<double> ttfts(const std::vector<RequestTrace>& rs, ServingKind kind);
// (last - first token) / (tokens - 1) of each ok request of 2 tokens or more.
std::vector<double> tpots(const std::vector<RequestTrace>& rs);
// Whether a request meets both targets: ok, TTFT <= ttft_ms, every gap <= itl_ms.
bool meets_targets(const RequestTrace& r, const ServingTargets& t);
struct Goodput {
  int met = 0;
  double per_s = 0;     // met / duration_s
  double fraction = 0;  // met / requests
};
Goodput goodput(const std::vector<RequestTrace>& rs, const ServingTargets& t, double duration_s);

// ---- Runs ----

struct ServingRow {
  std::string policy;     // the policy's name, or the URL for an HTTP run
  std::string label;      // the policy, or "baseline (no long prompt)"
  std::string target;     // "in-process" or the URL
  std::string placement;  // Scheduler::placement()
  double duration_s = 0;
  std::vector<RequestTrace> requests;  // in arrival order
  KvTransferStats kv_transfer;
};

// One run of the plan: a policy (or a URL) and its workload (the baseline's
// has no long requests).
struct ServingRun {
  SchedulePolicy policy;
  std::string label;
  ServingWorkload workload;
};
// The runs in order: the baseline (the first policy, no long requests) when
// the workload asks for it, then the policies `repeat` times, alternating.
// Each run has prompts of its own (prompt_set: its index), the same lengths
// and arrival times.
std::vector<ServingRun> plan_serving_runs(const ServingWorkload& w, const std::vector<SchedulePolicy>& policies,
                                          int repeat);

struct ServingProgress {
  int run = 0, of = 0;  // 1-based
  std::string label;
  double elapsed_s = 0;
  int requests_done = 0;
};
using ServingProgressFn = std::function<void(const ServingProgress&)>;

// The in-process engine a run creates its scheduler on.
struct InProcessTarget {
  std::shared_ptr<const Model> model;
  BackendOptions backend;  // kind, threads (split P+D by disaggregated:P+D), batch size
  int n_ctx = 4096;
  KvType kv_type = KvType::f16;
};
// Runs one run on a new scheduler of its policy (create_scheduler), from
// one thread that submits at the arrival times and steps. cancel is read
// between steps: the run then ends with a cancelled error.
Result<ServingRow> run_serving_in_process(const InProcessTarget& target, const ServingRun& run,
                                          const PromptSource& prompts, const ServingProgressFn& progress = {},
                                          const std::atomic<bool>* cancel = nullptr);

// The whole benchmark report, as the JSON contract lays it out.
struct ServingReport {
  std::string model, backend;
  int threads = 0;
  ServingWorkload workload;
  ServingTargets targets;
  std::vector<ServingRow> rows;
};
// indent < 0: compact.
std::string serving_report_json(const ServingReport& r, int indent = -1);
// A row's figures as one line of the readable table (and its header).
std::string serving_table_header();
std::string serving_table_line(const ServingRow& row, const ServingTargets& t);
// {"progress": {...}}, one line.
std::string serving_progress_json(const ServingProgress& p);

}  // namespace phaselab
