// phaselab-cli batch: offline batch inference through the continuous-batching
// scheduler. One JSON object per input line ({"prompt": ...} or {"messages":
// [...]}, with "n"), one per output line in input order.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli_util.h"
#include "commands.h"
#include "engine_setup.h"
#include "phaselab/chat_template.h"
#include "phaselab/openai_api.h"
#include "phaselab/scheduler.h"

namespace phaselab::cli {

namespace {

struct Line {
  int number = 0;  // 1-based, for messages
  BatchRequest req;
  std::string error;  // a bad line: why
};

// One input line -> a request, read by the server's own parser in batch's
// dialect (the command line's flags are the defaults, "n" is the token
// limit), so that a line is checked as a request to the server is; the
// error names the field.
std::string parse_line(const std::string& text, const Tokenizer& tok, ChatTemplateFamily family,
                       const openai::ApiLimits& limits, const openai::RequestDefaults& defaults, BatchRequest* out) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return std::string("not JSON: ") + e.what();
  }
  if (!j.is_object()) return "not a JSON object";
  const bool has_prompt = j.contains("prompt"), has_messages = j.contains("messages");
  if (has_prompt == has_messages) return "give exactly one of \"prompt\" (text) and \"messages\" (a chat)";
  openai::ParsedRequest pr;
  openai::ApiError err;
  if (!openai::parse_request(has_messages ? openai::Endpoint::chat : openai::Endpoint::completions, j, tok, family,
                             limits, defaults, &pr, &err))
    return err.message;
  out->prompt = std::move(pr.prompt);
  out->options = std::move(pr.options);
  return {};
}

}  // namespace

int cmd_batch(int argc, char** argv) {
  std::vector<OptionSpec> opts = engine_options();
  for (const auto& o : sampling_options()) opts.push_back(o);
  opts.insert(opts.end(), {{"--input", "-i", true},
                           {"--output", "-o", true},
                           {"--parallel", "", true},
                           {"--kv-size", "", true},
                           {"--help", "-h", false}});
  auto args = Args::parse(argc, argv, opts);
  if (!args) return report(args.status());
  if (args->has("--help")) {
    std::printf("usage: phaselab-cli batch -m MODEL -i IN.jsonl -o OUT.jsonl [--parallel N] [options]\n"
                "  Offline batch inference: up to N sequences share every forward pass (continuous batching).\n"
                "  Each input line: {\"prompt\": \"text\", \"n\": 64} or {\"messages\": [{\"role\": \"user\",\n"
                "  \"content\": \"...\"}], \"n\": 64}, with any field of the server's /v1/completions or\n"
                "  /v1/chat/completions (docs/serving.md), checked the same way (\"temperature\" 0 to 2, no empty\n"
                "  \"stop\"). Batch's own dialect: \"n\" is the answer's token limit (an alias of \"max_tokens\";\n"
                "  one output per line, not n choices), and an absent field takes the options below, not OpenAI's\n"
                "  defaults (the same --seed for every line).\n"
                "  Each output line, in input order: {\"index\", \"text\", \"tokens\", \"prompt_tokens\", \"ttft_ms\",\n"
                "  \"stop_reason\"}; a bad line gives {\"index\", \"error\"} and the others still run (exit code 2).\n"
                "  -o - writes to standard output. Progress goes to stderr.\n"
                "      --parallel N         sequences in one pass at most (default 8)\n"
                "      --kv-size N          positions in the KV pool all sequences share (default: the context)\n"
                "%s%s",
                kEngineHelp, kSamplingHelp);
    return kExitOk;
  }
  const auto in_path = args->get("--input");
  const auto out_path = args->get("--output");
  if (!in_path || !out_path) return usage_error("batch needs -i IN.jsonl and -o OUT.jsonl (run with --help for the format)");
  auto parallel = args->get_int("--parallel", 8, 1, 4096);
  auto ctx = args->get_int("--ctx-size", 0, 0, 1 << 20);
  auto kv_size = args->get_int("--kv-size", 0, 0, 1 << 24);
  for (const Status& st : {parallel.status(), ctx.status(), kv_size.status()})
    if (!st.is_ok()) return report(st);
  GenerateOptions defaults;
  if (Status st = read_generate_options(*args, &defaults); !st) return report(st);
  auto text = read_text_file(*in_path);
  if (!text) return report(text.status());
  auto opened = open_model_and_backend(*args, std::max(64, *parallel));
  if (!opened) return report(opened.status());
  if (*parallel > opened->backend->max_batch())
    return usage_error("--parallel " + std::to_string(*parallel) + " needs --batch-size of at least as many tokens");
  std::shared_ptr<Model> model = opened->model;
  const std::string backend_name = opened->backend->name();
  SchedulerOptions so;
  so.n_ctx = *ctx;
  so.kv_positions = *kv_size;
  so.max_seqs = *parallel;
  so.prefix_cache = !args->has("--no-prefix-cache");
  auto kv_type = cache_type(*args);
  if (!kv_type) return report(kv_type.status());
  so.kv_type = *kv_type;
  auto sched = Scheduler::create(model, std::move(opened->backend), so);
  if (!sched) return report(sched.status());
  Scheduler& s = **sched;

  // Parse every line first: bad ones are reported by number and skipped.
  const Tokenizer& tok = model->tokenizer();
  const ChatTemplateFamily family = model->chat_template();
  std::vector<Line> lines;
  {
    // The server's limits on a line: the context, and no answer cap but the
    // context's (the scheduler stops there).
    const openai::ApiLimits limits{s.n_ctx(), 1 << 20};
    openai::RequestDefaults line_defaults;
    line_defaults.options = defaults;
    line_defaults.random_seed = false;  // --seed (or the one drawn for this run) for every line
    line_defaults.batch_dialect = true;
    std::istringstream in(*text);
    std::string l;
    int number = 0;
    while (std::getline(in, l)) {
      number++;
      if (l.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank lines are not requests
      Line line;
      line.number = number;
      line.error = parse_line(l, tok, family, limits, line_defaults, &line.req);
      lines.push_back(std::move(line));
    }
  }
  if (lines.empty()) return usage_error(*in_path + " holds no requests (one JSON object per line)");

  std::ofstream file;
  const bool to_stdout = *out_path == "-";
  if (!to_stdout) {
    file.open(*out_path, std::ios::binary | std::ios::trunc);
    if (!file) return report(io_error("cannot write " + *out_path + ": check the folder exists and is writable"));
  }
  std::ostream& out = to_stdout ? std::cout : file;

  std::map<uint64_t, size_t> index_of;  // scheduler id -> line index
  std::vector<nlohmann::json> results(lines.size());
  std::vector<bool> ready(lines.size(), false);
  int n_bad = 0;
  for (size_t i = 0; i < lines.size(); i++) {
    if (lines[i].error.empty()) {
      auto id = s.submit(std::move(lines[i].req));
      if (id) {
        index_of[*id] = i;
        continue;
      }
      lines[i].error = id.status().message();
    }
    n_bad++;
    std::fprintf(stderr, "phaselab-cli: %s line %d: %s\n", in_path->c_str(), lines[i].number, lines[i].error.c_str());
    results[i] = {{"index", i}, {"line", lines[i].number}, {"error", lines[i].error}};
    ready[i] = true;
  }

  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  auto last_report = t0;
  size_t next_out = 0, n_done = 0;
  long long n_tokens = 0;
  double ttft_sum = 0;
  const size_t n_requests = index_of.size();
  auto write_ready = [&] {
    for (; next_out < lines.size() && ready[next_out]; next_out++)
      out << results[next_out].dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
    out.flush();
  };
  write_ready();
  while (!s.idle()) {
    if (Status st = s.step(); !st) return report(st);
    for (auto& o : s.take_finished()) {
      const size_t i = index_of.at(o.id);
      const RequestMetrics& m = o.result.metrics;
      if (!o.status) {
        n_bad++;
        std::fprintf(stderr, "phaselab-cli: %s line %d: %s\n", in_path->c_str(), lines[i].number, o.status.message().c_str());
        results[i] = {{"index", i}, {"line", lines[i].number}, {"error", o.status.message()}};
      } else {
        results[i] = {{"index", i},
                      {"text", o.result.text},
                      {"tokens", m.n_generated},
                      {"prompt_tokens", m.n_prompt},
                      {"ttft_ms", m.ttft_ms},
                      {"stop_reason", m.stop_reason}};
        n_tokens += m.n_generated;
        ttft_sum += m.ttft_ms;
      }
      ready[i] = true;
      n_done++;
    }
    write_ready();
    const auto now = Clock::now();
    if (now - last_report > std::chrono::seconds(2)) {
      last_report = now;
      const auto st = s.stats();
      const double sec = std::chrono::duration<double>(now - t0).count();
      std::fprintf(stderr, "phaselab-cli: %zu/%zu done, %d running, %d waiting, %.1f tokens/s generated\n", n_done,
                   n_requests, st.running, st.waiting, n_tokens / std::max(sec, 1e-9));
    }
  }
  write_ready();
  const double sec = std::chrono::duration<double>(Clock::now() - t0).count();
  const auto st = s.stats();
  std::fprintf(stderr,
               "phaselab-cli: %zu requests on %s, up to %d in parallel: %lld tokens in %.2f s = %.1f tokens/s; mean TTFT "
               "%.1f ms; %llu passes, %llu preemptions\n",
               n_requests, backend_name.c_str(), *parallel, n_tokens, sec, n_tokens / std::max(sec, 1e-9),
               n_done ? ttft_sum / static_cast<double>(n_done) : 0.0, static_cast<unsigned long long>(st.steps),
               static_cast<unsigned long long>(st.preemptions));
  if (!out) return report(io_error("writing " + *out_path + " failed (disk full?)"));
  if (n_bad > 0) {
    std::fprintf(stderr, "phaselab-cli: %d of %zu lines could not run (see above)\n", n_bad, lines.size());
    return kExitBadInput;
  }
  return kExitOk;
}

}  // namespace phaselab::cli
