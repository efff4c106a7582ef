// phaselab-cli generate and chat: stream text from a model in the terminal.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <csignal>
#include <functional>
#include <optional>
#include <cstdlib>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>

#include "cli_util.h"
#include "commands.h"
#include "engine_setup.h"
#include "phaselab/chat_template.h"
#include "phaselab/prompt.h"
#include "phaselab/remote_client.h"
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

std::vector<OptionSpec> join(std::vector<OptionSpec> a, const std::vector<OptionSpec>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

void print_stats(const RequestMetrics& m, const std::string& backend) {
  std::fprintf(stderr,
               "\n[%s] prompt %d tok (%d reused), TTFT %.1f ms, prefill %.1f tok/s | generated %d tok, decode %.1f tok/s, "
               "TPOT %.2f ms | stop: %s\n",
               backend.c_str(), m.n_prompt, m.n_reused, m.ttft_ms, m.prefill_tps, m.n_generated, m.decode_tps, m.tpot_ms,
               to_string(m.stop_reason));
  if (m.spec_drafted > 0)
    std::fprintf(stderr, "[speculative] drafted %d, accepted %d (%.0f%%), %.2f tokens per target pass\n", m.spec_drafted,
                 m.spec_accepted, 100.0 * m.spec_acceptance, m.tokens_per_pass);
  if (m.stop_reason == StopReason::context_full)
    std::fprintf(stderr, "the context (%llu tokens) is full: start a new chat or raise --ctx-size\n",
                 static_cast<unsigned long long>(m.kv_capacity));
}

const char* kModelHelp = "      --no-kv-cache        recompute the whole sequence every step (slow on purpose)\n";

// --remote: the same commands through an OpenAI-compatible server.
const std::vector<OptionSpec> kRemoteOptions = {
    {"--remote", "", true}, {"--remote-key", "", true}, {"--remote-model", "", true}};
const char* kRemoteHelp =
    "      --remote URL         run on an OpenAI-compatible server (phaselab-cli serve, vLLM, SGLang,\n"
    "                           llama-server, Dynamo) instead of a local model, e.g. http://127.0.0.1:8000/v1;\n"
    "                           TTFT and tokens/s are then measured here, on the client\n"
    "      --remote-key KEY     its API key (or set PHASELAB_REMOTE_KEY)\n"
    "      --remote-model NAME  the model to ask for (default: the first the server lists)\n";

// The terminal chat's loop, shared by local and remote chats: reads a line,
// handles /reset and /quit, and asks answer() for the reply to the history
// (which ends with the new user message; answer may drop old turns). answer
// returns the reply's text, or nullopt when it failed (already reported):
// the message is then taken back.
using AnswerFn = std::function<std::optional<std::string>(std::vector<ChatMessage>& history)>;
void chat_loop(std::vector<ChatMessage>& history, const AnswerFn& answer) {
  const bool tty = isatty(STDIN_FILENO);
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
    g_cancel.store(false);
    auto reply = answer(history);
    if (!reply) {
      history.pop_back();
      continue;
    }
    history.push_back({"assistant", std::move(*reply)});
  }
}

// The answer to stdout; a reasoning model's reasoning (gpt-oss, a <think> block) to stderr,
// dimmed on a terminal, so that stdout stays the answer alone.
void print_token(const TokenEvent& e) {
  if (!e.reasoning.empty()) {
    static const bool tty = isatty(2);
    if (tty) std::fputs("\033[2m", stderr);
    std::fwrite(e.reasoning.data(), 1, e.reasoning.size(), stderr);
    if (tty) std::fputs("\033[0m", stderr);
    std::fflush(stderr);
  }
  std::fwrite(e.text.data(), 1, e.text.size(), stdout);
  std::fflush(stdout);
}

Result<std::unique_ptr<RemoteClient>> connect_remote(const Args& args) {
  const char* env_key = std::getenv("PHASELAB_REMOTE_KEY");
  RemoteEndpoint ep{*args.get("--remote"), args.get_or("--remote-key", env_key ? env_key : ""),
                    args.get_or("--remote-model", ""), 600};
  return RemoteClient::connect(ep);
}

void print_remote_stats(const RequestMetrics& m, const RemoteClient& c) {
  char decode[96] = "decode not measurable (the tokens arrived together)";
  if (m.decode_tps > 0) std::snprintf(decode, sizeof decode, "decode %.1f tok/s, TPOT %.2f ms", m.decode_tps, m.tpot_ms);
  std::fprintf(stderr, "\n[%s] prompt %d tok, TTFT %.1f ms (client) | generated %d tok, %s | stop: %s\n",
               c.describe().c_str(), m.n_prompt, m.ttft_ms, m.n_generated, decode, to_string(m.stop_reason));
}

int generate_remote(const Args& args, const PromptInput& input, const GenerateOptions& opt) {
  if (args.has("--model")) return usage_error("give either -m MODEL (local) or --remote URL, not both");
  auto client = connect_remote(args);
  if (!client) return report(client.status());
  const bool json = args.has("--json");
  const bool stream = !(json && args.has("--quiet"));
  auto on_token = [&](const TokenEvent& e) {
    if (stream) print_token(e);
  };
  std::signal(SIGINT, on_sigint);
  // The server applies its own chat template to the messages.
  Result<RemoteResult> res = input.chat ? (*client)->chat(input.conversation(), opt, on_token, &g_cancel)
                                        : (*client)->complete(input.text, opt, on_token, &g_cancel);
  std::signal(SIGINT, SIG_DFL);
  if (!res) return report(res.status());
  if (stream) std::printf("\n");
  const RequestMetrics& m = res->result.metrics;
  print_remote_stats(m, **client);
  if (json) {
    nlohmann::json j = {{"remote", (*client)->url()},     {"model", (*client)->model()},   {"text", res->result.text},
                        {"n_prompt", m.n_prompt},          {"n_generated", m.n_generated}, {"ttft_ms", m.ttft_ms},
                        {"decode_tps", m.decode_tps},      {"tpot_ms", m.tpot_ms},         {"stop_reason", to_string(m.stop_reason)},
                        {"server_timings", res->server_timings}};
    if (!res->result.reasoning.empty()) j["reasoning"] = res->result.reasoning;
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  }
  return kExitOk;
}

int chat_remote(const Args& args, const GenerateOptions& opt) {
  if (args.has("--model")) return usage_error("give either -m MODEL (local) or --remote URL, not both");
  auto client = connect_remote(args);
  if (!client) return report(client.status());
  std::vector<ChatMessage> history;
  if (auto sys = args.get("--system")) history.push_back({"system", *sys});
  std::fprintf(stderr, "PhaseLab chat with %s. /reset, /quit.\n", (*client)->describe().c_str());
  chat_loop(history, [&](std::vector<ChatMessage>& h) -> std::optional<std::string> {
    auto res = (*client)->chat(h, opt, print_token, &g_cancel);
    if (!res) {
      report(res.status());
      return std::nullopt;
    }
    std::printf("\n");
    print_remote_stats(res->result.metrics, **client);
    return std::move(res->result.text);
  });
  return kExitOk;
}
}  // namespace

int cmd_generate(int argc, char** argv) {
  auto args = Args::parse(argc, argv,
                          join(join(join(model_options(), sampling_options()), kRemoteOptions),
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
    std::printf("%s%s", kModelHelp, kRemoteHelp);
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
  // --chat: a user turn (after --system's, when given); else the text as written.
  PromptInput input = PromptInput::text_of(prompt_text);
  if (args->has("--chat")) {
    std::vector<ChatMessage> msgs;
    if (auto sys = args->get("--system")) msgs.push_back({"system", *sys});
    msgs.push_back({"user", prompt_text});
    input = PromptInput::chat_of(std::move(msgs));
  }
  opt.think_is_reasoning = args->has("--chat");  // a raw prompt's continuation is the text as written
  if (args->has("--remote")) return generate_remote(*args, input, opt);
  auto setup = open_session(*args);
  if (!setup) return report(setup.status());
  Session& session = *setup->session;
  const Model& model = session.model();
  opt.draft = setup->draft.get();
  opt.spec_k = setup->spec_k;

  RenderedPrompt rendered = render_prompt(model.tokenizer(), setup->chat_format, input);
  const std::vector<int32_t>& prompt = rendered.tokens;
  for (auto& s : rendered.stop) opt.stop.push_back(s);

  const bool json = args->has("--json");
  const bool stream = !(json && args->has("--quiet"));
  std::signal(SIGINT, on_sigint);
  auto res = session.generate(prompt, opt, [&](const TokenEvent& e) {
    if (stream) print_token(e);
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
    if (!res->reasoning.empty()) j["reasoning"] = res->reasoning;  // gpt-oss's analysis, a <think> block
    j["n_prompt"] = m.n_prompt;
    j["n_reused"] = m.n_reused;
    j["n_generated"] = m.n_generated;
    j["ttft_ms"] = m.ttft_ms;
    j["prefill_tps"] = m.prefill_tps;
    j["decode_tps"] = m.decode_tps;
    j["tpot_ms"] = m.tpot_ms;
    j["stop_reason"] = to_string(m.stop_reason);
    j["kv_cache"] = opt.use_kv_cache;
    j["prefix_cache"] = opt.prefix_cache;
    j["kv_blocks"] = {{"used", m.kv_blocks_used}, {"cached", m.kv_blocks_cached}, {"shared", m.kv_blocks_shared},
                      {"total", m.kv_blocks_total}, {"block_tokens", KvPool::kBlockTokens}};
    j["spec"] = opt.draft ? opt.draft->name() : to_string(SpeculativeMode::off);
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
  auto args = Args::parse(argc, argv,
                          join(join(join(model_options(), sampling_options()), kRemoteOptions), {{"--system", "", true}}));
  if (!args) return report(args.status());
  if (args->has("--help")) {
    std::printf("usage: phaselab-cli chat -m MODEL [--system TEXT] [options]\n"
                "  type a message and press Enter; /reset starts over, /quit (or Ctrl+D) leaves\n%s%s%s%s",
                kEngineHelp, kSamplingHelp, kModelHelp, kRemoteHelp);
    return kExitOk;
  }
  GenerateOptions opt;
  if (Status st = read_generate_options(*args, &opt); !st) return report(st);
  if (args->has("--remote")) return chat_remote(*args, opt);
  auto setup = open_session(*args, 0, true);
  if (!setup) return report(setup.status());
  Session& session = *setup->session;
  const Tokenizer& tok = session.model().tokenizer();
  const ChatFormat& format = setup->chat_format;
  opt.draft = setup->draft.get();
  opt.spec_k = setup->spec_k;

  std::vector<ChatMessage> history;
  if (auto sys = args->get("--system")) history.push_back({"system", *sys});
  const std::string template_name = chat_format_name(format);
  std::fprintf(stderr, "PhaseLab chat with %s (chat format: %s; %s). /reset, /quit.\n", session.model().path().c_str(),
               template_name.c_str(), session.backend().name().c_str());
  chat_loop(history, [&](std::vector<ChatMessage>& h) -> std::optional<std::string> {
    RenderedPrompt rendered = render_prompt(tok, format, PromptInput::chat_of(h));
    std::vector<int32_t>& prompt = rendered.tokens;
    // Keep the conversation inside the context: drop the oldest turns (the
    // system prompt stays) until the prompt leaves room for an answer.
    const int n_ctx = session.n_ctx();
    const int room = std::max(16, std::min(opt.n_predict > 0 ? opt.n_predict : 256, n_ctx / 2));
    int dropped = 0;
    while (static_cast<int>(prompt.size()) + room > n_ctx) {
      auto oldest = std::find_if(h.begin(), h.end() - 1, [](auto& m) { return m.role != "system"; });
      if (oldest == h.end() - 1) break;  // only this message is left
      h.erase(oldest);
      dropped++;
      rendered = render_prompt(tok, format, PromptInput::chat_of(h));
    }
    if (dropped)
      std::fprintf(stderr, "(the %d oldest message%s no longer fit the context of %d tokens and were dropped; "
                           "/reset clears the conversation)\n", dropped, dropped == 1 ? "" : "s", n_ctx);
    if (static_cast<int>(prompt.size()) + 1 > n_ctx) {
      std::fprintf(stderr, "phaselab-cli: error: this message alone is %zu tokens and the context holds %d: "
                           "send a shorter one or start with a larger -c\n", prompt.size(), n_ctx);
      return std::nullopt;
    }
    GenerateOptions turn = opt;  // --stop's strings, then the template's
    for (auto& s : rendered.stop) turn.stop.push_back(s);
    auto res = session.generate(prompt, turn, print_token, &g_cancel);
    if (!res) {
      report(res.status());
      return std::nullopt;
    }
    std::printf("\n");
    print_stats(res->metrics, session.backend().name());
    return std::move(res->text);
  });
  return kExitOk;
}

}  // namespace phaselab::cli
