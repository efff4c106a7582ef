// phaselab-cli generate and chat: stream text from a model in the terminal.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>

#include "cli_util.h"
#include "commands.h"
#include "engine_setup.h"
#include "phaselab/chat_template.h"
#include "phaselab/session.h"

namespace phaselab::cli {

namespace {

std::atomic<bool> g_cancel{false};
extern "C" void on_sigint(int) { g_cancel.store(true); }

std::vector<OptionSpec> model_options() {
  std::vector<OptionSpec> o = engine_options();
  o.push_back({"--no-kv-cache", "", false});
  o.push_back({"--help", "-h", false});
  return o;
}

const std::vector<OptionSpec> kSamplingOptions = {
    {"--n-predict", "-n", true},  {"--temp", "", true},          {"--top-k", "", true},
    {"--top-p", "", true},        {"--min-p", "", true},         {"--repeat-penalty", "", true},
    {"--frequency-penalty", "", true}, {"--presence-penalty", "", true}, {"--seed", "-s", true},
    {"--stop", "", true},         {"--ignore-eos", "", false},
};

std::vector<OptionSpec> join(std::vector<OptionSpec> a, const std::vector<OptionSpec>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

Status read_generate_options(const Args& a, GenerateOptions* o) {
  auto n = a.get_int("--n-predict", 256, 1, 1 << 20);
  if (!n) return n.status();
  o->n_predict = *n;
  SamplingParams& s = o->sampling;
  auto temp = a.get_double("--temp", 0.8, 0, 100);
  if (!temp) return temp.status();
  auto top_k = a.get_int("--top-k", 40, 0, 1 << 30);
  if (!top_k) return top_k.status();
  auto top_p = a.get_double("--top-p", 0.95, 0.0001, 1);
  if (!top_p) return top_p.status();
  auto min_p = a.get_double("--min-p", 0.05, 0, 0.9999);
  if (!min_p) return min_p.status();
  auto rp = a.get_double("--repeat-penalty", 1.0, 0.01, 10);
  if (!rp) return rp.status();
  auto fp = a.get_double("--frequency-penalty", 0.0, -10, 10);
  if (!fp) return fp.status();
  auto pp = a.get_double("--presence-penalty", 0.0, -10, 10);
  if (!pp) return pp.status();
  s.temperature = static_cast<float>(*temp);
  s.top_k = *top_k;
  s.top_p = static_cast<float>(*top_p);
  s.min_p = static_cast<float>(*min_p);
  s.repeat_penalty = static_cast<float>(*rp);
  s.frequency_penalty = static_cast<float>(*fp);
  s.presence_penalty = static_cast<float>(*pp);
  if (auto seed = a.get("--seed")) {
    char* end = nullptr;
    errno = 0;
    const unsigned long long v = std::strtoull(seed->c_str(), &end, 10);
    // strtoull accepts "-5" (and wraps it): only digits are a seed.
    if (seed->empty() || *end || !std::isdigit(static_cast<unsigned char>((*seed)[0])) || errno == ERANGE)
      return invalid_argument("--seed must be a non-negative integer below 2^64, not '" + *seed + "'");
    s.seed = v;
  } else {
    s.seed = std::random_device{}();
  }
  if (auto stop = a.get("--stop")) o->stop.push_back(*stop);
  o->use_kv_cache = !a.has("--no-kv-cache");
  o->prefix_cache = !a.has("--no-prefix-cache");
  o->ignore_eos = a.has("--ignore-eos");
  return s.validate();
}

void print_stats(const RequestMetrics& m, const std::string& backend) {
  std::fprintf(stderr,
               "\n[%s] prompt %d tok (%d reused), TTFT %.1f ms, prefill %.1f tok/s | generated %d tok, decode %.1f tok/s, "
               "TPOT %.2f ms | stop: %s\n",
               backend.c_str(), m.n_prompt, m.n_reused, m.ttft_ms, m.prefill_tps, m.n_generated, m.decode_tps, m.tpot_ms,
               m.stop_reason.c_str());
  if (m.spec_drafted > 0)
    std::fprintf(stderr, "[speculative] drafted %d, accepted %d (%.0f%%), %.2f tokens per target pass\n", m.spec_drafted,
                 m.spec_accepted, 100.0 * m.spec_acceptance, m.tokens_per_pass);
  if (m.stop_reason == "context_full")
    std::fprintf(stderr, "the context (%llu tokens) is full: start a new chat or raise --ctx-size\n",
                 static_cast<unsigned long long>(m.kv_capacity));
}

const char* kModelHelp = "      --no-kv-cache        recompute the whole sequence every step (slow on purpose)\n";
const char* kSamplingHelp =
    "  -n, --n-predict N        token limit (default 256)\n"
    "      --temp T             temperature, 0 = greedy (default 0.8)\n"
    "      --top-k K            (default 40, 0 = off)   --top-p P (0.95)   --min-p P (0.05)\n"
    "      --repeat-penalty X   (1.0 = off)  --frequency-penalty X  --presence-penalty X\n"
    "  -s, --seed S             makes sampling reproducible (default: random)\n"
    "      --stop TEXT          stop when TEXT is generated\n"
    "      --ignore-eos         keep going past end-of-generation tokens\n";

}  // namespace

int cmd_generate(int argc, char** argv) {
  auto args = Args::parse(argc, argv,
                          join(join(model_options(), kSamplingOptions),
                               {{"--prompt", "-p", true}, {"--file", "-f", true}, {"--chat", "", false},
                                {"--system", "", true}, {"--json", "", false}, {"--quiet", "-q", false}}));
  if (!args) return report(args.status());
  if (args->has("--help")) {
    std::printf("usage: phaselab-cli generate -m MODEL -p TEXT [options]\n"
                "  -p, --prompt TEXT        raw prompt (BOS added as the model specifies)\n"
                "  -f, --file PATH          read the prompt from a file\n"
                "      --chat               apply the model's chat template to the prompt (a user turn)\n"
                "      --system TEXT        system prompt (with --chat)\n"
                "      --json               print one JSON object with ids, text and metrics at the end\n"
                "  -q, --quiet              do not stream the text (with --json)\n%s%s",
                kEngineHelp, kSamplingHelp);
    std::printf("%s", kModelHelp);
    return kExitOk;
  }
  if (!args->positional().empty()) return usage_error("unexpected argument '" + args->positional()[0] + "'");
  std::string prompt_text;
  if (args->has("--prompt") && args->has("--file")) return usage_error("give either -p TEXT or --file PATH, not both");
  if (auto p = args->get("--prompt")) prompt_text = *p;
  else if (auto f = args->get("--file")) {
    auto t = read_text_file(*f);
    if (!t) return report(t.status());
    prompt_text = std::move(*t);
  } else {
    return usage_error("generate needs a prompt: -p TEXT or --file PATH");
  }
  GenerateOptions opt;
  if (Status st = read_generate_options(*args, &opt); !st) return report(st);
  auto setup = open_session(*args);
  if (!setup) return report(setup.status());
  Session& session = *setup->session;
  const Model& model = session.model();
  const Tokenizer& tok = model.tokenizer();
  opt.draft = setup->draft.get();
  opt.spec_k = setup->spec_k;

  std::vector<int32_t> prompt;
  if (args->has("--chat")) {
    std::vector<ChatMessage> msgs;
    if (auto sys = args->get("--system")) msgs.push_back({"system", *sys});
    msgs.push_back({"user", prompt_text});
    const auto family = setup->chat_family;
    prompt = tok.encode(apply_chat_template(family, msgs), true, true);
    for (auto& s : chat_stop_strings(family)) opt.stop.push_back(s);
  } else {
    prompt = tok.encode(prompt_text, true, false);
  }

  const bool json = args->has("--json");
  const bool stream = !(json && args->has("--quiet"));
  std::signal(SIGINT, on_sigint);
  auto res = session.generate(prompt, opt, [&](const TokenEvent& e) {
    if (stream && !e.text.empty()) {
      std::fwrite(e.text.data(), 1, e.text.size(), stdout);
      std::fflush(stdout);
    }
  }, &g_cancel);
  std::signal(SIGINT, SIG_DFL);
  if (!res) return report(res.status());
  if (stream) std::printf("\n");
  print_stats(res->metrics, session.backend().name());
  if (json) {
    const RequestMetrics& m = res->metrics;
    nlohmann::json j;
    j["model"] = model.path();
    j["backend"] = session.backend().name();
    j["prompt_tokens"] = prompt;
    j["tokens"] = res->tokens;
    j["text"] = res->text;
    j["n_prompt"] = m.n_prompt;
    j["n_reused"] = m.n_reused;
    j["n_generated"] = m.n_generated;
    j["ttft_ms"] = m.ttft_ms;
    j["prefill_tps"] = m.prefill_tps;
    j["decode_tps"] = m.decode_tps;
    j["tpot_ms"] = m.tpot_ms;
    j["stop_reason"] = m.stop_reason;
    j["kv_cache"] = opt.use_kv_cache;
    j["prefix_cache"] = opt.prefix_cache;
    j["kv_blocks"] = {{"used", m.kv_blocks_used}, {"cached", m.kv_blocks_cached}, {"shared", m.kv_blocks_shared},
                      {"total", m.kv_blocks_total}, {"block_tokens", KvPool::kBlockTokens}};
    j["spec"] = opt.draft ? opt.draft->name() : "none";
    j["spec_k"] = opt.spec_k;
    j["spec_drafted"] = m.spec_drafted;
    j["spec_accepted"] = m.spec_accepted;
    j["spec_acceptance"] = m.spec_acceptance;
    j["target_passes"] = m.target_passes;
    j["tokens_per_pass"] = m.tokens_per_pass;
    j["seed"] = opt.sampling.seed;
    j["temperature"] = opt.sampling.temperature;
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  }
  return kExitOk;
}

int cmd_chat(int argc, char** argv) {
  auto args = Args::parse(argc, argv, join(join(model_options(), kSamplingOptions), {{"--system", "", true}}));
  if (!args) return report(args.status());
  if (args->has("--help")) {
    std::printf("usage: phaselab-cli chat -m MODEL [--system TEXT] [options]\n"
                "  type a message and press Enter; /reset starts over, /quit (or Ctrl+D) leaves\n%s%s%s",
                kEngineHelp, kSamplingHelp, kModelHelp);
    return kExitOk;
  }
  GenerateOptions opt;
  if (Status st = read_generate_options(*args, &opt); !st) return report(st);
  auto setup = open_session(*args);
  if (!setup) return report(setup.status());
  Session& session = *setup->session;
  const Tokenizer& tok = session.model().tokenizer();
  const auto family = setup->chat_family;
  opt.draft = setup->draft.get();
  opt.spec_k = setup->spec_k;
  for (auto& s : chat_stop_strings(family)) opt.stop.push_back(s);

  std::vector<ChatMessage> history;
  if (auto sys = args->get("--system")) history.push_back({"system", *sys});
  const bool tty = isatty(STDIN_FILENO);
  std::fprintf(stderr, "PhaseLab chat with %s (%s template, %s). /reset, /quit.\n", session.model().path().c_str(),
               chat_template_family_name(family), session.backend().name().c_str());
  std::signal(SIGINT, on_sigint);
  std::string line;
  for (;;) {
    if (tty) std::fprintf(stderr, "\n> ");
    if (!std::getline(std::cin, line)) break;
    if (line == "/quit" || line == "/exit") break;
    if (line == "/reset") {
      history.erase(std::remove_if(history.begin(), history.end(), [](auto& m) { return m.role != "system"; }), history.end());
      std::fprintf(stderr, "(conversation cleared)\n");
      continue;
    }
    if (line.empty()) continue;
    history.push_back({"user", line});
    auto prompt = tok.encode(apply_chat_template(family, history), true, true);
    // Keep the conversation inside the context: drop the oldest turns (the
    // system prompt stays) until the prompt leaves room for an answer.
    const int n_ctx = session.n_ctx();
    const int room = std::max(16, std::min(opt.n_predict > 0 ? opt.n_predict : 256, n_ctx / 2));
    int dropped = 0;
    while (static_cast<int>(prompt.size()) + room > n_ctx) {
      auto oldest = std::find_if(history.begin(), history.end() - 1, [](auto& m) { return m.role != "system"; });
      if (oldest == history.end() - 1) break;  // only this message is left
      history.erase(oldest);
      dropped++;
      prompt = tok.encode(apply_chat_template(family, history), true, true);
    }
    if (dropped)
      std::fprintf(stderr, "(the %d oldest message%s no longer fit the context of %d tokens and were dropped; "
                           "/reset clears the conversation)\n", dropped, dropped == 1 ? "" : "s", n_ctx);
    if (static_cast<int>(prompt.size()) + 1 > n_ctx) {
      std::fprintf(stderr, "phaselab-cli: error: this message alone is %zu tokens and the context holds %d: "
                           "send a shorter one or start with a larger -c\n", prompt.size(), n_ctx);
      history.pop_back();
      continue;
    }
    g_cancel.store(false);
    auto res = session.generate(prompt, opt, [&](const TokenEvent& e) {
      std::fwrite(e.text.data(), 1, e.text.size(), stdout);
      std::fflush(stdout);
    }, &g_cancel);
    if (!res) {
      report(res.status());
      history.pop_back();
      continue;
    }
    std::printf("\n");
    print_stats(res->metrics, session.backend().name());
    history.push_back({"assistant", res->text});
  }
  return kExitOk;
}

}  // namespace phaselab::cli
