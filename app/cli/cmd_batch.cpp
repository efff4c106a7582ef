// phaselab-cli batch: offline batch inference through the continuous-batching
// scheduler. One JSON object per input line ({"prompt": ...} or {"messages":
// [...]}, with "n"), one per output line, written as each finishes. The input
// is read a window of lines at a time; the output is resumable (batch_io.h).
#include <csignal>
#include <chrono>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "batch_io.h"
#include "cli_util.h"
#include "commands.h"
#include "engine_setup.h"
#include "phaselab/chat_template.h"
#include "phaselab/openai_api.h"
#include "phaselab/scheduler.h"

namespace phaselab::cli {

namespace {

// One input line -> a request, read by the server's own parser in batch's
// dialect (openai::parse_batch_line: the command line's flags are the
// defaults, "n" is the token limit), so that a line is checked as a request
// to the server is; the error names the field. Empty when the line is good.
std::string parse_line(const std::string& text, const Tokenizer& tok, const ChatFormat& format,
                       const openai::ApiLimits& limits, const openai::RequestDefaults& defaults, BatchRequest* out) {
  openai::ParsedRequest pr;
  openai::ApiError err;
  if (!openai::parse_batch_line(text, tok, format, limits, defaults, &pr, &err)) return err.message;
  out->prompt = std::move(pr.prompt);
  out->options = std::move(pr.options);
  return {};
}

// Every record names its input line by hash: --resume checks with it that a
// file holds this input's results and not another's.
nlohmann::json error_record(size_t index, const InputLine& in, const std::string& error) {
  return {{"index", index}, {"line", in.number}, {"line_fnv1a64", hex64(in.hash)}, {"error", error}};
}

nlohmann::json result_record(size_t index, const InputLine& in, const GenerateResult& r) {
  const RequestMetrics& m = r.metrics;
  nlohmann::json j = {{"index", index},          {"text", r.text},         {"tokens", m.n_generated},
                      {"prompt_tokens", m.n_prompt}, {"ttft_ms", m.ttft_ms}, {"stop_reason", to_string(m.stop_reason)},
                      {"line_fnv1a64", hex64(in.hash)}};
  if (!r.reasoning.empty()) j["reasoning"] = r.reasoning;  // a chat line's reasoning (gpt-oss, a <think> block)
  return j;
}

void print_help() {
  std::printf(
      "usage: phaselab-cli batch -m MODEL -i IN.jsonl -o OUT.jsonl [--parallel N] [--resume | --force] [options]\n"
      "  Offline batch inference: up to N sequences share every forward pass (continuous batching).\n"
      "  Each input line: {\"prompt\": \"text\", \"n\": 64} or {\"messages\": [{\"role\": \"user\",\n"
      "  \"content\": \"...\"}], \"n\": 64}, with any field of the server's /v1/completions or\n"
      "  /v1/chat/completions (docs/serving.md), checked the same way (\"temperature\" 0 to 2, no empty\n"
      "  \"stop\"). Batch's own dialect: \"n\" is the answer's token limit (an alias of \"max_tokens\";\n"
      "  one output per line, not n choices), and an absent field takes the options below, not OpenAI's\n"
      "  defaults (the same --seed for every line).\n"
      "  Each output line: {\"index\", \"text\", \"tokens\", \"prompt_tokens\", \"ttft_ms\", \"stop_reason\",\n"
      "  \"line_fnv1a64\"}, and \"reasoning\" where a reasoning model's chat reply had some (gpt-oss, a\n"
      "  <think> block: not part of \"text\"); a bad line gives {\"index\", \"line\", \"line_fnv1a64\",\n"
      "  \"error\"} and the others still run (exit code 2). Lines are written as they finish, so in\n"
      "  completion order: \"index\" is the request's place among IN's non-blank lines (for input\n"
      "  order: jq -s -c 'sort_by(.index)[]' OUT).\n"
      "  \"line_fnv1a64\" is the 64-bit FNV-1a hash (16 hex digits) of the input line's exact bytes.\n"
      "  OUT is locked while batch writes it; an OUT that is not empty is refused unless one of:\n"
      "      --resume             continue OUT after a crash or a kill: keep its whole lines (they must\n"
      "                           answer IN's lines), cut off a torn last one, run only what is missing\n"
      "      --force              overwrite OUT\n"
      "  A failed write (a full disk) cuts OUT back to its last whole line and exits with 1: free space\n"
      "  and run again with --resume. -o - writes to standard output (no lock, no resume).\n"
      "  Progress goes to stderr.\n"
      "      --parallel N         sequences in one pass at most (default 8)\n"
      "      --kv-size N          positions in the KV pool all sequences share (default: the context)\n"
      "      --policy P           how passes are shared between prompts and decodes (default chunked):\n"
      "%s%s%s",
      kSchedulePolicyHelp, kEngineHelp, kSamplingHelp);
}

struct ParseContext {
  const Tokenizer& tok;
  ChatFormat format;
  openai::ApiLimits limits;
  openai::RequestDefaults defaults;
};

// Feeds the scheduler a window of the lines still to answer (so neither the
// input nor its tokenized prompts are ever held whole) and appends each
// record as soon as it is known.
class BatchRun {
 public:
  BatchRun(Scheduler& s, LineReader& in, const std::string& in_path, const std::vector<InputLine>& lines,
           std::vector<size_t> pending, BatchOutput& out, const ParseContext& ctx, int parallel)
      : s_(s), in_(in), in_path_(in_path), lines_(lines), pending_(std::move(pending)), out_(out), ctx_(ctx),
        window_(2 * static_cast<size_t>(parallel)) {}

  Status run();
  void print_summary(int parallel) const;
  bool output_failed() const { return output_failed_; }  // the error is the output's (exit 1)

  size_t n_submitted = 0, n_done = 0, n_ok = 0;
  int n_bad = 0;
  long long n_tokens = 0;
  double ttft_sum = 0;

 private:
  using Clock = std::chrono::steady_clock;
  Status feed();
  Status collect();
  Status write(const nlohmann::json& record);
  Status sync(bool now);
  void report_progress();

  Scheduler& s_;
  LineReader& in_;
  const std::string& in_path_;
  const std::vector<InputLine>& lines_;
  const std::vector<size_t> pending_;  // indices to answer, ascending
  size_t next_ = 0;                    // into pending_
  BatchOutput& out_;
  const ParseContext& ctx_;
  const size_t window_;  // requests in the scheduler at most: twice a pass, so the next ones are always waiting
  std::map<uint64_t, size_t> index_of_;  // scheduler id -> line index, while running
  bool output_failed_ = false;
  Clock::time_point t0_ = Clock::now(), last_report_ = t0_;
};

Status BatchRun::run() {
  for (;;) {
    PHASELAB_TRY(feed());
    if (s_.idle()) break;  // feed() stops short of a full window only at the input's end
    PHASELAB_TRY(s_.step());
    PHASELAB_TRY(collect());
    PHASELAB_TRY(sync(false));
    report_progress();
  }
  return sync(true);
}

Status BatchRun::feed() {
  LineReader::Line l;
  while (next_ < pending_.size() && index_of_.size() < window_) {
    const size_t i = pending_[next_++];
    const InputLine& in = lines_[i];
    if (in_.position() != in.offset) in_.seek(in.offset);  // past lines a resumed output answers
    if (!in_.next(&l, static_cast<size_t>(kMaxTextFileBytes))) {
      if (!in_.error().is_ok()) return in_.error();
      l.hash = ~in.hash;  // the file was cut short
    }
    if (l.hash != in.hash)
      return invalid_file(in_path_ + " changed while batch was reading it (line " + std::to_string(in.number) +
                          "): leave it alone while batch runs, then continue with --resume");
    BatchRequest req;
    std::string error = l.cut ? "the line is longer than " + std::to_string(kMaxTextFileBytes >> 20) +
                                    " MiB: no context holds such a prompt, shorten it"
                              : parse_line(l.text, ctx_.tok, ctx_.format, ctx_.limits, ctx_.defaults, &req);
    if (error.empty()) {
      auto id = s_.submit(std::move(req));
      if (id) {
        index_of_[*id] = i;
        n_submitted++;
        continue;
      }
      error = id.status().message();
    }
    n_bad++;
    std::fprintf(stderr, "phaselab-cli: %s line %lld: %s\n", in_path_.c_str(), in.number, error.c_str());
    PHASELAB_TRY(write(error_record(i, in, error)));
  }
  return Status::ok();
}

Status BatchRun::collect() {
  for (auto& o : s_.take_finished()) {
    const auto it = index_of_.find(o.id);
    const size_t i = it->second;
    index_of_.erase(it);
    n_done++;
    if (!o.status) {
      n_bad++;
      std::fprintf(stderr, "phaselab-cli: %s line %lld: %s\n", in_path_.c_str(), lines_[i].number,
                   o.status.message().c_str());
      PHASELAB_TRY(write(error_record(i, lines_[i], o.status.message())));
      continue;
    }
    PHASELAB_TRY(write(result_record(i, lines_[i], o.result)));
    n_ok++;
    n_tokens += o.result.metrics.n_generated;
    ttft_sum += o.result.metrics.ttft_ms;
  }
  return Status::ok();
}

Status BatchRun::write(const nlohmann::json& record) {
  Status st = out_.append(openai::dump(record));
  if (!st) output_failed_ = true;
  return st;
}

Status BatchRun::sync(bool now) {
  Status st = out_.sync(now);
  if (!st) output_failed_ = true;
  return st;
}

void BatchRun::report_progress() {
  const auto now = Clock::now();
  if (now - last_report_ < std::chrono::seconds(2)) return;
  last_report_ = now;
  const auto st = s_.stats();
  const double sec = std::chrono::duration<double>(now - t0_).count();
  std::fprintf(stderr, "phaselab-cli: %zu/%zu done, %d running, %d waiting, %.1f tokens/s generated\n", n_done,
               pending_.size(), st.running, st.waiting, n_tokens / std::max(sec, 1e-9));
}

void BatchRun::print_summary(int parallel) const {
  const double sec = std::chrono::duration<double>(Clock::now() - t0_).count();
  const auto st = s_.stats();
  std::fprintf(stderr,
               "phaselab-cli: %zu requests on %s, up to %d in parallel: %lld tokens in %.2f s = %.1f tokens/s; mean "
               "TTFT %.1f ms; %llu passes, %llu preemptions\n",
               n_submitted, s_.backend().name().c_str(), parallel, n_tokens, sec, n_tokens / std::max(sec, 1e-9),
               n_ok ? ttft_sum / static_cast<double>(n_ok) : 0.0, static_cast<unsigned long long>(st.steps),
               static_cast<unsigned long long>(st.preemptions));
}

// The model and a scheduler for it, as the engine options say.
Result<std::unique_ptr<Scheduler>> make_scheduler(const Args& args, int parallel, int ctx, int kv_size) {
  auto policy = parse_schedule_policy(args.get_or("--policy", "chunked"));
  if (!policy) return policy.status().with_context("--policy");
  auto bo = backend_options_from_args(args, std::max(64, parallel));
  if (!bo) return bo.status();
  if (parallel > bo->max_batch)
    return invalid_argument("--parallel " + std::to_string(parallel) +
                            " needs --batch-size of at least as many tokens");
  const auto path = args.get("--model");
  if (!path) return invalid_argument("no model given: pass -m MODEL.gguf (scripts/fetch-model.sh gets the default one)");
  auto model = Model::load(*path);
  if (!model) return model.status();
  set_model_batch(args, **model, std::max(64, parallel), &*bo);
  SchedulerOptions so;
  so.n_ctx = ctx;
  so.kv_positions = kv_size;
  so.max_seqs = parallel;
  so.prefix_cache = !args.has("--no-prefix-cache");
  so.policy = *policy;
  auto kv_type = cache_type(args);
  if (!kv_type) return kv_type.status();
  so.kv_type = *kv_type;
  // The policy's backend(s) (disaggregated:P+D: a prefill and a decode worker).
  std::string fallback;
  auto sched = create_scheduler(std::move(*model), *bo, so, &fallback);
  if (!fallback.empty()) std::fprintf(stderr, "phaselab-cli: %s; using the CPU backend\n", fallback.c_str());
  return sched;
}

// Opens IN and OUT before the model loads, so that a refusal comes at once.
struct BatchFiles {
  std::unique_ptr<LineReader> in;
  std::vector<InputLine> lines;
  std::unique_ptr<BatchOutput> out;
  std::vector<size_t> pending;  // indices OUT does not answer yet
};

Result<BatchFiles> open_batch_files(const std::string& in_path, const std::string& out_path, ExistingOutput existing) {
  BatchFiles f;
  auto in = LineReader::open(in_path);
  if (!in) return in.status();
  f.in = std::move(*in);
  auto lines = index_input(*f.in);
  if (!lines) return lines.status();
  f.lines = std::move(*lines);
  if (f.lines.empty()) return invalid_argument(in_path + " holds no requests (one JSON object per line)");
  auto out = BatchOutput::open(out_path, in_path, existing, f.lines);
  if (!out) return out.status();
  f.out = std::move(*out);
  if (f.out->torn_bytes() > 0)
    std::fprintf(stderr, "phaselab-cli: %s: cut off its torn last line (%llu bytes), to be run again\n",
                 out_path.c_str(), static_cast<unsigned long long>(f.out->torn_bytes()));
  for (size_t i = 0; i < f.lines.size(); i++)
    if (!f.out->answered(i)) f.pending.push_back(i);
  if (f.out->n_kept() > 0)
    std::fprintf(stderr, "phaselab-cli: resuming %s: %zu of %zu requests answered already, %zu to run\n",
                 out_path.c_str(), f.out->n_kept(), f.lines.size(), f.pending.size());
  return f;
}

}  // namespace

int cmd_batch(int argc, char** argv) {
  std::vector<OptionSpec> opts = engine_options();
  for (const auto& o : sampling_options()) opts.push_back(o);
  opts.insert(opts.end(), {{"--input", "-i", true},
                           {"--output", "-o", true},
                           {"--parallel", "", true},
                           {"--policy", "", true},
                           {"--kv-size", "", true},
                           {"--resume", "", false},
                           {"--force", "", false},
                           {"--help", "-h", false}});
  auto args = Args::parse(argc, argv, opts);
  if (!args) return report(args.status());
  if (args->has("--help")) {
    print_help();
    return kExitOk;
  }
  const auto in_path = args->get("--input");
  const auto out_path = args->get("--output");
  if (!in_path || !out_path) return usage_error("batch needs -i IN.jsonl and -o OUT.jsonl (run with --help for the format)");
  const bool resume = args->has("--resume"), force = args->has("--force");
  if (resume && force) return usage_error("give --resume (continue the output) or --force (overwrite it), not both");
  if (resume && *out_path == "-") return usage_error("--resume needs -o FILE: standard output cannot be read back");
  auto parallel = args->get_int("--parallel", 8, 1, 4096);
  auto ctx = args->get_int("--ctx-size", 0, 0, 1 << 20);
  auto kv_size = args->get_int("--kv-size", 0, 0, 1 << 24);
  for (const Status& st : {parallel.status(), ctx.status(), kv_size.status()})
    if (!st.is_ok()) return report(st);
  GenerateOptions defaults;
  if (Status st = read_generate_options(*args, &defaults); !st) return report(st);
  auto files = open_batch_files(*in_path, *out_path,
                                resume ? ExistingOutput::resume : force ? ExistingOutput::overwrite : ExistingOutput::refuse);
  if (!files) return report(files.status());
  BatchFiles& f = *files;
  // Past RLIMIT_FSIZE write() then fails with EFBIG, and the output is cut
  // back to its last whole line, instead of the signal killing us mid-line.
  std::signal(SIGXFSZ, SIG_IGN);

  int n_bad = static_cast<int>(f.out->n_kept_errors());
  if (!f.pending.empty()) {
    auto sched = make_scheduler(*args, *parallel, *ctx, *kv_size);
    if (!sched) return report(sched.status());
    Scheduler& s = **sched;
    // The server's limits on a line: the context, and no answer cap but the
    // context's (the scheduler stops there).
    const ParseContext pc{s.model().tokenizer(), s.model().chat_format(), openai::ApiLimits{s.n_ctx(), 1 << 20},
                          openai::batch_defaults(defaults)};
    BatchRun run(s, *f.in, *in_path, f.lines, f.pending, *f.out, pc, *parallel);
    if (Status st = run.run(); !st) {
      if (run.output_failed()) {
        report(st);
        return kExitFailure;
      }
      (void)f.out->sync(true);  // what finished stays answered
      return report(Status(st.code(), st.message() + " (the results written so far are kept: fix this, then run "
                                                     "the same command with --resume)"));
    }
    n_bad += run.n_bad;
    run.print_summary(*parallel);
  }
  if (n_bad > 0) {
    std::fprintf(stderr, "phaselab-cli: %d of %zu lines could not run (each has an \"error\" in %s)\n", n_bad,
                 f.lines.size(), out_path->c_str());
    return kExitBadInput;
  }
  return kExitOk;
}

}  // namespace phaselab::cli
