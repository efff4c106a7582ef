// phaselab-cli bench --serving: chat streams decoding while long prompts
// arrive, under one or several scheduling policies in this process, or sent
// to an OpenAI-compatible server (--url). The engine's serving benchmark
// (phaselab/serving_bench.h, serving_http.h) does the work; this file reads
// the flags and prints the table or the JSON of docs/serving.md.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <fstream>
#include <thread>
#include <nlohmann/json.hpp>
#include <optional>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cli_util.h"
#include "commands.h"
#include "engine_setup.h"
#include "phaselab/machine.h"
#include "phaselab/serving_bench.h"
#include "phaselab/serving_http.h"

namespace phaselab::cli {

namespace {

// Set by SIGINT / SIGTERM, read between the scheduler's steps (a lock-free
// atomic store is safe in a signal handler).
std::atomic<bool> g_stop{false};
extern "C" void on_serving_stop_signal(int) { g_stop.store(true); }

const char* const kDefaultPolicies = "prefill-first,chunked:256,disaggregated:1+1";

}  // namespace

const std::vector<OptionSpec>& serving_bench_options() {
  static const std::vector<OptionSpec> opts = {
      {"--serving", "", false},     {"--policy", "", true},       {"--streams", "", true},
      {"--chat-prompt", "", true},  {"--chat-answer", "", true},  {"--long-prompt", "", true},
      {"--long-answer", "", true},  {"--long-count", "", true},   {"--long-rate", "", true},
      {"--long-start", "", true},   {"--duration", "", true},     {"--seed", "", true},
      {"--no-baseline", "", false}, {"--repeat", "", true},       {"--ttft-target", "", true},
      {"--itl-target", "", true},   {"--prompts", "", true},      {"--url", "", true},
      {"--api-key", "", true},      {"--model-id", "", true},     {"--progress-json", "", false}};
  return opts;
}

const char* const kServingBenchHelp[2] = {
    "  --serving: chat streams decoding while long-document prompts arrive, under each scheduling policy\n"
    "  (in this process) or against an OpenAI-compatible server (--url): TTFT, every inter-token gap\n"
    "  (ITL) of the chat streams, the longest stall, tokens/s, goodput at the targets, KV transferred.\n"
    "      --policy LIST        policies run one after another (default prefill-first,chunked:256,\n"
    "                           disaggregated:1+1):\n",
    "      --streams N          chat streams, each sending its next request when one ends (default 4)\n"
    "      --chat-prompt N      tokens of a chat prompt (default 32)   --chat-answer N (default 128)\n"
    "      --long-prompt N      tokens of a long-document prompt (default 2000)   --long-answer N (default 16)\n"
    "      --long-count N       long requests (default 1)   --long-start S: when the first arrives (default 2)\n"
    "      --long-rate R        then R per second, Poisson (seeded); 0: all at --long-start (default 0)\n"
    "      --duration S         run at least S seconds (default 0: until the long requests are done)\n"
    "      --seed N             prompts and arrivals (default 1)\n"
    "      --no-baseline        no first run without long prompts (the ITL the others compare with)\n"
    "      --repeat R           the policy list R times, alternating (default 1)\n"
    "      --ttft-target MS     goodput: TTFT at most MS (default 5000)   --itl-target MS: every gap (250)\n"
    "      --prompts FILE       JSONL prompts, {\"prompt\": \"...\", \"kind\": \"chat\"|\"long\"}, instead of generated ones\n"
    "      --url URL            send the workload to an OpenAI-compatible server (PhaseLab serve, llama-server,\n"
    "                           vLLM, Dynamo) instead; -m then only counts prompt tokens (without it: words)\n"
    "      --api-key KEY        for --url   --model-id NAME: the model to ask for (default: the first listed)\n"
    "      --json               one JSON object (docs/serving.md)   --progress-json: progress lines on stderr\n"
    "  Defaults here: --ctx-size 4096 (or the model's trained context when shorter), --batch-size 256.\n"};

namespace {

Result<ServingWorkload> read_workload(const Args& a) {
  ServingWorkload w;
  auto streams = a.get_int("--streams", 4, 0, 256);
  auto cp = a.get_int("--chat-prompt", 32, 1, 1 << 20);
  auto ca = a.get_int("--chat-answer", 128, 1, 1 << 20);
  auto lp = a.get_int("--long-prompt", 2000, 1, 1 << 20);
  auto la = a.get_int("--long-answer", 16, 1, 1 << 20);
  auto lc = a.get_int("--long-count", 1, 0, 10000);
  auto seed = a.get_int("--seed", 1, 0, 1 << 30);
  for (const Status& st : {streams.status(), cp.status(), ca.status(), lp.status(), la.status(), lc.status(), seed.status()})
    PHASELAB_TRY(st);
  auto rate = a.get_double("--long-rate", 0, 0, 1000);
  auto start = a.get_double("--long-start", 2, 0, 86400);
  auto duration = a.get_double("--duration", 0, 0, 86400);
  for (const Status& st : {rate.status(), start.status(), duration.status()}) PHASELAB_TRY(st);
  w.streams = *streams, w.chat_prompt = *cp, w.chat_answer = *ca, w.long_prompt = *lp, w.long_answer = *la;
  w.long_count = *lc, w.seed = static_cast<uint64_t>(*seed);
  w.long_rate = *rate, w.long_start_s = *start, w.duration_s = *duration;
  w.baseline = !a.has("--no-baseline");
  PHASELAB_TRY(validate_workload(w));
  return w;
}

Result<std::vector<SchedulePolicy>> read_policies(const Args& a) {
  std::vector<SchedulePolicy> out;
  for (const std::string& name : split_commas(a.get_or("--policy", kDefaultPolicies))) {
    auto p = parse_schedule_policy(name);
    if (!p) return p.status().with_context("--policy");
    out.push_back(*p);
  }
  if (out.empty()) return invalid_argument("--policy names no policy (e.g. --policy chunked:256)");
  return out;
}

// Where the runs go: this process's engine, or a server.
struct ServingTarget {
  std::shared_ptr<Model> model;  // null: --url without -m
  InProcessTarget in_process;
  std::optional<RemoteEndpoint> url;
};

Result<ServingTarget> open_target(const Args& a, ServingReport* rep) {
  ServingTarget t;
  if (auto path = a.get("--model")) {
    auto m = Model::load(*path);
    if (!m) return m.status();
    t.model = std::move(*m);
    const std::string p = t.model->path();
    rep->model = p.substr(p.find_last_of('/') + 1);
  }
  if (auto url = a.get("--url")) {
    t.url = RemoteEndpoint{*url, a.get_or("--api-key", ""), a.get_or("--model-id", ""), 600};
    auto probe = RemoteClient::connect(*t.url);
    if (!probe) return probe.status();
    rep->model = (*probe)->model();
    rep->backend = "remote";
    return t;
  }
  if (!t.model) return invalid_argument("no model given: pass -m MODEL.gguf (or --url to measure a server)");
  auto threads = a.get_int("--threads", default_threads(), 1, 256);
  auto batch = a.get_int("--batch-size", 256, 1, 4096);
  // 4096 (a long prompt of 2000 and more), or the model's trained context when shorter.
  auto ctx = a.get_int("--ctx-size", std::min(4096, t.model->config().n_ctx_train), 64, 1 << 20);
  for (const Status& st : {threads.status(), batch.status(), ctx.status()}) PHASELAB_TRY(st);
  warn_if_oversubscribed(*threads);
  auto kind = parse_backend_kind(a.get_or("--backend", "cpu"));
  if (!kind) return kind.status();
  auto kv = cache_type(a);
  if (!kv) return kv.status();
  BackendOptions bo = backend_options_from_environment();
  bo.kind = *kind;
  bo.n_threads = *threads;
  bo.max_batch = *batch;
  t.in_process = {t.model, bo, *ctx, *kv};
  rep->threads = *threads;
  rep->backend = a.get_or("--backend", "cpu");
  if (*kind == BackendKind::cpu) rep->backend += " (" + cpu_kernels_isa(bo.cpu.isa_cap) + ")";
  return t;
}

// /proc/cpuinfo's "model name" (the CPU the figures belong to), or "CPU".
std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      const size_t v = line.find_first_not_of(" \t", line.find(':') + 1);
      return v == std::string::npos ? "CPU" : line.substr(v);
    }
  return "CPU";
}

void print_table(const ServingReport& rep, bool url) {
  const ServingWorkload& w = rep.workload;
  std::printf("serving benchmark: %s, %s, %d threads\n", rep.model.c_str(), rep.backend.c_str(), rep.threads);
  std::printf("workload: %d chat streams (prompt %d, answer %d tokens), %d long request(s) of %d tokens (answer %d) "
              "from %.2f s%s; targets TTFT %.0f ms, ITL %.0f ms\n\n",
              w.streams, w.chat_prompt, w.chat_answer, w.long_count, w.long_prompt, w.long_answer, w.long_start_s,
              w.long_rate > 0 ? (", " + std::to_string(w.long_rate).substr(0, 5) + " per s").c_str() : "",
              rep.targets.ttft_ms, rep.targets.itl_ms);
  std::printf("%s", serving_table_header().c_str());
  for (const ServingRow& row : rep.rows) std::printf("%s", serving_table_line(row, rep.targets).c_str());
  for (const ServingRow& row : rep.rows)
    if (!row.placement.empty()) {
      std::printf("\n%s: %s\n", row.policy.c_str(), row.placement.c_str());
      break;
    }
  std::printf("\nITL: every gap between two tokens of the chat streams; max stall: the longest; goodput: requests "
              "with TTFT <= %.0f ms and every gap <= %.0f ms, per second of the run and as a share of its requests.\n",
              rep.targets.ttft_ms, rep.targets.itl_ms);
  if (!url) {
    std::printf("machine: %s, %d physical cores (%u logical), %zu MiB last-level cache, kernels %s\n",
                cpu_model_name().c_str(), physical_core_count(), std::thread::hardware_concurrency(),
                last_level_cache_bytes() >> 20, cpu_kernels_isa().c_str());
  }
}

}  // namespace

int bench_serving(const Args& args) {
  const bool progress_json = args.has("--progress-json");
  const auto fail = [&](const Status& st) {
    if (progress_json) {
      nlohmann::json j = {{"error", st.message()}};
      std::fprintf(stderr, "%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    }
    return report(st);
  };
  auto workload = read_workload(args);
  if (!workload) return fail(workload.status());
  auto policies = read_policies(args);
  if (!policies) return fail(policies.status());
  auto repeat = args.get_int("--repeat", 1, 1, 100);
  auto ttft = args.get_double("--ttft-target", 5000, 0, 1e9);
  auto itl = args.get_double("--itl-target", 250, 0, 1e9);
  for (const Status& st : {repeat.status(), ttft.status(), itl.status()})
    if (!st.is_ok()) return fail(st);
  std::vector<FilePrompt> file;
  if (auto f = args.get("--prompts")) {
    auto read = read_prompts_jsonl(*f);
    if (!read) return fail(read.status());
    file = std::move(*read);
  }
  ServingReport rep;
  rep.workload = *workload;
  rep.targets = {*ttft, *itl};
  auto target = open_target(args, &rep);
  if (!target) return fail(target.status());
  const PromptSource prompts(target->model ? &target->model->tokenizer() : nullptr, *workload, std::move(file));
  // Against a server the policy is the server's: the runs are the URL's.
  const std::vector<ServingRun> runs =
      plan_serving_runs(*workload, target->url ? std::vector<SchedulePolicy>{SchedulePolicy{}} : *policies, *repeat);

  const bool tty = !progress_json && isatty(STDERR_FILENO);
  g_stop.store(false);
  std::signal(SIGINT, on_serving_stop_signal);
  std::signal(SIGTERM, on_serving_stop_signal);
  for (size_t i = 0; i < runs.size(); i++) {
    const std::string label = target->url && runs[i].label == runs[i].policy.name() ? target->url->url : runs[i].label;
    const auto progress = [&](const ServingProgress& p) {
      ServingProgress full = p;
      full.run = static_cast<int>(i) + 1, full.of = static_cast<int>(runs.size()), full.label = label;
      if (progress_json) std::fprintf(stderr, "%s\n", serving_progress_json(full).c_str());
      else if (tty)
        std::fprintf(stderr, "\r\033[K[%d/%d] %s: %.1f s, %d requests done", full.run, full.of, label.c_str(),
                     full.elapsed_s, full.requests_done);
      std::fflush(stderr);
    };
    progress({0, 0, "", 0, 0});
    auto row = target->url ? run_serving_http(*target->url, runs[i], prompts, progress, &g_stop)
                           : run_serving_in_process(target->in_process, runs[i], prompts, progress, &g_stop);
    if (!row) {
      if (tty) std::fputs("\n", stderr);
      return fail(row.status());
    }
    rep.rows.push_back(std::move(*row));
  }
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  if (tty) std::fputs("\r\033[K", stderr);
  if (progress_json) std::fprintf(stderr, "{\"done\": true}\n");
  if (args.has("--json")) std::printf("%s\n", serving_report_json(rep, 2).c_str());
  else print_table(rep, target->url.has_value());
  return kExitOk;
}

}  // namespace phaselab::cli
