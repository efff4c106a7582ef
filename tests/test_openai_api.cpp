// The OpenAI API's JSON without a server (engine/serve/openai_api.cpp): every
// field PhaseLab reads parses to the options it means, every other field and
// every bad value is a 400 naming it, batch's dialect and defaults, the
// prompt refused by its byte length before tokenizing, and the response
// shapes of n choices with logprobs (built from a real Scheduler run).
#include <QtTest>

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "phaselab/backend.h"
#include "phaselab/jinja.h"
#include "phaselab/openai_api.h"
#include "phaselab/scheduler.h"
#include "tiny_model.h"

using namespace phaselab;
using namespace phaselab::testing;
using nlohmann::json;

namespace {

std::shared_ptr<const Model> stories() { return shared_stories(); }

// A chat format running a template of the corpus (tests/data/chat-templates),
// its family and call syntax detected as at load.
ChatFormat corpus_format(const char* file) {
  QFile f(QStringLiteral(PHASELAB_TEST_DATA "/chat-templates/") + QString::fromLatin1(file));
  if (!f.open(QIODevice::ReadOnly)) qFatal("no template %s", file);
  const std::string src = f.readAll().toStdString();
  ChatFormat format(detect_chat_template(src));
  format.jinja = std::make_shared<const jinja::Template>(src);
  format.tool_calls = detect_tool_call_syntax(*format.jinja);
  return format;
}

constexpr int kCtx = 512;
const openai::ApiLimits kLimits{kCtx, 256};

openai::Endpoint endpoint_of(int e) { return e == 0 ? openai::Endpoint::chat : openai::Endpoint::completions; }

struct Parsed {
  bool ok = false;
  openai::ParsedRequest pr;
  openai::ApiError err;
};
Parsed parse(openai::Endpoint ep, const std::string& body, const openai::ApiLimits& limits = kLimits) {
  Parsed p;
  p.ok = openai::parse_request(ep, body, stories()->tokenizer(), stories()->chat_template(), limits, &p.pr, &p.err);
  return p;
}
Parsed parse_with(openai::Endpoint ep, const json& body, const openai::RequestDefaults& d,
                  const openai::ApiLimits& limits = kLimits) {
  Parsed p;
  p.ok = openai::parse_request(ep, body, stories()->tokenizer(), stories()->chat_template(), limits, d, &p.pr, &p.err);
  return p;
}

// A chat body asking "hi", with extra fields.
std::string chat(const std::string& extra) {
  return R"({"messages":[{"role":"user","content":"hi"}])" + (extra.empty() ? "" : "," + extra) + "}";
}
std::string completion(const std::string& extra) {
  return R"({"prompt":"Once upon a time")" + (extra.empty() ? "" : "," + extra) + "}";
}

}  // namespace

class TestOpenAiApi : public QObject {
  Q_OBJECT

 private slots:
  // Every field of the accepted list, with a valid value, parses to what it means.
  // A harmony model's reasoning (GenerateResult::reasoning, a token's
  // TokenEvent::reasoning) goes out as reasoning_content beside the answer,
  // in the message and in stream deltas; other answers have no such field.
  void reasoning_goes_out_as_reasoning_content() {
    const openai::ResponseHead h{"id-1", 1, "gpt-oss"};
    GenerateResult r;
    r.text = "Hi.";
    r.reasoning = "The user greets.";
    const json j = openai::response_json(openai::Endpoint::chat, h, {r}, 0, stories()->tokenizer());
    QCOMPARE(j["choices"][0]["message"]["content"].get<std::string>(), std::string("Hi."));
    QCOMPARE(j["choices"][0]["message"]["reasoning_content"].get<std::string>(), std::string("The user greets."));
    r.reasoning.clear();
    const json plain = openai::response_json(openai::Endpoint::chat, h, {r}, 0, stories()->tokenizer());
    QVERIFY(!plain["choices"][0]["message"].contains("reasoning_content"));
    const json d = openai::chunk_json(openai::Endpoint::chat, h, 0, "", false, nullptr, nullptr, 0, "greets")["choices"][0]["delta"];
    QCOMPARE(d["reasoning_content"].get<std::string>(), std::string("greets"));
    QCOMPARE(d["content"].get<std::string>(), std::string());
    QVERIFY(!openai::chunk_json(openai::Endpoint::chat, h, 0, "x", false, nullptr, nullptr)["choices"][0]["delta"].contains(
        "reasoning_content"));
  }

  void every_accepted_field_parses() {
    // (One line per raw string: moc does not read raw strings across lines.)
    Parsed c = parse(openai::Endpoint::chat,
                     chat(std::string(R"("model":"m","stream":true,"stream_options":{"include_usage":true},)") +
                          R"("temperature":0.5,"top_p":0.9,"frequency_penalty":0.1,"presence_penalty":-0.1,"seed":10,)" +
                          R"("n":3,"max_completion_tokens":7,"stop":["x"],"logprobs":true,"top_logprobs":4,)" +
                          R"("logit_bias":{"5":100,"17":-100.0,"3":0.5},"top_k":12,"min_p":0.1,"repeat_penalty":1.2,)" +
                          R"("ignore_eos":true,"user":"u1","metadata":{"k":"v"},"store":false,"service_tier":"auto",)" +
                          R"("response_format":{"type":"text"},"tools":[],"tool_choice":"none",)" +
                          R"("parallel_tool_calls":false,"modalities":["text"])"));
    QVERIFY2(c.ok, c.err.message.c_str());
    const GenerateOptions& o = c.pr.options;
    QCOMPARE(c.pr.model, std::string("m"));
    QVERIFY(c.pr.stream && c.pr.include_usage);
    QCOMPARE(c.pr.n, 3);
    QCOMPARE(o.n_predict, 7);
    QCOMPARE(o.logprobs, 4);
    QVERIFY(o.ignore_eos);
    QCOMPARE(o.sampling.temperature, 0.5f);
    QCOMPARE(o.sampling.top_k, 12);
    QCOMPARE(o.sampling.repeat_penalty, 1.2f);
    QCOMPARE(o.sampling.seed, uint64_t{10});
    const std::set<std::pair<int32_t, float>> bias(o.sampling.logit_bias.begin(), o.sampling.logit_bias.end());
    QCOMPARE(bias, (std::set<std::pair<int32_t, float>>{{5, 100.f}, {17, -100.f}, {3, 0.5f}}));
    QCOMPARE(o.stop.front(), std::string("x"));  // then the template's stop strings

    Parsed p = parse(openai::Endpoint::completions, completion(R"("max_tokens":5,"n":2,"best_of":2,"echo":false,"logprobs":3)"));
    QVERIFY2(p.ok, p.err.message.c_str());
    QCOMPARE(p.pr.n, 2);
    QCOMPARE(p.pr.options.logprobs, 3);
    QCOMPARE(p.pr.options.n_predict, 5);
    // null is absent, as OpenAI's clients send it.
    Parsed nul = parse(openai::Endpoint::completions, completion(R"("logprobs":null,"n":null,"logit_bias":null)"));
    QVERIFY2(nul.ok, nul.err.message.c_str());
    QCOMPARE(nul.pr.options.logprobs, -1);
    QCOMPARE(nul.pr.n, 1);
  }

  // Chat: logprobs (bool) and top_logprobs; completions: logprobs (0..5).
  void logprobs_fields_set_the_alternatives_per_token() {
    QCOMPARE(parse(openai::Endpoint::chat, chat(R"("logprobs":true)")).pr.options.logprobs, 0);
    QCOMPARE(parse(openai::Endpoint::chat, chat(R"("logprobs":true,"top_logprobs":20)")).pr.options.logprobs, 20);
    QCOMPARE(parse(openai::Endpoint::chat, chat(R"("logprobs":false)")).pr.options.logprobs, -1);
    QCOMPARE(parse(openai::Endpoint::chat, chat("")).pr.options.logprobs, -1);
    QCOMPARE(parse(openai::Endpoint::completions, completion(R"("logprobs":0)")).pr.options.logprobs, 0);
    QCOMPARE(parse(openai::Endpoint::completions, completion(R"("logprobs":5)")).pr.options.logprobs, 5);
  }

  // n choices: each its own sequence, seeds seed + i; n > 1 at temperature 0 is allowed.
  void n_choices_get_consecutive_seeds() {
    Parsed p = parse(openai::Endpoint::chat, chat(R"("n":16,"seed":10,"temperature":0)"));
    QVERIFY2(p.ok, p.err.message.c_str());
    QCOMPARE(p.pr.n, 16);
    for (int i = 0; i < p.pr.n; i++) {
      const GenerateOptions o = openai::options_for_choice(p.pr, i);
      QCOMPARE(o.sampling.seed, uint64_t(10 + i));
      QCOMPARE(o.n_predict, p.pr.options.n_predict);
    }
  }

  // A reply's <tool_call> blocks become calls; anything else stays text.
  void tool_calls_are_split_out_of_the_text() {
    const auto split = [](const std::string& t) { return openai::split_tool_calls(t); };
    auto plain = split("  Just text, no <tool_call.  ");
    QCOMPARE(plain.content, std::string("Just text, no <tool_call."));
    QVERIFY(plain.calls.empty());
    auto one = split("Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>");
    QCOMPARE(one.content, std::string("Let me look."));
    QCOMPARE(one.calls.size(), size_t{1});
    QCOMPARE(one.calls[0]["type"].get<std::string>(), std::string("function"));
    QCOMPARE(one.calls[0]["function"]["name"].get<std::string>(), std::string("get_weather"));
    QCOMPARE(json::parse(one.calls[0]["function"]["arguments"].get<std::string>()), json({{"city", "Paris"}}));
    QVERIFY(one.calls[0]["id"].get<std::string>().rfind("call_", 0) == 0);
    // Two calls (ids differ), arguments given as text and as "parameters",
    // the last block unclosed where the reply ended.
    auto two = split("<tool_call>{\"name\":\"a\",\"arguments\":\"{\\\"x\\\":1}\"}</tool_call>\n"
                     "<tool_call>{\"name\":\"b-2\",\"parameters\":{\"y\":[1,2]}}");
    QCOMPARE(two.calls.size(), size_t{2});
    QVERIFY(two.content.empty());
    QCOMPARE(two.calls[0]["function"]["arguments"].get<std::string>(), std::string("{\"x\":1}"));
    QCOMPARE(json::parse(two.calls[1]["function"]["arguments"].get<std::string>()), json({{"y", {1, 2}}}));
    QVERIFY(two.calls[0]["id"] != two.calls[1]["id"]);
    // The arguments' text keeps the model's key order (a client may show it).
    QCOMPARE(split("<tool_call>{\"name\":\"f\",\"arguments\":{\"zone\":\"UTC\",\"at\":3}}</tool_call>")
                 .calls[0]["function"]["arguments"]
                 .get<std::string>(),
             std::string("{\"zone\":\"UTC\",\"at\":3}"));
    // No arguments: an empty object.
    QCOMPARE(split("<tool_call>{\"name\":\"now\"}</tool_call>").calls[0]["function"]["arguments"].get<std::string>(),
             std::string("{}"));
    // Not calls: broken JSON, a name that is not one, no name: kept as written.
    for (const std::string bad : {"<tool_call>{\"name\": \"f\", </tool_call>", "<tool_call>{\"name\": \"a b\"}</tool_call>",
                                  "<tool_call>[1, 2]</tool_call>", "<tool_call>{\"arguments\": {}}</tool_call>"}) {
      auto kept = split("Before " + bad);
      QVERIFY2(kept.calls.empty(), bad.c_str());
      QCOMPARE(kept.content, "Before " + bad);
    }
    // A finish_reason of tool_calls only for a reply that ended by itself.
    GenerateResult r;
    r.metrics.stop_reason = StopReason::eos;
    QCOMPARE(std::string(openai::finish_reason(r, true)), std::string("tool_calls"));
    QCOMPARE(std::string(openai::finish_reason(r, false)), std::string("stop"));
    r.metrics.stop_reason = StopReason::length;
    QCOMPARE(std::string(openai::finish_reason(r, true)), std::string("length"));
  }

  // Streamed: text before a call goes out as it comes (what could still
  // become "<tool_call>" waits), the call's text waits for the end; fed in
  // pieces of every size the result is the same.
  void tool_calls_are_held_back_while_streaming() {
    const std::string reply =
        "Checking <tools> first.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n"
        "</tool_call>";
    for (size_t piece : {size_t{1}, size_t{2}, size_t{5}, size_t{11}, reply.size()}) {
      openai::ToolCallStream st;
      std::string sent;
      for (size_t i = 0; i < reply.size(); i += piece) {
        const std::string out = st.push(std::string_view(reply).substr(i, piece));
        sent += out;
        QVERIFY2(sent.find("<tool_call>") == std::string::npos, "a call's text went out");
      }
      QCOMPARE(sent, std::string("Checking <tools> first.\n"));
      const openai::ToolCallSplit end = st.finish();
      QVERIFY(end.content.empty());
      QCOMPARE(end.calls.size(), size_t{1});
      QCOMPARE(end.calls[0]["function"]["name"].get<std::string>(), std::string("get_weather"));
    }
    // A reply that ends in what might have begun a call sends it at the end.
    openai::ToolCallStream st;
    QCOMPARE(st.push("Look: <tool"), std::string("Look: "));
    const openai::ToolCallSplit end = st.finish();
    QCOMPARE(end.content, std::string("<tool"));
    QVERIFY(end.calls.empty());
    // The chunk that carries calls: each with its index, in the delta.
    const openai::ResponseHead h{"id-1", 1, "qwen"};
    const json c = openai::tool_calls_chunk_json(h, 2, openai::split_tool_calls(reply).calls);
    QCOMPARE(c["choices"][0]["index"].get<int>(), 2);
    QCOMPARE(c["choices"][0]["delta"]["tool_calls"][0]["index"].get<int>(), 0);
    QCOMPARE(c["choices"][0]["delta"]["tool_calls"][0]["function"]["name"].get<std::string>(), std::string("get_weather"));
    GenerateResult r;
    r.metrics.stop_reason = StopReason::eos;
    QCOMPARE(openai::final_chunk_json(openai::Endpoint::chat, h, 2, r, 0, true)["choices"][0]["finish_reason"].get<std::string>(),
             std::string("tool_calls"));
  }

  // With a model's template that teaches <tool_call> (Qwen 3's, from the
  // corpus): the functions offered, an earlier call and its result are
  // rendered by the template (the prompt is its text, tokenized), calls in
  // the answer are parsed out of the whole response.
  void tools_through_the_models_template() {
    const ChatFormat format = corpus_format("Qwen-Qwen3-0.6B.jinja");
    QCOMPARE(format.tool_calls, ToolCallSyntax::hermes);
    const Tokenizer& tok = stories()->tokenizer();
    const openai::ApiLimits limits{4096, 256};  // (the stories vocabulary spells the template's markers out)
    const json tools = json::parse(R"([{"type":"function","function":{"name":"get_weather","description":"The weather.",
        "parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}])");
    json body = {{"messages",
                  {{{"role", "user"}, {"content", "Weather in Paris?"}},
                   {{"role", "assistant"},
                    {"content", nullptr},
                    {"tool_calls",
                     {{{"id", "call_1"}, {"type", "function"},
                       {"function", {{"name", "get_weather"}, {"arguments", "{\"city\": \"Paris\"}"}}}}}}},
                   {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "{\"temp\": 21}"}},
                   {{"role", "user"}, {"content", "And Oslo?"}}}},
                 {"tools", tools}};
    openai::ParsedRequest pr;
    openai::ApiError err;
    QVERIFY2(openai::parse_request(openai::Endpoint::chat, body, tok, format, limits, openai::server_defaults(limits),
                                   &pr, &err),
             err.message.c_str());
    QVERIFY(pr.tool_calls);
    // The template's text: the function's description, the earlier call
    // (its arguments as an object) and the result in their places.
    std::vector<ChatMessage> msgs = {{"user", "Weather in Paris?"}, {"assistant", ""}, {"tool", "{\"temp\": 21}"},
                                     {"user", "And Oslo?"}};
    msgs[1].tool_calls = body["messages"][1]["tool_calls"].dump();
    msgs[2].tool_call_id = "call_1";
    const RenderedChat rc = render_chat(format, msgs, true, tools.dump());
    QVERIFY(rc.from_template);
    QVERIFY2(rc.text.find("\"name\": \"get_weather\"") != std::string::npos, rc.text.c_str());
    QVERIFY2(rc.text.find("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>") !=
                 std::string::npos,
             rc.text.c_str());
    QVERIFY2(rc.text.find("<tool_response>\n{\"temp\": 21}\n</tool_response>") != std::string::npos, rc.text.c_str());
    QVERIFY(pr.prompt == tok.encode(rc.text, true, true));
    // "none": nothing offered, nothing parsed; the earlier turns still render.
    body["tool_choice"] = "none";
    QVERIFY2(openai::parse_request(openai::Endpoint::chat, body, tok, format, limits, openai::server_defaults(limits),
                                   &pr, &err),
             err.message.c_str());
    QVERIFY(!pr.tool_calls);
    body.erase("tool_choice");
    // phaselab-cli batch writes text lines: it refuses functions.
    openai::ApiError berr;
    QVERIFY(!openai::parse_request(openai::Endpoint::chat, body, tok, format, limits,
                                   openai::batch_defaults(GenerateOptions{}), &pr, &berr));
    QCOMPARE(berr.param, std::string("tools"));
    // Bad turns are named.
    const auto refused = [&](json b, const std::string& param, const std::string& says) {
      openai::ApiError e;
      openai::ParsedRequest p;
      QVERIFY(!openai::parse_request(openai::Endpoint::chat, b, tok, format, limits, openai::server_defaults(limits), &p, &e));
      QCOMPARE(e.param, param);
      QVERIFY2(e.message.find(says) != std::string::npos, e.message.c_str());
    };
    json b = body;
    b["messages"][2].erase("tool_call_id");
    refused(b, "messages[2].tool_call_id", "is required");
    b = body;
    b["messages"][1]["tool_calls"][0]["function"]["arguments"] = 5;
    refused(b, "messages[1].tool_calls[0].function.arguments", "JSON text");
    b = body;
    b["messages"][1].erase("tool_calls");
    refused(b, "messages[1].content", "is required");
    b = body;
    b["messages"][1]["tool_calls"] = 5;
    refused(b, "messages[1].tool_calls", "non-empty array");
    // An empty list (some clients send one for a turn without calls) is none.
    b = body;
    b["messages"][1]["tool_calls"] = json::array();
    b["messages"][1]["content"] = "Sure.";
    QVERIFY2(openai::parse_request(openai::Endpoint::chat, b, tok, format, limits, openai::server_defaults(limits), &pr,
                                   &err),
             err.message.c_str());
    // A body as sent: the functions reach the template with their keys in
    // the order sent (Qwen's template writes each as JSON), not sorted.
    const std::string sent = R"({"messages":[{"role":"user","content":"Weather?"}],"tools":[{"type":"function",)"
                             R"("function":{"name":"get_weather","description":"The weather.","parameters":{)"
                             R"("type":"object","properties":{"city":{"type":"string"}}}}}]})";
    QVERIFY2(openai::parse_request(openai::Endpoint::chat, sent, tok, format, limits, &pr, &err), err.message.c_str());
    const RenderedChat in_order = render_chat(format, {{"user", "Weather?"}}, true,
                                              nlohmann::ordered_json::parse(sent)["tools"].dump());
    QVERIFY2(in_order.text.find(R"({"type": "function", "function": {"name": "get_weather", "description")") !=
                 std::string::npos,
             in_order.text.c_str());
    QVERIFY(pr.prompt == tok.encode(in_order.text, true, true));
    // A template that writes no <tool_call> (Gemma 2's): functions refused.
    QFile g(QStringLiteral(PHASELAB_TEST_DATA "/chat-templates/google-gemma-2-2b-it.jinja"));
    QVERIFY(g.open(QIODevice::ReadOnly));
    const std::string gsrc = g.readAll().toStdString();
    ChatFormat gemma(detect_chat_template(gsrc));
    gemma.jinja = std::make_shared<const jinja::Template>(gsrc);
    gemma.tool_calls = detect_tool_call_syntax(*gemma.jinja);
    QCOMPARE(gemma.tool_calls, ToolCallSyntax::none);
    // gpt-oss's (harmony): calls to "functions.NAME", which the answer's
    // text carries as <tool_call> blocks (HarmonyChannels).
    QFile o(QStringLiteral(PHASELAB_TEST_DATA "/chat-templates/openai-gpt-oss-120b.jinja"));
    QVERIFY(o.open(QIODevice::ReadOnly));
    QCOMPARE(detect_tool_call_syntax(jinja::Template(o.readAll().toStdString())), ToolCallSyntax::harmony);
    openai::ApiError ge;
    QVERIFY(!openai::parse_request(openai::Endpoint::chat, json{{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"tools", tools}},
                                   tok, gemma, limits, openai::server_defaults(limits), &pr, &ge));
    QCOMPARE(ge.param, std::string("tools"));
    QVERIFY2(ge.message.find("does not write calls") != std::string::npos, ge.message.c_str());
    // The whole response: content null when only calls are left, the
    // calls, finish_reason tool_calls; without tools the text as it is.
    GenerateResult r;
    r.text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
    r.metrics.stop_reason = StopReason::eos;
    const openai::ResponseHead h{"id-1", 1, "qwen"};
    const json j = openai::response_json(openai::Endpoint::chat, h, {r}, 0, tok, true);
    QVERIFY(j["choices"][0]["message"]["content"].is_null());
    QCOMPARE(j["choices"][0]["message"]["tool_calls"][0]["function"]["name"].get<std::string>(), std::string("get_weather"));
    QCOMPARE(j["choices"][0]["finish_reason"].get<std::string>(), std::string("tool_calls"));
    const json t = openai::response_json(openai::Endpoint::chat, h, {r}, 0, tok, false);
    QCOMPARE(t["choices"][0]["message"]["content"].get<std::string>(), r.text);
    QCOMPARE(t["choices"][0]["finish_reason"].get<std::string>(), std::string("stop"));
  }

  // Llama 3.x's template (from the corpus) teaches a reply that is one bare
  // JSON object {"name", "parameters"}: a request offering functions is
  // accepted, and a reply is a call only when it is nothing but such an
  // object naming an offered function (an answer in JSON stays text),
  // whole or streamed.
  void bare_json_calls_of_llama_3() {
    const ChatFormat format = corpus_format("meta-llama-Llama-3.2-3B-Instruct.jinja");
    QCOMPARE(format.tool_calls, ToolCallSyntax::json);
    const Tokenizer& tok = stories()->tokenizer();
    const openai::ApiLimits limits{8192, 256};
    const json tools = json::parse(R"([{"type":"function","function":{"name":"get_weather","description":"The weather.",
        "parameters":{"type":"object","properties":{"city":{"type":"string"}}}}},
        {"type":"function","function":{"name":"get_time","parameters":{"type":"object","properties":{}}}}])");
    json body = {{"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}}, {"tools", tools}};
    openai::ParsedRequest pr;
    openai::ApiError err;
    QVERIFY2(openai::parse_request(openai::Endpoint::chat, body, tok, format, limits, openai::server_defaults(limits),
                                   &pr, &err),
             err.message.c_str());
    QVERIFY(pr.tool_calls && pr.bare_json_calls);
    QCOMPARE(pr.tool_names, (std::vector<std::string>{"get_weather", "get_time"}));

    const std::vector<std::string>& offered = pr.tool_names;
    const std::string call = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"unit\": \"C\"}}";
    openai::ToolCallSplit s = openai::split_bare_json_call("\n " + call + " \n", offered);
    QCOMPARE(s.content, std::string());
    QCOMPARE(s.calls.size(), size_t(1));
    QCOMPARE(s.calls[0]["function"]["name"].get<std::string>(), std::string("get_weather"));
    QCOMPARE(json::parse(s.calls[0]["function"]["arguments"].get<std::string>()), json::parse(R"({"city": "Paris", "unit": "C"})"));
    // "arguments" as some fine-tunes write it
    QCOMPARE(openai::split_bare_json_call(R"({"name": "get_time", "arguments": {}})", offered).calls.size(), size_t(1));
    // Not calls: a function not offered, text around the object, two objects.
    for (const std::string& text : {std::string(R"({"name": "Alice", "parameters": {"age": 3}})"), "Sure: " + call,
                                    call + " done", call + call}) {
      const openai::ToolCallSplit n = openai::split_bare_json_call(text, offered);
      QVERIFY2(n.calls.empty(), text.c_str());
      QCOMPARE(n.content, text);
    }

    // Streamed: a reply starting with '{' is held to the end; one starting
    // with text goes out as it comes (its leading whitespace with it).
    openai::ToolCallStream st(offered);
    QCOMPARE(st.push(" \n"), std::string());
    QCOMPARE(st.push(call.substr(0, 9)), std::string());
    QCOMPARE(st.push(call.substr(9)), std::string());
    const openai::ToolCallSplit done = st.finish();
    QCOMPARE(done.calls.size(), size_t(1));
    QCOMPARE(done.content, std::string());
    openai::ToolCallStream text(offered);
    QCOMPARE(text.push(" "), std::string());
    QCOMPARE(text.push("It is"), std::string(" It is"));
    QCOMPARE(text.push(" {sunny}"), std::string(" {sunny}"));
    QVERIFY(text.finish().calls.empty());
    openai::ToolCallStream json_answer(offered);  // an object naming nothing offered: its text at the end
    QCOMPARE(json_answer.push(R"({"name": "Alice"})"), std::string());
    const openai::ToolCallSplit a = json_answer.finish();
    QVERIFY(a.calls.empty());
    QCOMPARE(a.content, std::string(R"({"name": "Alice"})"));

    // The whole response.
    GenerateResult r;
    r.text = call;
    r.metrics.stop_reason = StopReason::eos;
    const openai::ResponseHead h{"id-1", 1, "llama"};
    const json j = openai::response_json(openai::Endpoint::chat, h, {r}, 0, tok, true, &offered);
    QVERIFY(j["choices"][0]["message"]["content"].is_null());
    QCOMPARE(j["choices"][0]["message"]["tool_calls"][0]["function"]["name"].get<std::string>(), std::string("get_weather"));
    QCOMPARE(j["choices"][0]["finish_reason"].get<std::string>(), std::string("tool_calls"));
  }

  void bad_fields_are_named_data() {
    QTest::addColumn<int>("endpoint");  // 0 chat, 1 completions
    QTest::addColumn<QString>("extra");
    QTest::addColumn<QString>("param");
    QTest::addColumn<QString>("says");  // a piece of the message
    auto row = [](const char* name, int ep, const char* extra, const char* param, const char* says) {
      QTest::newRow(name) << ep << QString(extra) << QString(param) << QString(says);
    };
    // Fields PhaseLab does not read.
    row("unknown", 0, R"("frobnicate":1)", "frobnicate", "is not supported by PhaseLab's server");
    row("functions", 0, R"("functions":[])", "functions", "is not supported");
    row("suffix", 1, R"("suffix":"x")", "suffix", "is not supported");
    row("prompt in chat", 0, R"("prompt":"x")", "prompt", "field of /v1/completions");
    row("messages in completions", 1, R"("messages":[])", "messages", "field of /v1/chat/completions");
    row("top_logprobs in completions", 1, R"("top_logprobs":2)", "top_logprobs", "field of /v1/chat/completions");
    row("echo in chat", 0, R"("echo":false)", "echo", "field of /v1/completions");
    // n.
    row("n zero", 0, R"("n":0)", "n", "from 1 to 16");
    row("n seventeen", 0, R"("n":17)", "n", "(got 17)");
    row("n float", 1, R"("n":1.5)", "n", "integer");
    row("best_of not n", 1, R"("n":2,"best_of":3)", "best_of", "must equal n");
    // logprobs.
    row("chat logprobs int", 0, R"("logprobs":3)", "logprobs", "true or false");
    row("top_logprobs alone", 0, R"("top_logprobs":2)", "top_logprobs", "'logprobs': true");
    row("top_logprobs with false", 0, R"("logprobs":false,"top_logprobs":2)", "top_logprobs", "'logprobs': true");
    row("top_logprobs 21", 0, R"("logprobs":true,"top_logprobs":21)", "top_logprobs", "from 0 to 20");
    row("completions logprobs 6", 1, R"("logprobs":6)", "logprobs", "from 0 to 5");
    row("completions logprobs bool", 1, R"("logprobs":true)", "logprobs", "integer from 0 to 5");
    row("echo", 1, R"("echo":true)", "echo", "never repeats the prompt");
    // logit_bias.
    row("bias not object", 0, R"("logit_bias":[1])", "logit_bias", "must be an object");
    row("bias word", 0, R"("logit_bias":{"abc":1})", "logit_bias", "'abc'");
    row("bias outside vocab", 0, R"("logit_bias":{"512":1})", "logit_bias", "'512'");
    row("bias negative id", 1, R"("logit_bias":{"-1":1})", "logit_bias", "'-1'");
    row("bias leading zero", 1, R"("logit_bias":{"07":1})", "logit_bias", "'07'");
    row("bias too big", 0, R"("logit_bias":{"7":101})", "logit_bias", "from -100 to 100");
    row("bias string", 0, R"("logit_bias":{"7":"up"})", "logit_bias", "from -100 to 100");
    // response_format and the client-description fields.
    row("json_object", 0, R"("response_format":{"type":"json_object"})", "response_format", "does not constrain output yet");
    row("json_schema", 0, R"("response_format":{"type":"json_schema","json_schema":{}})", "response_format", "does not constrain output yet");
    row("format string", 0, R"("response_format":"text")", "response_format", "must be an object");
    // Functions offered: refused where the model cannot be told of them
    // (the stories model has no template of its own; test
    // tools_through_the_models_template has one), or a call forced.
    row("tool_choice required", 0, R"("tool_choice":"required")", "tool_choice", "cannot force a call");
    row("tool_choice named", 0, R"("tool_choice":{"type":"function","function":{"name":"f"}})", "tool_choice",
        "cannot force a call");
    row("tool_choice word", 0, R"("tool_choice":"sometimes")", "tool_choice", "\"auto\" or \"none\"");
    row("tools not functions", 0, R"("tools":[{"type":"function"}])", "tools[0]", "must be {");
    row("tools object", 0, R"("tools":{"type":"function"})", "tools", "must be an array");
    row("tool name with a space", 0, R"("tools":[{"type":"function","function":{"name":"get weather"}}])",
        "tools[0].function.name", "letters, digits");
    row("tool parameters string", 0, R"("tools":[{"type":"function","function":{"name":"f","parameters":"x"}}])",
        "tools[0].function.parameters", "JSON Schema object");
    row("tools without a template", 0, R"("tools":[{"type":"function","function":{"name":"f"}}])", "tools",
        "no chat template of its own");
    row("audio", 0, R"("modalities":["text","audio"])", "modalities", "[\"text\"]");
    row("user number", 0, R"("user":5)", "user", "must be a string");
    row("metadata string", 0, R"("metadata":"x")", "metadata", "must be an object");
    row("store string", 1, R"("store":"yes")", "store", "true or false");
    row("ignore_eos string", 1, R"("ignore_eos":"yes")", "ignore_eos", "true or false");
    // An unsigned value beyond INT64_MAX is shown as sent, not wrapped.
    row("max_tokens 2^63", 0, R"("max_tokens":9223372036854775808)", "max_tokens", "(got 9223372036854775808)");
    row("top_k 2^64-1", 1, R"("top_k":18446744073709551615)", "top_k", "(got 18446744073709551615)");
    row("max_tokens -2^63", 1, R"("max_tokens":-9223372036854775808)", "max_tokens", "(got -9223372036854775808)");
  }
  void bad_fields_are_named() {
    QFETCH(int, endpoint);
    QFETCH(QString, extra);
    QFETCH(QString, param);
    QFETCH(QString, says);
    const std::string body = endpoint == 0 ? chat(extra.toStdString()) : completion(extra.toStdString());
    Parsed p = parse(endpoint_of(endpoint), body);
    QVERIFY(!p.ok);
    QCOMPARE(p.err.http_status, 400);
    QCOMPARE(QString::fromStdString(p.err.param), param);
    QVERIFY2(p.err.message.find("'" + param.toStdString() + "'") != std::string::npos, p.err.message.c_str());
    QVERIFY2(p.err.message.find(says.toStdString()) != std::string::npos, p.err.message.c_str());
    QVERIFY2(p.err.message.find("-9223372036854775808") == std::string::npos || extra.contains("-9223372036854775808"),
             p.err.message.c_str());
  }

  // The final check of the sampling parameters blames no field of the
  // request when a default is out of range (it once named "temperature").
  // 100000 nested arrays were parsed into as many nested values (31 MB in
  // the server, and a deep recursion to destroy them): refused while parsing.
  void deep_nesting_is_refused_while_parsing() {
    const Parsed p = parse(openai::Endpoint::completions, std::string(100000, '[') + std::string(100000, ']'));
    QVERIFY(!p.ok);
    QCOMPARE(p.err.http_status, 400);
    QVERIFY2(p.err.message.find("nested deeper than") != std::string::npos, p.err.message.c_str());
    std::string deep = "{\"prompt\": \"x\", \"metadata\": " + std::string(40, '[') + std::string(40, ']') + "}";
    QVERIFY(!parse(openai::Endpoint::completions, deep).ok);
    std::string ok_depth = "{\"prompt\": \"x\", \"metadata\": {\"a\": " + std::string(20, '[') + std::string(20, ']') + "}}";
    nlohmann::json j;
    std::string why;
    QVERIFY2(openai::parse_json(ok_depth, &j, &why), why.c_str());
  }

  void a_bad_default_blames_no_field() {
    openai::RequestDefaults d = openai::server_defaults(kLimits);
    d.options.sampling.repeat_penalty = 0.f;
    Parsed p = parse_with(openai::Endpoint::completions, json::parse(completion(R"("temperature":0.5)")), d);
    QVERIFY(!p.ok);
    QCOMPARE(p.err.http_status, 400);
    QVERIFY2(p.err.param.empty(), p.err.param.c_str());
    QVERIFY2(p.err.message.find("repeat penalty") != std::string::npos, p.err.message.c_str());
  }

  // A prompt whose bytes alone prove it too long for the context is refused
  // with context_length_exceeded before it is tokenized (a 40 MB prompt was
  // tokenized for 19.5 s first); one just under the bound is tokenized and
  // judged by its tokens.
  void a_prompt_too_long_in_bytes_is_refused_before_tokenizing() {
    const size_t per = stories()->tokenizer().max_token_text_bytes();
    QVERIFY(per > 0);
    const openai::ApiLimits small{64, 16};
    auto body_of = [](openai::Endpoint ep, const std::string& text) {
      return ep == openai::Endpoint::chat ? json{{"messages", {{{"role", "user"}, {"content", text}}}}}.dump()
                                          : json{{"prompt", text}}.dump();
    };
    for (auto ep : {openai::Endpoint::completions, openai::Endpoint::chat}) {
      const char* field = ep == openai::Endpoint::chat ? "messages" : "prompt";
      // Bytes for n_ctx tokens at the most: refused by the byte count.
      Parsed over = parse(ep, body_of(ep, std::string(small.n_ctx * per, 'a')), small);
      QVERIFY(!over.ok);
      QCOMPARE(over.err.code, std::string("context_length_exceeded"));
      QCOMPARE(QString::fromStdString(over.err.param), QString(field));
      QVERIFY2(over.err.message.find("bytes") != std::string::npos, over.err.message.c_str());
      // Just under: tokenized, and refused by its token count (a text of
      // 'a's is about a token a byte).
      if (ep == openai::Endpoint::completions) {
        Parsed under = parse(ep, body_of(ep, std::string(small.n_ctx * per - 1, 'a')), small);
        QVERIFY(!under.ok);
        QCOMPARE(under.err.code, std::string("context_length_exceeded"));
        QVERIFY2(under.err.message.find("bytes") == std::string::npos, under.err.message.c_str());
        QVERIFY2(under.err.message.find("tokens") != std::string::npos, under.err.message.c_str());
      }
    }
    // A short prompt still fits.
    QVERIFY(parse(openai::Endpoint::completions, body_of(openai::Endpoint::completions, "Once"), small).ok);
    // 32 MB: refused by its byte count, i.e. before the tokenizer sees it
    // (the message names the bytes; a refusal after tokenizing names only
    // tokens, as "under" above shows). No clock: under a sanitizer the JSON
    // parse alone takes seconds.
    const std::string huge = "{\"prompt\":\"" + std::string(32u << 20, 'a') + "\"}";
    Parsed big = parse(openai::Endpoint::completions, huge);
    QVERIFY(!big.ok);
    QCOMPARE(big.err.code, std::string("context_length_exceeded"));
    QVERIFY2(big.err.message.find(std::to_string(32u << 20) + " bytes") != std::string::npos, big.err.message.c_str());
  }

  // phaselab-cli batch's dialect: its own defaults (the CLI's flags, its
  // seed), "n" as the token limit, the server's ranges for every field.
  void batch_dialect_takes_its_defaults_and_n() {
    openai::RequestDefaults d;
    d.batch_dialect = true;
    d.random_seed = false;
    d.options.n_predict = 33;
    d.options.sampling.temperature = 0.7f;
    d.options.sampling.top_k = 40;
    d.options.sampling.seed = 1234;
    d.options.ignore_eos = true;
    const openai::ApiLimits limits{kCtx, 1 << 20};
    Parsed a = parse_with(openai::Endpoint::completions, json{{"prompt", "Once"}}, d, limits);
    QVERIFY2(a.ok, a.err.message.c_str());
    QCOMPARE(a.pr.options.n_predict, 33);
    QCOMPARE(a.pr.options.sampling.temperature, 0.7f);
    QCOMPARE(a.pr.options.sampling.top_k, 40);
    QCOMPARE(a.pr.options.sampling.seed, uint64_t{1234});
    QVERIFY(a.pr.options.ignore_eos);
    QCOMPARE(a.pr.n, 1);
    Parsed n = parse_with(openai::Endpoint::completions, json{{"prompt", "Once"}, {"n", 500000}}, d, limits);
    QVERIFY2(n.ok, n.err.message.c_str());
    QCOMPARE(n.pr.options.n_predict, 500000);
    QCOMPARE(n.pr.n, 1);
    Parsed both = parse_with(openai::Endpoint::completions, json{{"prompt", "Once"}, {"n", 5}, {"max_tokens", 5}}, d, limits);
    QVERIFY(!both.ok);
    QCOMPARE(both.err.param, std::string("n"));
    for (const json& bad : {json{{"prompt", "Once"}, {"stop", ""}}, json{{"prompt", "Once"}, {"temperature", 3}},
                            json{{"prompt", "Once"}, {"frobnicate", 1}}, json{{"prompt", "Once"}, {"logprobs", 2}}}) {
      Parsed b = parse_with(openai::Endpoint::completions, bad, d, limits);
      QVERIFY2(!b.ok, bad.dump().c_str());
      QVERIFY2(b.err.message.find("phaselab-cli serve") == std::string::npos, b.err.message.c_str());
    }
    Parsed unknown = parse_with(openai::Endpoint::completions, json{{"prompt", "Once"}, {"frobnicate", 1}}, d, limits);
    QVERIFY2(unknown.err.message.find("phaselab-cli batch") != std::string::npos, unknown.err.message.c_str());
  }

  // A batch line picks its endpoint by its field ("prompt" or "messages",
  // exactly one) and is read by the same parser, with batch_defaults.
  void batch_line_is_read_by_the_servers_parser() {
    GenerateOptions flags;
    flags.n_predict = 21;
    flags.sampling.seed = 77;
    const openai::RequestDefaults d = openai::batch_defaults(flags);
    QVERIFY(d.batch_dialect);
    QVERIFY(!d.random_seed);
    const openai::ApiLimits limits{kCtx, 1 << 20};
    auto line = [&](const std::string& text) {
      Parsed p;
      p.ok = openai::parse_batch_line(text, stories()->tokenizer(), stories()->chat_template(), limits, d, &p.pr, &p.err);
      return p;
    };
    Parsed text = line(R"({"prompt":"Once upon a time","n":5})");
    QVERIFY2(text.ok, text.err.message.c_str());
    QVERIFY(text.pr.endpoint == openai::Endpoint::completions);
    QCOMPARE(text.pr.options.n_predict, 5);
    QCOMPARE(text.pr.options.sampling.seed, uint64_t{77});
    Parsed same = parse_with(openai::Endpoint::completions, json{{"prompt", "Once upon a time"}, {"n", 5}}, d, limits);
    QVERIFY(same.ok);
    QCOMPARE(text.pr.prompt, same.pr.prompt);
    Parsed chat_line = line(R"({"messages":[{"role":"user","content":"hi"}]})");
    QVERIFY2(chat_line.ok, chat_line.err.message.c_str());
    QVERIFY(chat_line.pr.endpoint == openai::Endpoint::chat);
    QCOMPARE(chat_line.pr.options.n_predict, 21);
    for (const char* bad : {"{", "[1]", R"({"n":3})", R"({"prompt":"a","messages":[]})"}) {
      Parsed b = line(bad);
      QVERIFY2(!b.ok && !b.err.message.empty(), bad);
    }
    QCOMPARE(line("[1]").err.message, std::string("not a JSON object"));
  }

  // Two choices with logprobs from a real Scheduler run, written as OpenAI
  // does: chat {"content": [{token, logprob, bytes, top_logprobs}]},
  // completions {tokens, token_logprobs, top_logprobs (with the chosen
  // token), text_offset}; usage counts the prompt once; streamed chunks
  // carry their tokens' entries; the one-choice calls are unchanged.
  void responses_carry_choices_and_logprobs() {
    const Tokenizer& tok = stories()->tokenizer();
    for (auto ep : {openai::Endpoint::chat, openai::Endpoint::completions}) {
      const std::string body = ep == openai::Endpoint::chat
                                   ? chat(R"("n":2,"seed":3,"max_tokens":12,"logprobs":true,"top_logprobs":3)")
                                   : completion(R"("n":2,"seed":3,"max_tokens":12,"logprobs":3)");
      Parsed p = parse(ep, body);
      QVERIFY2(p.ok, p.err.message.c_str());
      SchedulerOptions so;
      so.n_ctx = kCtx;
      auto b = make_cpu_backend(stories(), 2, 64);
      QVERIFY(b.is_ok());
      auto s = Scheduler::create(stories(), std::move(*b), so);
      QVERIFY(s.is_ok());
      std::vector<std::vector<TokenLogprob>> streamed(p.pr.n);
      for (int i = 0; i < p.pr.n; i++) {
        BatchRequest r{p.pr.prompt, openai::options_for_choice(p.pr, i),
                       [&, i](const TokenEvent& e) { streamed[i].push_back(*e.logprob); }};
        QVERIFY((*s)->submit(std::move(r)).is_ok());
      }
      QVERIFY((*s)->run());
      auto outs = (*s)->take_finished();
      QCOMPARE(outs.size(), size_t{2});
      std::sort(outs.begin(), outs.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
      std::vector<GenerateResult> choices = {outs[0].result, outs[1].result};

      const openai::ResponseHead h{"id-1", 1, "stories260K"};
      const json j = openai::response_json(ep, h, choices, 0, tok);
      QCOMPARE(j["choices"].size(), size_t{2});
      QCOMPARE(j["usage"]["prompt_tokens"].get<int>(), static_cast<int>(p.pr.prompt.size()));
      QCOMPARE(j["usage"]["completion_tokens"].get<int>(),
               choices[0].metrics.n_generated + choices[1].metrics.n_generated);
      for (int i = 0; i < 2; i++) {
        const json& c = j["choices"][i];
        const GenerateResult& r = choices[i];
        QCOMPARE(c["index"].get<int>(), i);
        const size_t n = openai::logprob_tokens(r);
        QCOMPARE(n, r.tokens.size() - (r.metrics.stop_reason == StopReason::eos ? 1 : 0));
        QCOMPARE(streamed[i].size(), n);  // events: every token but an ending end-of-generation one
        if (ep == openai::Endpoint::chat) {
          const json& content = c["logprobs"]["content"];
          QCOMPARE(content.size(), n);
          for (size_t t = 0; t < n; t++) {
            const std::string piece = tok.token_to_piece(r.tokens[t], true);
            QCOMPARE(content[t]["token"].get<std::string>(), piece);
            QCOMPARE(content[t]["logprob"].get<double>(), static_cast<double>(r.logprobs[t].logprob));
            QCOMPARE(content[t]["bytes"].size(), piece.size());
            QCOMPARE(content[t]["top_logprobs"].size(), size_t{3});
            QCOMPARE(content[t]["top_logprobs"][0]["logprob"].get<double>(), static_cast<double>(r.logprobs[t].top[0].second));
          }
        } else {
          const json& lp = c["logprobs"];
          QCOMPARE(lp["tokens"].size(), n);
          QCOMPARE(lp["token_logprobs"].size(), n);
          QCOMPARE(lp["text_offset"].size(), n);
          std::string text;
          for (size_t t = 0; t < n; t++) {
            QCOMPARE(lp["text_offset"][t].get<size_t>(), openai::utf8_chars(text));
            text += tok.token_to_piece(r.tokens[t]);
            const json& top = lp["top_logprobs"][t];
            QVERIFY(top.size() >= 3 && top.size() <= 4);  // 3 alternatives and the chosen token
            QCOMPARE(top[lp["tokens"][t].get<std::string>()].get<double>(), static_cast<double>(r.logprobs[t].logprob));
          }
          if (r.metrics.stop_reason != StopReason::stop_string) QCOMPARE(text, r.text);
        }
        // A streamed chunk carries the entries of its tokens, as the whole response does.
        const json chunk = openai::chunk_json(ep, h, i, "x", false, &streamed[i], &tok, 0);
        QCOMPARE(chunk["choices"][0]["index"].get<int>(), i);
        QCOMPARE(chunk["choices"][0]["logprobs"], c["logprobs"]);
        QVERIFY(openai::chunk_json(ep, h, i, "x", false, nullptr, nullptr)["choices"][0]["logprobs"].is_null());
        QCOMPARE(openai::final_chunk_json(ep, h, i, r, 0)["choices"][0]["index"].get<int>(), i);
      }
      const json usage = openai::usage_chunk_json(ep, h, {choices[0].metrics, choices[1].metrics});
      QCOMPARE(usage["usage"], j["usage"]);
    }
  }

  // JSON has no infinity: an impossible token's log-probability is -9999.0,
  // as OpenAI writes it; a trailing end-of-generation token is not listed.
  void impossible_tokens_and_the_end_token() {
    const Tokenizer& tok = stories()->tokenizer();
    GenerateResult r;
    r.tokens = {300, tok.eos()};
    r.logprobs = {{300, -INFINITY, {{301, -0.5f}}}, {tok.eos(), -1.f, {}}};
    r.metrics.stop_reason = StopReason::eos;
    const openai::ResponseHead h{"id", 1, "m"};
    const json c = openai::response_json(openai::Endpoint::chat, h, {r}, 0, tok)["choices"][0]["logprobs"]["content"];
    QCOMPARE(c.size(), size_t{1});
    QCOMPARE(c[0]["logprob"].get<double>(), -9999.0);
    QCOMPARE(c[0]["top_logprobs"][0]["logprob"].get<double>(), -0.5);
    r.metrics.stop_reason = StopReason::length;
    QCOMPARE(openai::logprob_tokens(r), size_t{2});
  }
};

QTEST_GUILESS_MAIN(TestOpenAiApi)
#include "test_openai_api.moc"
