// phaselab-cli serve: the OpenAI-compatible server on the continuous-batching
// scheduler. phaselab-cli loadtest: many concurrent clients against any
// OpenAI-compatible server (PhaseLab's, vLLM, SGLang, llama-server, Dynamo).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "cli_util.h"
#include "commands.h"
#include "engine_setup.h"
#include "phaselab/openai_server.h"
#include "phaselab/remote_client.h"
#include "phaselab/scheduler.h"
#include "phaselab/stats.h"

namespace phaselab::cli {

namespace {

std::atomic<bool> g_stop{false};
extern "C" void on_stop_signal(int) { g_stop.store(true); }

}  // namespace

int cmd_serve(int argc, char** argv) {
  std::vector<OptionSpec> opts = engine_options();
  opts.insert(opts.end(), {{"--host", "", true},
                           {"--port", "", true},
                           {"--parallel", "", true},
                           {"--api-key", "", true},
                           {"--cors", "", true},
                           {"--max-tokens", "", true},
                           {"--max-body", "", true},
                           {"--kv-size", "", true},
                           {"--model-id", "", true},
                           {"--policy", "", true},
                           {"--help", "-h", false}});
  auto args = Args::parse(argc, argv, opts);
  if (!args) return report(args.status());
  if (args->has("--help")) {
    std::printf(
        "usage: phaselab-cli serve -m MODEL [--host 127.0.0.1] [--port 8080] [--parallel N] [--api-key KEY]\n"
        "  An OpenAI-compatible server: GET /health, GET /v1/models, POST /v1/chat/completions,\n"
        "  POST /v1/completions (streamed with \"stream\": true, or not), GET /metrics (Prometheus).\n"
        "  Concurrent requests share forward passes (continuous batching). Ctrl+C stops it.\n"
        "      --host ADDR          address to listen on (default 127.0.0.1; any other needs --api-key)\n"
        "      --port N             port (default 8080; 0 picks a free one and prints it)\n"
        "      --parallel N         sequences in one forward pass at most (default 8)\n"
        "      --api-key KEY        clients must send 'Authorization: Bearer KEY' (or set PHASELAB_API_KEY)\n"
        "      --cors ORIGINS       browser origins allowed to call it, comma-separated (e.g.\n"
        "                           http://localhost:3000), or '*'; others are refused\n"
        "      --max-tokens N       largest max_tokens a request may ask for (default: the context)\n"
        "      --max-body BYTES     largest request body (default 4194304)\n"
        "      --kv-size N          positions in the KV pool all sequences share (default: the context x 2)\n"
        "      --model-id NAME      the model's name in /v1/models (default: the file's name)\n"
        "      --policy P           how passes are shared between prompts and decodes (default chunked:auto):\n"
        "%s%s",
        kSchedulePolicyHelp, kEngineHelp);
    return kExitOk;
  }
  if (!args->positional().empty()) return usage_error("unexpected argument '" + args->positional()[0] + "'");
  ServerOptions so;
  so.host = args->get_or("--host", "127.0.0.1");
  so.api_key = args->get_or("--api-key", std::getenv("PHASELAB_API_KEY") ? std::getenv("PHASELAB_API_KEY") : "");
  // Refuse an open bind before the model is loaded: the answer is immediate.
  if (Status st = check_bind(so.host, so.api_key); !st) return report(st);
  auto port = args->get_int("--port", 8080, 0, 65535);
  auto parallel = args->get_int("--parallel", 8, 1, 256);
  auto max_tokens = args->get_int("--max-tokens", 0, 0, 1 << 20);
  auto max_body = args->get_int("--max-body", 4 << 20, 1024, 1 << 30);
  auto ctx = args->get_int("--ctx-size", 0, 0, 1 << 20);
  auto kv_size = args->get_int("--kv-size", 0, 0, 1 << 24);
  for (const Status& st : {port.status(), parallel.status(), max_tokens.status(), max_body.status(), ctx.status(),
                           kv_size.status()})
    if (!st.is_ok()) return report(st);
  so.port = *port;
  so.max_tokens = *max_tokens;
  so.max_body_bytes = static_cast<size_t>(*max_body);
  so.model_id = args->get_or("--model-id", "");
  if (auto c = args->get("--cors")) so.cors_origins = split_commas(*c);

  auto policy = parse_schedule_policy(args->get_or("--policy", "chunked:auto"));
  if (!policy) return report(policy.status().with_context("--policy"));
  auto bo = backend_options_from_args(*args, std::max(64, *parallel));
  if (!bo) return report(bo.status());
  if (*parallel > bo->max_batch)
    return usage_error("--parallel " + std::to_string(*parallel) + " needs --batch-size of at least as many tokens");
  const auto model_path = args->get("--model");
  if (!model_path) return usage_error("no model given: pass -m MODEL.gguf (scripts/fetch-model.sh gets the default one)");
  auto model = Model::load(*model_path);
  if (!model) return report(model.status());
  set_model_batch(*args, **model, std::max(64, *parallel), &*bo);
  SchedulerOptions sched_opt;
  sched_opt.n_ctx = *ctx;
  sched_opt.max_seqs = *parallel;
  sched_opt.prefix_cache = !args->has("--no-prefix-cache");
  sched_opt.policy = *policy;
  auto kv_type = cache_type(*args);
  if (!kv_type) return report(kv_type.status());
  sched_opt.kv_type = *kv_type;
  // Room for two full-length sequences (or many short ones) unless told otherwise.
  if (*kv_size > 0) {
    sched_opt.kv_positions = *kv_size;
  } else {
    const int n_ctx = *ctx > 0 ? *ctx : std::min(4096, (*model)->config().n_ctx_train);
    sched_opt.kv_positions = 2 * n_ctx;
  }
  // The policy's backend(s): disaggregated:P+D makes a prefill and a decode worker.
  std::string fallback;
  auto sched = create_scheduler(std::move(*model), *bo, sched_opt, &fallback);
  if (!fallback.empty()) std::fprintf(stderr, "phaselab-cli: %s; using the CPU backend\n", fallback.c_str());
  if (!sched) return report(sched.status());
  const std::string backend_name = (*sched)->backend().name();
  const std::string placement = (*sched)->placement();
  const int n_ctx = (*sched)->n_ctx();
  const int kv_blocks = (*sched)->pool().n_blocks();
  auto server = OpenAiServer::create(std::move(*sched), so);
  if (!server) return report(server.status());
  // The stop handlers before the address is printed: a script that reads the
  // address and stops the server at once gets a clean stop, not a kill.
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);
  if (Status st = (*server)->start(); !st) return report(st);

  std::fprintf(stderr,
               "PhaseLab is serving %s at %s\n"
               "  %s backend, policy %s%s%s, up to %d sequences per pass, context %d, KV pool %d blocks of %d%s\n"
               "  try: curl %s/chat/completions -H 'Content-Type: application/json'%s -d '{\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}]}'\n"
               "  Ctrl+C stops.\n",
               (*server)->model_id().c_str(), (*server)->base_url().c_str(), backend_name.c_str(),
               policy->name().c_str(), placement.empty() ? "" : " (", placement.empty() ? "" : (placement + ")").c_str(),
               *parallel, n_ctx,
               kv_blocks, KvPool::kBlockTokens, so.api_key.empty() ? "" : ", API key required",
               (*server)->base_url().c_str(), so.api_key.empty() ? "" : " -H 'Authorization: Bearer KEY'");
  // The address on stdout alone, for scripts (with --port 0 it is the only way to learn the port).
  std::printf("%s\n", (*server)->base_url().c_str());
  std::fflush(stdout);
  while (!g_stop.load()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::fprintf(stderr, "phaselab-cli: stopping the server\n");
  (*server)->stop();
  return kExitOk;
}

namespace {

// What loadtest does: clients x requests streamed, greedy unless a
// temperature is given (then as an OpenAI client samples: temperature and
// top_p only, no top_k or min_p).
struct LoadPlan {
  RemoteEndpoint ep;
  std::string prompt;
  bool completions = false;  // /v1/completions instead of /v1/chat/completions
  int clients = 0, requests = 0, n_predict = 0;
  double temperature = 0, top_p = 1;
  bool ignore_eos = false;  // every answer max_tokens long (servers that read ignore_eos)
};

// What it measured.
struct LoadOutcome {
  struct Sample {
    double ttft_ms, tpot_ms, e2e_ms;
    int tokens;
  };
  std::vector<Sample> samples;
  std::vector<std::string> errors;
  double wall_s = 0;
};

// Every client on its own thread and connection, its requests one after
// another.
LoadOutcome run_load(const LoadPlan& plan) {
  LoadOutcome out;
  std::mutex mu;
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < plan.clients; c++) {
    threads.emplace_back([&, c] {
      auto client = RemoteClient::connect(plan.ep);
      if (!client) {
        std::lock_guard<std::mutex> lock(mu);
        for (int r = 0; r < plan.requests; r++) out.errors.push_back(client.status().message());
        return;
      }
      for (int r = 0; r < plan.requests; r++) {
        GenerateOptions opt;
        opt.n_predict = plan.n_predict;
        opt.ignore_eos = plan.ignore_eos;
        opt.sampling.temperature = static_cast<float>(plan.temperature);
        opt.sampling.top_p = static_cast<float>(plan.top_p);
        opt.sampling.top_k = 0;
        opt.sampling.min_p = 0;
        opt.sampling.seed = static_cast<uint64_t>(c) * 1000003u + static_cast<uint64_t>(r);
        const std::string text = plan.prompt + " (client " + std::to_string(c) + ", request " + std::to_string(r) + ")";
        const auto t_req = Clock::now();
        auto res = plan.completions ? (*client)->complete(text, opt, nullptr)
                                    : (*client)->chat({{"user", text}}, opt, nullptr);
        const double e2e = std::chrono::duration<double, std::milli>(Clock::now() - t_req).count();
        std::lock_guard<std::mutex> lock(mu);
        if (!res) {
          out.errors.push_back(res.status().message());
          continue;
        }
        const RequestMetrics& m = res->result.metrics;
        out.samples.push_back({m.ttft_ms, m.tpot_ms, e2e, m.n_generated});
      }
    });
  }
  for (auto& t : threads) t.join();
  out.wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
  return out;
}

// The figures, as text or (json) one JSON object.
void print_load_report(const LoadPlan& plan, const LoadOutcome& o, bool json) {
  std::vector<double> ttft, tpot, e2e;
  long long tokens = 0;
  for (const auto& s : o.samples) {
    ttft.push_back(s.ttft_ms);
    if (s.tokens > 1) tpot.push_back(s.tpot_ms);
    e2e.push_back(s.e2e_ms);
    tokens += s.tokens;
  }
  for (auto* v : {&ttft, &tpot, &e2e}) std::sort(v->begin(), v->end());
  const double tps = tokens / std::max(o.wall_s, 1e-9);
  const long long total = static_cast<long long>(plan.clients) * plan.requests;
  const RemoteEndpoint& ep = plan.ep;
  if (json) {
    nlohmann::json j = {{"url", ep.url},
                        {"model", ep.model},
                        {"clients", plan.clients},
                        {"requests_per_client", plan.requests},
                        {"max_tokens", plan.n_predict},
                        {"temperature", plan.temperature},
                        {"top_p", plan.top_p},
                        {"ignore_eos", plan.ignore_eos},
                        {"requests", total},
                        {"ok", o.samples.size()},
                        {"errors", o.errors.size()},
                        {"wall_s", o.wall_s},
                        {"generated_tokens", tokens},
                        {"tokens_per_s", tps},
                        {"ttft_ms", {{"p50", percentile(ttft, 0.5)}, {"p90", percentile(ttft, 0.90)}, {"p99", percentile(ttft, 0.99)}}},
                        {"tpot_ms", {{"p50", percentile(tpot, 0.5)}, {"p99", percentile(tpot, 0.99)}}},
                        {"e2e_ms", {{"p50", percentile(e2e, 0.5)}, {"p99", percentile(e2e, 0.99)}}}};
    if (!o.errors.empty()) j["first_error"] = o.errors.front();
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%s (%s): %d clients x %d requests, max_tokens %d, %s\n", ep.url.c_str(), ep.model.c_str(), plan.clients,
                plan.requests, plan.n_predict,
                plan.temperature > 0 ? ("temperature " + std::to_string(plan.temperature).substr(0, 4) + " top_p " +
                                        std::to_string(plan.top_p).substr(0, 4)).c_str()
                                     : "greedy");
    std::printf("  %zu ok, %zu errors in %.2f s; %lld tokens generated = %.1f tokens/s in all\n", o.samples.size(),
                o.errors.size(), o.wall_s, tokens, tps);
    std::printf("  TTFT ms   p50 %.1f  p90 %.1f  p99 %.1f\n", percentile(ttft, 0.5), percentile(ttft, 0.90),
                percentile(ttft, 0.99));
    std::printf("  TPOT ms   p50 %.2f  p99 %.2f\n", percentile(tpot, 0.5), percentile(tpot, 0.99));
    std::printf("  request   p50 %.1f ms  p99 %.1f ms\n", percentile(e2e, 0.5), percentile(e2e, 0.99));
    if (!o.errors.empty()) std::printf("  first error: %s\n", o.errors.front().c_str());
  }
}

}  // namespace

int cmd_loadtest(int argc, char** argv) {
  auto args = Args::parse(argc, argv,
                          {{"--url", "", true},
                           {"--api-key", "", true},
                           {"--model", "", true},
                           {"--clients", "", true},
                           {"--requests", "", true},
                           {"--n-predict", "-n", true},
                           {"--prompt", "-p", true},
                           {"--completions", "", false},
                           {"--temperature", "", true},
                           {"--top-p", "", true},
                           {"--ignore-eos", "", false},
                           {"--json", "", false},
                           {"--help", "-h", false}});
  if (!args) return report(args.status());
  if (args->has("--help")) {
    std::printf(
        "usage: phaselab-cli loadtest --url URL [--clients 32] [--requests 20] [-n 32] [--json]\n"
        "  Many concurrent clients against an OpenAI-compatible server (PhaseLab's, vLLM, SGLang, llama-server,\n"
        "  Dynamo): each client sends its requests one after another, streamed (greedy unless --temperature).\n"
        "  Reports errors, TTFT\n"
        "  (p50/p90/p99), time per output token and aggregate generated tokens/s, all measured here.\n"
        "      --url URL            the API's base (e.g. http://127.0.0.1:8080/v1)\n"
        "      --api-key KEY        sent as 'Authorization: Bearer KEY'\n"
        "      --model NAME         the model to ask for (default: the first the server lists)\n"
        "      --clients N          concurrent clients (default 32)\n"
        "      --requests N         requests per client (default 20)\n"
        "  -n, --n-predict N        max_tokens of each request (default 32)\n"
        "  -p, --prompt TEXT        the user message (each request adds its client and request number)\n"
        "      --completions        use /v1/completions instead of /v1/chat/completions\n"
        "      --temperature T      sample at temperature T (default 0: greedy), as an OpenAI client does:\n"
        "                           temperature and top_p only (each request its own seed)\n"
        "      --top-p P            nucleus sampling with --temperature (default 1: off)\n"
        "      --ignore-eos         ask for answers of exactly max_tokens (servers that read ignore_eos)\n"
        "      --json               one JSON object with every figure on stdout\n");
    return kExitOk;
  }
  const auto url = args->get("--url");
  if (!url) return usage_error("loadtest needs --url (the server's API base, e.g. http://127.0.0.1:8080/v1)");
  auto clients = args->get_int("--clients", 32, 1, 1024);
  auto requests = args->get_int("--requests", 20, 1, 100000);
  auto n_predict = args->get_int("--n-predict", 32, 1, 1 << 20);
  auto temperature = args->get_double("--temperature", 0, 0, 2);
  auto top_p = args->get_double("--top-p", 1, 0, 1);
  for (const Status& st : {clients.status(), requests.status(), n_predict.status(), temperature.status(), top_p.status()})
    if (!st.is_ok()) return report(st);
  if (*top_p <= 0) return usage_error("--top-p must be above 0 (1 turns it off)");
  if (args->has("--top-p") && *temperature <= 0)
    return usage_error("--top-p applies to sampling: give a --temperature above 0 too");
  RemoteEndpoint ep{*url, args->get_or("--api-key", ""), args->get_or("--model", ""), 600};
  auto probe = RemoteClient::connect(ep);
  if (!probe) return report(probe.status());
  ep.model = (*probe)->model();
  const std::string prompt = args->get_or("--prompt", "Tell me a short fact about the sea.");
  const bool completions = args->has("--completions");

  const LoadPlan plan{ep,      prompt, completions, *clients, *requests, *n_predict, *temperature, *top_p,
                      args->has("--ignore-eos")};
  const LoadOutcome outcome = run_load(plan);
  print_load_report(plan, outcome, args->has("--json"));
  return outcome.errors.empty() ? kExitOk : kExitFailure;
}

}  // namespace phaselab::cli
