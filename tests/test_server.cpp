// The OpenAI-compatible server and the remote client, over real HTTP on
// loopback: request validation (each bad field named), greedy answers equal
// to a solo Session run, streaming equal to the whole answer, eight
// concurrent streams each equal to its solo run (and sharing passes), a
// client that disconnects freeing its blocks, the safety checks (bind
// policy, API key, Host, Origin, body size) and the Prometheus text.
#include <httplib.h>

#include <QtTest>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <nlohmann/json.hpp>
#include <thread>

#include "phaselab/backend.h"
#include "phaselab/chat_template.h"
#include "phaselab/http_server.h"
#include "phaselab/openai_api.h"
#include "phaselab/openai_server.h"
#include "phaselab/remote_client.h"
#include "phaselab/scheduler.h"
#include "phaselab/session.h"
#include "tiny_model.h"

using namespace phaselab;
using namespace phaselab::testing;
using nlohmann::json;

namespace {

std::shared_ptr<const Model> stories() { return shared_stories(); }

std::unique_ptr<Backend> cpu(int max_batch = 64) {
  auto b = make_cpu_backend(stories(), 2, max_batch);
  if (!b) qFatal("%s", b.status().message().c_str());
  return std::move(*b);
}

constexpr int kCtx = 512;

std::unique_ptr<OpenAiServer> start_server(ServerOptions so = {}, std::shared_ptr<const Model> model = nullptr,
                                           int n_ctx = kCtx) {
  if (!model) model = stories();
  SchedulerOptions o;
  o.n_ctx = n_ctx;
  o.kv_positions = 4 * n_ctx;
  o.max_seqs = 8;
  auto b = make_cpu_backend(model, 2, 64);
  if (!b) qFatal("%s", b.status().message().c_str());
  auto s = Scheduler::create(model, std::move(*b), o);
  if (!s) qFatal("%s", s.status().message().c_str());
  so.port = 0;
  auto srv = OpenAiServer::create(std::move(*s), so);
  if (!srv) qFatal("%s", srv.status().message().c_str());
  if (Status st = (*srv)->start(); !st) qFatal("%s", st.message().c_str());
  return std::move(*srv);
}

// The answer Session::generate gives alone: the oracle of every served answer.
std::string solo(const std::vector<int32_t>& prompt, const GenerateOptions& opt) {
  auto s = Session::create(stories(), cpu(), kCtx);
  if (!s) qFatal("%s", s.status().message().c_str());
  auto r = (*s)->generate(prompt, opt);
  if (!r) qFatal("%s", r.status().message().c_str());
  return r->text;
}

std::vector<int32_t> chat_prompt(const std::string& user, GenerateOptions* opt) {
  const auto family = stories()->chat_template();
  for (auto& s : chat_stop_strings(family)) opt->stop.push_back(s);
  return stories()->tokenizer().encode(apply_chat_template(family, {{"user", user}}), true, true);
}

httplib::Headers json_headers() { return {{"Content-Type", "application/json"}}; }

// Streams a request; the concatenated text, the parsed events, and whether
// "[DONE]" ended it. stop_after: close the connection after that many text events.
struct Streamed {
  std::string text;
  std::vector<json> events;
  bool done = false;
  int status = 0;
};
Streamed stream(httplib::Client& c, const std::string& path, json body, int stop_after = -1,
                const httplib::Headers& extra = {}) {
  body["stream"] = true;
  Streamed out;
  std::string pending;
  int n_text = 0;
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.headers = extra;
  req.set_header("Content-Type", "application/json");
  req.body = body.dump();
  req.response_handler = [&](const httplib::Response& r) {
    out.status = r.status;
    return true;
  };
  req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
    pending.append(d, n);
    for (size_t e; (e = pending.find("\n\n")) != std::string::npos;) {
      const std::string ev = pending.substr(0, e);
      pending.erase(0, e + 2);
      if (ev.rfind("data: ", 0) != 0) continue;
      const std::string data = ev.substr(6);
      if (data == "[DONE]") {
        out.done = true;
        continue;
      }
      json j = json::parse(data);
      out.events.push_back(j);
      if (j.contains("choices") && !j["choices"].empty()) {
        const json& ch = j["choices"][0];
        std::string t;
        if (ch.contains("delta") && ch["delta"].contains("content")) t = ch["delta"]["content"].get<std::string>();
        if (ch.contains("text")) t = ch["text"].get<std::string>();
        out.text += t;
        if (!t.empty() && ++n_text == stop_after) return false;
      }
    }
    return true;
  };
  httplib::Response res;
  httplib::Error err;
  c.send(req, res, err);
  return out;
}

double metric(const std::string& text, const std::string& name) {
  const size_t p = text.find("\n" + name + " ");
  if (p == std::string::npos) return -1;
  return std::stod(text.substr(p + name.size() + 2));
}

}  // namespace

class TestServer : public QObject {
  Q_OBJECT

 private slots:
  void apiRejectsBadFields_data() {
    QTest::addColumn<int>("endpoint");  // 0 chat, 1 completions
    QTest::addColumn<QString>("body");
    QTest::addColumn<QString>("param");
    auto row = [](const char* name, int ep, const char* body, const char* param) {
      QTest::newRow(name) << ep << QString(body) << QString(param);
    };
    row("no messages", 0, R"({"model":"x"})", "messages");
    row("empty messages", 0, R"({"messages":[]})", "messages");
    row("bad role", 0, R"({"messages":[{"role":"robot","content":"hi"}]})", "messages[0].role");
    row("content not text", 0, R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})", "messages[0].content");
    row("temperature high", 0, R"({"messages":[{"role":"user","content":"hi"}],"temperature":3})", "temperature");
    row("temperature string", 0, R"({"messages":[{"role":"user","content":"hi"}],"temperature":"hot"})", "temperature");
    row("top_p zero", 0, R"({"messages":[{"role":"user","content":"hi"}],"top_p":0})", "top_p");
    row("max_tokens zero", 0, R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":0})", "max_tokens");
    row("max_tokens over cap", 0, R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":100000})", "max_tokens");
    row("n seventeen", 0, R"({"messages":[{"role":"user","content":"hi"}],"n":17})", "n");  // 1..16 choices
    row("stop number", 0, R"({"messages":[{"role":"user","content":"hi"}],"stop":5})", "stop");
    row("presence", 0, R"({"messages":[{"role":"user","content":"hi"}],"presence_penalty":7})", "presence_penalty");
    row("stream string", 0, R"({"messages":[{"role":"user","content":"hi"}],"stream":"yes"})", "stream");
    row("logprobs not bool", 0, R"({"messages":[{"role":"user","content":"hi"}],"logprobs":3})", "logprobs");
    row("top_logprobs alone", 0, R"({"messages":[{"role":"user","content":"hi"}],"top_logprobs":2})", "top_logprobs");
    row("unknown field", 1, R"({"prompt":"hi","suffix":"x"})", "suffix");
    row("seed float", 1, R"({"prompt":"hi","seed":1.5})", "seed");
    row("no prompt", 1, R"({"max_tokens":4})", "prompt");
    row("prompt object", 1, R"({"prompt":{"a":1}})", "prompt");
    row("prompt bad id", 1, R"({"prompt":[1,2,999999]})", "prompt");
    row("prompt too long", 1, R"({"prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]})", "prompt");
  }
  void apiRejectsBadFields() {
    QFETCH(int, endpoint);
    QFETCH(QString, body);
    QFETCH(QString, param);
    openai::ParsedRequest pr;
    openai::ApiError err;
    const openai::ApiLimits limits{16, 64};  // a 16-position context makes "prompt too long" cheap
    QVERIFY(!openai::parse_request(endpoint == 0 ? openai::Endpoint::chat : openai::Endpoint::completions,
                                   body.toStdString(), stories()->tokenizer(), stories()->chat_template(), limits, &pr,
                                   &err));
    QCOMPARE(err.http_status, 400);
    QCOMPARE(QString::fromStdString(err.param), param);
    QVERIFY2(err.message.find(param.toStdString()) != std::string::npos, err.message.c_str());
    const json j = json::parse(openai::error_body(err));
    QCOMPARE(QString::fromStdString(j["error"]["param"].get<std::string>()), param);
    QVERIFY(j["error"]["message"].is_string());
  }

  void apiDefaultsAreOpenAis() {
    openai::ParsedRequest pr;
    openai::ApiError err;
    QVERIFY(openai::parse_request(openai::Endpoint::chat,
                                  R"({"messages":[{"role":"developer","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hi"}]}]})",
                                  stories()->tokenizer(), stories()->chat_template(), {kCtx, 100}, &pr, &err));
    QCOMPARE(pr.options.sampling.temperature, 1.0f);
    QCOMPARE(pr.options.sampling.top_p, 1.0f);
    QCOMPARE(pr.options.sampling.top_k, 0);
    QCOMPARE(pr.options.sampling.min_p, 0.0f);
    QCOMPARE(pr.options.n_predict, 100);
    QVERIFY(!pr.stream);
    GenerateOptions expect;
    const auto family = stories()->chat_template();
    const auto want = stories()->tokenizer().encode(
        apply_chat_template(family, {{"system", "be brief"}, {"user", "hi"}}), true, true);
    QCOMPARE(pr.prompt, want);
    QCOMPARE(pr.options.stop, chat_stop_strings(family));
    // Token ids are a prompt too.
    QVERIFY(openai::parse_request(openai::Endpoint::completions, R"({"prompt":[1,2,3],"max_tokens":5,"temperature":0,"stream":true})",
                                  stories()->tokenizer(), family, {kCtx, 100}, &pr, &err));
    QCOMPARE(pr.prompt, (std::vector<int32_t>{1, 2, 3}));
    QCOMPARE(pr.options.n_predict, 5);
    QVERIFY(pr.options.sampling.greedy());
    QVERIFY(pr.stream);
  }

  void bindPolicy() {
    QVERIFY(check_bind("127.0.0.1", "").is_ok());
    QVERIFY(check_bind("localhost", "").is_ok());
    QVERIFY(check_bind("::1", "").is_ok());
    const Status open = check_bind("0.0.0.0", "");
    QVERIFY(!open.is_ok());
    QVERIFY(open.message().find("--api-key") != std::string::npos);
    QVERIFY(!check_bind("192.168.1.5", "").is_ok());
    QVERIFY(check_bind("0.0.0.0", "k").is_ok());
    QVERIFY(constant_time_equal("secret", "secret"));
    QVERIFY(!constant_time_equal("secret", "secreT"));
    QVERIFY(!constant_time_equal("secret", "secret2"));
    QVERIFY(!constant_time_equal("", "x"));
    ServerOptions so;
    so.host = "0.0.0.0";
    SchedulerOptions o;
    o.n_ctx = kCtx;
    auto s = Scheduler::create(stories(), cpu(), o);
    QVERIFY(s);
    QVERIFY(!OpenAiServer::create(std::move(*s), so));
  }

  // The Host check and the bind check share one exact notion of loopback: a
  // name that merely starts with "127." is not one (the server had answered
  // 127.0.0.1.evil.com, which a DNS-rebinding page can resolve to itself).
  void hostAllowListIsExact() {
    for (const char* h : {"127.0.0.1", "127.1.2.3", "localhost", "LOCALHOST", "::1", "[::1]"})
      QVERIFY2(is_loopback_host(h), h);
    for (const char* h : {"127.0.0.1.evil.com", "127.0.0.1.nip.io", "127.0.0.1evil", "127.1", "localhost.evil.com",
                          "128.0.0.1", "::2", "", "evil.com"})
      QVERIFY2(!is_loopback_host(h), h);
    QVERIFY(!check_bind("127.0.0.1.evil.com", "").is_ok());
    const int port = 8080;
    for (const std::string v : {"127.0.0.1", "127.0.0.1:8080", "localhost", "localhost:1", "127.9.9.9:65535", "[::1]",
                                "[::1]:8080"})
      QVERIFY2(host_allowed(v, "127.0.0.1"), v.c_str());
    for (const std::string v : {"127.0.0.1.evil.com", "127.0.0.1.nip.io", "127.0.0.1evil", "127.0.0.1:80@evil.com",
                                "evil.com", "localhost.evil.com", "127.0.0.1:abc", "127.0.0.1:", "127.0.0.1:99999",
                                "", "::1", "[::1", "127.0.0.1 ", "user@127.0.0.1", "127.0.0.1/x"})
      QVERIFY2(!host_allowed(v, "127.0.0.1"), v.c_str());
    // A server bound to a network name (with a key) also answers to that name.
    QVERIFY(host_allowed("gpu-box.lan:" + std::to_string(port), "gpu-box.lan"));
    QVERIFY(host_allowed("GPU-BOX.lan", "gpu-box.lan"));
    QVERIFY(!host_allowed("gpu-box.lan.evil.com", "gpu-box.lan"));
    QVERIFY(host_allowed("[fe80::1]:80", "fe80::1"));
  }

  void endpointsAndGreedyEqualsSolo() {
    auto srv = start_server();
    httplib::Client c("127.0.0.1", srv->port());
    auto h = c.Get("/health");
    QVERIFY(h);
    QCOMPARE(h->status, 200);
    auto m = c.Get("/v1/models");
    QVERIFY(m);
    QCOMPARE(m->status, 200);
    QCOMPARE(QString::fromStdString(json::parse(m->body)["data"][0]["id"].get<std::string>()), QString("stories260K"));
    auto nf = c.Get("/v1/nothing");
    QVERIFY(nf);
    QCOMPARE(nf->status, 404);
    QVERIFY(json::parse(nf->body)["error"]["message"].get<std::string>().find("/v1/chat/completions") != std::string::npos);

    // Chat, greedy: the same text as Session::generate alone.
    GenerateOptions opt;
    opt.n_predict = 40;
    opt.sampling.temperature = 0;
    const auto prompt = chat_prompt("Tell me about a cat.", &opt);
    const std::string want = solo(prompt, opt);
    QVERIFY(!want.empty());
    json body = {{"model", "stories260K"},
                 {"messages", {{{"role", "user"}, {"content", "Tell me about a cat."}}}},
                 {"temperature", 0},
                 {"max_tokens", 40}};
    auto r = c.Post("/v1/chat/completions", json_headers(), body.dump(), "application/json");
    QVERIFY(r);
    QCOMPARE(r->status, 200);
    const json j = json::parse(r->body);
    QCOMPARE(QString::fromStdString(j["choices"][0]["message"]["content"].get<std::string>()), QString::fromStdString(want));
    QCOMPARE(j["object"].get<std::string>(), std::string("chat.completion"));
    QCOMPARE(j["usage"]["prompt_tokens"].get<int>(), static_cast<int>(prompt.size()));
    QVERIFY(j["usage"]["completion_tokens"].get<int>() > 0);
    QVERIFY(j["timings"]["ttft_ms"].get<double>() > 0);
    QVERIFY(j["timings"]["decode_tokens_per_s"].get<double>() > 0);

    // Streamed: the pieces add up to the same text, then a finish chunk, usage, [DONE].
    body["stream_options"] = {{"include_usage", true}};
    Streamed s = stream(c, "/v1/chat/completions", body);
    QCOMPARE(s.status, 200);
    QVERIFY(s.done);
    QCOMPARE(QString::fromStdString(s.text), QString::fromStdString(want));
    QVERIFY(s.events.size() >= 3);
    QCOMPARE(s.events.front()["choices"][0]["delta"]["role"].get<std::string>(), std::string("assistant"));
    const json& fin = s.events[s.events.size() - 2];
    QVERIFY(fin["choices"][0]["finish_reason"].is_string());
    QVERIFY(fin.contains("timings"));
    QVERIFY(s.events.back()["choices"].empty());
    QCOMPARE(s.events.back()["usage"]["completion_tokens"].get<int>(), j["usage"]["completion_tokens"].get<int>());

    // Completions: plain text continuation, equal to the solo run.
    GenerateOptions plain;
    plain.n_predict = 24;
    plain.sampling.temperature = 0;
    const std::string want_plain = solo(stories()->tokenizer().encode("Once upon a time", true, false), plain);
    auto rc = c.Post("/v1/completions", json_headers(),
                     json({{"prompt", "Once upon a time"}, {"temperature", 0}, {"max_tokens", 24}}).dump(), "application/json");
    QVERIFY(rc);
    QCOMPARE(rc->status, 200);
    QCOMPARE(QString::fromStdString(json::parse(rc->body)["choices"][0]["text"].get<std::string>()),
             QString::fromStdString(want_plain));
    Streamed sc = stream(c, "/v1/completions", {{"prompt", "Once upon a time"}, {"temperature", 0}, {"max_tokens", 24}});
    QCOMPARE(QString::fromStdString(sc.text), QString::fromStdString(want_plain));

    // A bad field is a 400 with OpenAI's error object, over HTTP too.
    auto bad = c.Post("/v1/chat/completions", json_headers(), R"({"messages":[{"role":"user","content":"x"}],"top_p":-1})",
                      "application/json");
    QVERIFY(bad);
    QCOMPARE(bad->status, 400);
    QCOMPARE(json::parse(bad->body)["error"]["param"].get<std::string>(), std::string("top_p"));
    auto notjson = c.Post("/v1/completions", json_headers(), "{", "application/json");
    QVERIFY(notjson);
    QCOMPARE(notjson->status, 400);

    // The metrics saw every request that ran: 4 TTFT observations.
    auto met = c.Get("/metrics");
    QVERIFY(met);
    QCOMPARE(met->status, 200);
    QCOMPARE(metric(met->body, "phaselab_time_to_first_token_seconds_count"), 4.0);
    QVERIFY(met->body.find("phaselab_time_to_first_token_seconds_bucket{le=\"+Inf\"} 4\n") != std::string::npos);
    QVERIFY(met->body.find("# TYPE phaselab_time_per_output_token_seconds histogram") != std::string::npos);
    QVERIFY(met->body.find("phaselab_requests_total{finish=\"rejected\"} 2\n") != std::string::npos);
    QVERIFY(metric(met->body, "phaselab_generation_tokens_total") > 0);
    QCOMPARE(metric(met->body, "phaselab_requests_running"), 0.0);
    QCOMPARE(metric(met->body, "phaselab_kv_blocks_used"), 0.0);
  }

  void takenPortIsAnError() {
    auto first = start_server();
    SchedulerOptions o;
    o.n_ctx = kCtx;
    auto s = Scheduler::create(stories(), cpu(), o);
    QVERIFY(s);
    ServerOptions so;
    so.port = first->port();
    auto second = OpenAiServer::create(std::move(*s), so);
    QVERIFY(second);
    const Status st = (*second)->start();
    QVERIFY(!st.is_ok());
    QVERIFY2(st.message().find("in use") != std::string::npos, st.message().c_str());
  }

  void concurrentStreamsEachEqualSolo() {
    auto srv = start_server();
    constexpr int kStreams = 8;
    std::vector<std::string> want(kStreams), got(kStreams);
    std::vector<int> status(kStreams, 0);
    std::vector<std::string> users;
    for (int i = 0; i < kStreams; i++) {
      users.push_back("Story number " + std::to_string(i) + " is about a " + (i % 2 ? "dog" : "boat") + ".");
      GenerateOptions opt;
      opt.n_predict = 32 + 4 * i;
      opt.sampling.temperature = 0;
      want[i] = solo(chat_prompt(users[i], &opt), opt);
      QVERIFY(!want[i].empty());
    }
    std::vector<std::thread> th;
    for (int i = 0; i < kStreams; i++)
      th.emplace_back([&, i] {
        httplib::Client c("127.0.0.1", srv->port());
        Streamed s = stream(c, "/v1/chat/completions",
                            {{"messages", {{{"role", "user"}, {"content", users[i]}}}}, {"temperature", 0}, {"max_tokens", 32 + 4 * i}});
        got[i] = s.text;
        status[i] = s.done ? s.status : -1;
      });
    for (auto& t : th) t.join();
    for (int i = 0; i < kStreams; i++) {
      QCOMPARE(status[i], 200);
      QCOMPARE(QString::fromStdString(got[i]), QString::fromStdString(want[i]));
    }
    // They shared forward passes: fewer passes than the tokens they generated.
    const std::string met = srv->metrics_text();
    QVERIFY2(metric(met, "phaselab_forward_passes_total") < metric(met, "phaselab_generation_tokens_total"), met.c_str());
  }

  void disconnectCancelsAndFreesBlocks() {
    auto srv = start_server();
    httplib::Client c("127.0.0.1", srv->port());
    Streamed s = stream(c, "/v1/completions", {{"prompt", "Once upon a time"}, {"max_tokens", 400}, {"temperature", 0.9}, {"seed", 7}},
                        /*stop_after=*/3);
    QVERIFY(!s.done);
    QTRY_COMPARE_WITH_TIMEOUT(metric(srv->metrics_text(), "phaselab_requests_total{finish=\"cancelled\"}"), 1.0, 10000);
    const auto st = srv->stats();
    QCOMPARE(st.running, 0);
    QCOMPARE(st.kv_blocks_used, 0);
    QVERIFY(metric(srv->metrics_text(), "phaselab_generation_tokens_total") < 400);
  }

  void safetyChecks() {
    ServerOptions so;
    so.api_key = "s3cret";
    so.cors_origins = {"http://ok.example"};
    so.max_body_bytes = 2048;
    auto srv = start_server(so);
    httplib::Client c("127.0.0.1", srv->port());
    const std::string body = R"({"prompt":"Once","max_tokens":2,"temperature":0})";
    auto health = c.Get("/health");  // no key needed
    QVERIFY(health);
    QCOMPARE(health->status, 200);
    auto nokey = c.Post("/v1/completions", json_headers(), body, "application/json");
    QVERIFY(nokey);
    QCOMPARE(nokey->status, 401);
    QCOMPARE(json::parse(nokey->body)["error"]["code"].get<std::string>(), std::string("invalid_api_key"));
    auto wrong = c.Post("/v1/completions", {{"Authorization", "Bearer s3creT"}}, body, "application/json");
    QVERIFY(wrong);
    QCOMPARE(wrong->status, 401);
    const httplib::Headers auth = {{"Authorization", "Bearer s3cret"}};
    auto right = c.Post("/v1/completions", auth, body, "application/json");
    QVERIFY(right);
    QCOMPARE(right->status, 200);
    // DNS rebinding: a page of evil.example resolving to 127.0.0.1.
    httplib::Headers foreign = auth;
    foreign.emplace("Host", "evil.example:" + std::to_string(srv->port()));
    auto host = c.Post("/v1/completions", foreign, body, "application/json");
    QVERIFY(host);
    QCOMPARE(host->status, 403);
    // Browsers: only the listed origin.
    httplib::Headers evil_origin = auth;
    evil_origin.emplace("Origin", "http://evil.example");
    auto origin = c.Post("/v1/completions", evil_origin, body, "application/json");
    QVERIFY(origin);
    QCOMPARE(origin->status, 403);
    QVERIFY(origin->body.find("--cors") != std::string::npos);
    httplib::Headers ok_origin = auth;
    ok_origin.emplace("Origin", "http://ok.example");
    auto allowed = c.Post("/v1/completions", ok_origin, body, "application/json");
    QVERIFY(allowed);
    QVERIFY2(allowed->status == 200, allowed->body.c_str());
    QCOMPARE(allowed->get_header_value("Access-Control-Allow-Origin"), std::string("http://ok.example"));
    auto preflight = c.Options("/v1/completions", {{"Origin", "http://ok.example"}, {"Access-Control-Request-Method", "POST"}});
    QVERIFY(preflight);
    QCOMPARE(preflight->status, 204);
    QVERIFY(preflight->get_header_value("Access-Control-Allow-Headers").find("Authorization") != std::string::npos);
    // A body above the limit.
    auto big = c.Post("/v1/completions", auth, std::string(4096, ' '), "application/json");
    QVERIFY(big);
    QCOMPARE(big->status, 413);
    QVERIFY(json::parse(big->body).contains("error"));
  }

  // n choices and log-probabilities over HTTP: the streamed chunks carry, per
  // choice, the same text and the same log-probabilities (in order, each
  // token once, those of held-back text in a later chunk) as the whole
  // answer; choice i of a sampled request is reproducible from its seed.
  void choicesAndLogprobsStreamedEqualWhole() {
    auto srv = start_server();
    httplib::Client c("127.0.0.1", srv->port());
    for (const char* path : {"/v1/chat/completions", "/v1/completions"}) {
      const bool chat = std::string(path).find("chat") != std::string::npos;
      json body = {{"temperature", 0.8}, {"seed", 7}, {"max_tokens", 24}, {"n", 3}};
      if (chat) {
        body["messages"] = {{{"role", "user"}, {"content", "Tell me about a cat."}}};
        body["logprobs"] = true;
        body["top_logprobs"] = 2;
      } else {
        body["prompt"] = "Once upon a time";
        body["logprobs"] = 2;
      }
      auto r = c.Post(path, json_headers(), body.dump(), "application/json");
      QVERIFY(r);
      QVERIFY2(r->status == 200, r->body.c_str());
      const json whole = json::parse(r->body);
      QCOMPARE(whole["choices"].size(), size_t{3});
      Streamed s = stream(c, path, body);
      QCOMPARE(s.status, 200);
      QVERIFY(s.done);
      std::vector<std::string> text(3);
      std::vector<json> lps(3, json::array());
      for (const json& ev : s.events)
        for (const json& ch : ev["choices"]) {
          const int i = ch["index"].get<int>();
          text[i] += chat ? ch["delta"].value("content", "") : ch["text"].get<std::string>();
          if (ch["logprobs"].is_null()) continue;
          const json& part = chat ? ch["logprobs"]["content"] : ch["logprobs"]["token_logprobs"];
          for (const json& x : part) lps[i].push_back(chat ? x["logprob"] : x);
        }
      for (int i = 0; i < 3; i++) {
        const json& ch = whole["choices"][i];
        QCOMPARE(ch["index"].get<int>(), i);
        QCOMPARE(text[i], chat ? ch["message"]["content"].get<std::string>() : ch["text"].get<std::string>());
        json want = json::array();
        for (const json& x : chat ? ch["logprobs"]["content"] : ch["logprobs"]["token_logprobs"])
          want.push_back(chat ? x["logprob"] : x);
        QVERIFY(!want.empty());
        QCOMPARE(lps[i].dump(), want.dump());
      }
      QVERIFY(text[0] != text[1] || text[1] != text[2]);  // distinct seeds
    }
  }

  // The request reader alone: bytes in any pieces give the same requests;
  // a CRLF before a request may arrive split; pipelined requests after a
  // chunked body; limits answered with their status.
  void requestReaderTakesRequestsFromAnyPieces() {
    const std::string wire =
        "\r\nPOST /v1/completions HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
        "3;x=y\r\nabc\r\n2\r\nde\r\n0\r\nT: 1\r\n\r\n"
        "GET /health?x=1 HTTP/1.1\r\nHost: h\r\n\r\n"
        "PUT /p HTTP/1.0\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\nxyz";
    for (size_t piece : {size_t{1}, size_t{2}, size_t{7}, wire.size()}) {
      http::RequestReader r(http::Limits{});
      std::string in;
      std::vector<http::Request> got;
      for (size_t at = 0; at < wire.size() || !in.empty();) {
        const auto step = r.feed(in);
        QVERIFY2(step != http::RequestReader::Step::error, r.error().message.c_str());
        if (step == http::RequestReader::Step::request) {
          got.push_back(r.take());
          continue;
        }
        QVERIFY(!r.take_continue());  // HTTP/1.0: no 100 Continue
        if (at >= wire.size()) break;
        in += wire.substr(at, piece);
        at += piece;
      }
      QCOMPARE(got.size(), size_t{3});
      QCOMPARE(got[0].body, std::string("abcde"));
      QCOMPARE(got[1].path, std::string("/health"));
      QCOMPARE(got[1].target, std::string("/health?x=1"));
      QCOMPARE(got[2].minor_version, 0);
      QCOMPARE(got[2].body, std::string("xyz"));
    }
    auto status_of = [](const std::string& wire, http::Limits lim = {}) {
      http::RequestReader r(lim);
      std::string in = wire;
      return r.feed(in) == http::RequestReader::Step::error ? r.error().status : 0;
    };
    http::Limits small;
    small.max_body_bytes = 10;
    QCOMPARE(status_of("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 11\r\n\r\n", small), 413);
    QCOMPARE(status_of("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\nb\r\n", small), 413);
    QCOMPARE(status_of("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: -5\r\n\r\n"), 400);
    QCOMPARE(status_of("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"), 400);
    QCOMPARE(status_of("GET / HTTP/1.1\r\n\r\n"), 400);
    QCOMPARE(status_of("GET /\r\n"), 400);
    QCOMPARE(status_of("\r\n\r\n"), 400);
    QCOMPARE(status_of("GET / HTTP/2.0\r\nHost: h\r\n\r\n"), 505);
    QCOMPARE(status_of("GET / HTTP/1.1\r\nHost: h\r\nX: a" + std::string(1, '\0') + "b\r\n\r\n"), 400);
    QCOMPARE(status_of("GET / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip\r\n\r\n"), 501);
    QCOMPARE(status_of("GET / HTTP/1.1\r\nHost: h\r\nX: " + std::string(20000, 'a')), 431);
    // A budget that refuses: 503.
    http::RequestReader busy(http::Limits{}, [](size_t) { return false; });
    std::string in = "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\n";
    QCOMPARE(busy.feed(in), http::RequestReader::Step::error);
    QCOMPARE(busy.error().status, 503);
  }

  // A client at its connection limit: a connection that has waited over a
  // second for a request gives way to its new one; a burst of fresh ones is
  // not cut (the newest gets 503 with Retry-After instead).
  void aClientAtItsLimitLosesItsIdlestConnection() {
    ServerOptions so;
    so.max_connections_per_client = 4;
    auto srv = start_server(so);
    auto connect_idle = [&] {
      const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<uint16_t>(srv->port()));
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) qFatal("connect failed");
      return fd;
    };
    std::vector<int> idle;
    for (int i = 0; i < 4; i++) idle.push_back(connect_idle());
    {
      httplib::Client c("127.0.0.1", srv->port());
      auto h = c.Get("/health");  // the 5th, while the others are fresh
      QVERIFY(h);
      QCOMPARE(h->status, 503);
      QCOMPARE(h->get_header_value("Retry-After"), std::string("1"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1200));
    {
      httplib::Client c("127.0.0.1", srv->port());
      auto h = c.Get("/health");
      QVERIFY(h);
      QCOMPARE(h->status, 200);
    }
    // The oldest idle connection was the one closed.
    char b;
    timeval tv{2, 0};
    ::setsockopt(idle[0], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    QCOMPARE(::recv(idle[0], &b, 1, 0), ssize_t{0});
    for (int fd : idle) ::close(fd);
  }

  // Functions offered to a model whose template teaches a call syntax
  // (Qwen 2.5's <tool_call>, Llama 3.2's bare JSON reply; on a tiny random
  // model): accepted, rendered into the prompt (more prompt tokens than
  // without them), and an answer without a call is the same text streamed
  // (held back only while it might begin a call) as whole, with
  // finish_reason length and no tool_calls. The stories model (no template
  // of its own) refuses them, naming the field.
  void tools_reach_a_templated_model_data() {
    QTest::addColumn<QString>("file");
    QTest::addColumn<int>("syntax");
    QTest::newRow("Qwen 2.5: <tool_call>") << "Qwen-Qwen2.5-7B-Instruct.jinja" << int(ToolCallSyntax::hermes);
    QTest::newRow("Llama 3.2: bare JSON") << "meta-llama-Llama-3.2-3B-Instruct.jinja" << int(ToolCallSyntax::json);
  }
  void tools_reach_a_templated_model() {
    QFETCH(QString, file);
    QFETCH(int, syntax);
    QFile f(QStringLiteral(PHASELAB_TEST_DATA "/chat-templates/") + file);
    QVERIFY(f.open(QIODevice::ReadOnly));
    TinySpec spec;
    spec.chat_template = f.readAll().toStdString();
    spec.n_ctx_train = 4096;  // (the tiny vocabulary spells the template's text out byte by byte)
    auto m = Model::load(write_tiny_model(spec, "server_tools_" + std::to_string(syntax) + ".gguf"));
    QVERIFY2(m.is_ok(), m.status().message().c_str());
    QCOMPARE(int((*m)->chat_format().tool_calls), syntax);
    auto srv = start_server({}, *m, 4096);
    httplib::Client c("127.0.0.1", srv->port());
    const json tools = json::parse(R"([{"type":"function","function":{"name":"get_weather",
        "parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}])");
    json body = {{"messages", {{{"role", "user"}, {"content", "the cat sat"}}}},
                 {"temperature", 0}, {"max_tokens", 12}, {"ignore_eos", true}};
    auto whole = [&](const json& b) {
      auto r = c.Post("/v1/chat/completions", b.dump(), "application/json");
      if (!r) qFatal("no response");
      return std::pair{r->status, json::parse(r->body)};
    };
    const auto [plain_status, plain] = whole(body);
    QCOMPARE(plain_status, 200);
    body["tools"] = tools;
    const auto [status, with_tools] = whole(body);
    QCOMPARE(status, 200);
    QVERIFY(with_tools["usage"]["prompt_tokens"].get<int>() > plain["usage"]["prompt_tokens"].get<int>() + 20);
    const json& msg = with_tools["choices"][0]["message"];
    QVERIFY(!msg.contains("tool_calls"));
    QCOMPARE(with_tools["choices"][0]["finish_reason"].get<std::string>(), std::string("length"));
    const std::string text = msg["content"].is_null() ? std::string() : msg["content"].get<std::string>();
    Streamed s = stream(c, "/v1/chat/completions", body);
    QCOMPARE(s.status, 200);
    QVERIFY(s.done);
    // (The whole answer is trimmed; the stream sends the text as it came.)
    QCOMPARE(QString::fromStdString(s.text).trimmed(), QString::fromStdString(text).trimmed());
    for (const json& e : s.events)
      if (e.contains("choices") && !e["choices"].empty()) QVERIFY(!e["choices"][0]["delta"].contains("tool_calls"));
    // The stories model: refused.
    auto srv2 = start_server();
    httplib::Client c2("127.0.0.1", srv2->port());
    auto r = c2.Post("/v1/chat/completions", body.dump(), "application/json");
    QVERIFY(r);
    QCOMPARE(r->status, 400);
    QCOMPARE(json::parse(r->body)["error"]["param"].get<std::string>(), std::string("tools"));
    srv->stop();
    srv2->stop();
  }

  // Every generated token is an event of the stream, one without text of
  // its own included (here the end-of-text token, forced by logit_bias and
  // kept going by ignore_eos): a client timing the tokens sees them all.
  void every_token_is_an_event() {
    auto srv = start_server();
    httplib::Client c("127.0.0.1", srv->port());
    const std::string eos = std::to_string(stories()->tokenizer().eos());
    Streamed s = stream(c, "/v1/completions",
                        {{"prompt", "Once upon a time"}, {"temperature", 0}, {"max_tokens", 6}, {"ignore_eos", true},
                         {"logit_bias", {{eos, 100}}}, {"stream_options", {{"include_usage", true}}}});
    QCOMPARE(s.status, 200);
    QVERIFY(s.done);
    int tokens = 0, usage = -1;
    for (const json& e : s.events) {
      if (e.contains("usage") && e["usage"].is_object()) usage = e["usage"]["completion_tokens"].get<int>();
      if (!e.contains("choices") || e["choices"].empty()) continue;
      const json& ch = e["choices"][0];
      if (ch["finish_reason"].is_null()) tokens++;
    }
    QCOMPARE(usage, 6);
    QCOMPARE(tokens, 6);
    QCOMPARE(QString::fromStdString(s.text), QString());
    srv->stop();
  }

  // A server whose event stream ends its lines with CRLF (allowed by the SSE
  // format): every event is read, the last one (usage) included. A token
  // without text of its own is an event with empty content, and counts; the
  // role announcement and the closing chunk do not.
  // A reasoning model behind another server (gpt-oss through llama-server
  // or vLLM): delta.reasoning_content (or vLLM's delta.reasoning) is the
  // reasoning, apart from the answer; each such chunk is a token.
  void remoteClientKeepsReasoningApart() {
    httplib::Server fake;
    fake.Get("/v1/models", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"object":"list","data":[{"id":"oss","object":"model"}]})", "application/json");
    });
    fake.Post("/v1/chat/completions", [](const httplib::Request&, httplib::Response& res) {
      auto ev = [](const json& delta, const json& finish = nullptr) {
        return "data: " + json({{"choices", {{{"index", 0}, {"delta", delta}, {"finish_reason", finish}}}}}).dump() + "\n\n";
      };
      std::string body = ev({{"role", "assistant"}, {"content", ""}});
      body += ev({{"reasoning_content", "The user"}});
      body += ev({{"reasoning", " greets."}});
      body += ev({{"content", "Hi"}});
      body += ev({{"content", "!"}});
      body += ev(json::object(), "stop");
      body += "data: [DONE]\n\n";
      res.set_content(body, "text/event-stream");
    });
    const int port = fake.bind_to_any_port("127.0.0.1");
    QVERIFY(port > 0);
    std::thread t([&] { fake.listen_after_bind(); });
    auto rc = RemoteClient::connect({"http://127.0.0.1:" + std::to_string(port), "", "", 10});
    QVERIFY2(rc, rc ? "" : rc.status().message().c_str());
    GenerateOptions opt;
    opt.n_predict = 16;
    std::string streamed_reasoning;
    int events = 0;
    auto r = (*rc)->chat({{"user", "hi"}}, opt, [&](const TokenEvent& e) {
      streamed_reasoning += e.reasoning;
      events++;
    });
    fake.stop();
    t.join();
    QVERIFY2(r, r ? "" : r.status().message().c_str());
    QCOMPARE(r->result.text, std::string("Hi!"));
    QCOMPARE(r->result.reasoning, std::string("The user greets."));
    QCOMPARE(streamed_reasoning, r->result.reasoning);
    QCOMPARE(events, 4);
  }

  void remoteClientReadsCrlfEvents() {
    httplib::Server fake;
    fake.Get("/v1/models", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"object":"list","data":[{"id":"crlf-model","object":"model"}]})", "application/json");
    });
    fake.Post("/v1/chat/completions", [](const httplib::Request&, httplib::Response& res) {
      std::string body = "data: " + json({{"choices", {{{"index", 0}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"finish_reason", nullptr}}}}}).dump() + "\r\n\r\n";
      for (const char* piece : {"Hello", "", ",", " world"})
        body += "data: " + json({{"choices", {{{"index", 0}, {"delta", {{"content", piece}}}, {"finish_reason", nullptr}}}}}).dump() + "\r\n\r\n";
      body += "data: " + json({{"choices", {{{"index", 0}, {"delta", json::object()}, {"finish_reason", "length"}}}}}).dump() + "\r\n\r\n";
      body += "data: " + json({{"choices", json::array()}, {"usage", {{"prompt_tokens", 7}, {"completion_tokens", 4}}}}).dump() + "\r\n\r\n";
      body += "data: [DONE]\r\n\r\n";
      res.set_content(body, "text/event-stream");
    });
    const int port = fake.bind_to_any_port("127.0.0.1");
    QVERIFY(port > 0);
    std::thread t([&] { fake.listen_after_bind(); });
    auto rc = RemoteClient::connect({"http://127.0.0.1:" + std::to_string(port), "", "", 10});
    QVERIFY2(rc, rc ? "" : rc.status().message().c_str());
    QCOMPARE(QString::fromStdString((*rc)->model()), QString("crlf-model"));
    GenerateOptions opt;
    opt.n_predict = 4;
    std::vector<std::string> pieces;
    auto r = (*rc)->chat({{"user", "hi"}}, opt, [&](const TokenEvent& e) { pieces.emplace_back(e.text); });
    fake.stop();
    t.join();
    QVERIFY2(r, r ? "" : r.status().message().c_str());
    QCOMPARE(QString::fromStdString(r->result.text), QString("Hello, world"));
    QCOMPARE(r->result.metrics.n_prompt, 7);
    QCOMPARE(r->result.metrics.n_generated, 4);
    QCOMPARE(pieces, (std::vector<std::string>{"Hello", "", ",", " world"}));
    QCOMPARE(QString::fromLatin1(to_string(r->result.metrics.stop_reason)), QString("length"));
  }

  void remoteClientAgainstServer() {
    auto srv = start_server();
    auto rc = RemoteClient::connect({srv->base_url(), "", "", 60});
    QVERIFY2(rc, rc ? "" : rc.status().message().c_str());
    QCOMPARE(QString::fromStdString((*rc)->model()), QString("stories260K"));
    GenerateOptions opt;
    opt.n_predict = 30;
    opt.sampling.temperature = 0;
    const std::string want = solo(chat_prompt("Tell me about a fox.", &opt), opt);
    GenerateOptions ropt;
    ropt.n_predict = 30;
    ropt.sampling.temperature = 0;
    int events = 0;
    std::string streamed;
    auto r = (*rc)->chat({{"user", "Tell me about a fox."}}, ropt, [&](const TokenEvent& e) {
      QCOMPARE(e.index, events);
      streamed += e.text;
      events++;
    });
    QVERIFY2(r, r ? "" : r.status().message().c_str());
    QCOMPARE(QString::fromStdString(r->result.text), QString::fromStdString(want));
    QCOMPARE(streamed, r->result.text);
    const RequestMetrics& m = r->result.metrics;
    QVERIFY(m.ttft_ms > 0);
    QVERIFY(m.n_generated >= events);
    QVERIFY(m.n_prompt > 0);  // from the server's usage
    QVERIFY(r->server_timings.contains("ttft_ms"));
    // Cancelling closes the stream; the server frees the sequence.
    std::atomic<bool> cancel{false};
    GenerateOptions longer;
    longer.n_predict = 400;
    longer.sampling.temperature = 0.9f;
    int n = 0;
    auto rcan = (*rc)->complete("Once upon a time", longer, [&](const TokenEvent&) {
      if (++n == 2) cancel = true;
    }, &cancel);
    QVERIFY(rcan);
    QCOMPARE(QString::fromLatin1(to_string(rcan->result.metrics.stop_reason)), QString("cancelled"));
    QTRY_COMPARE_WITH_TIMEOUT(srv->stats().running, 0, 10000);
    // Errors say what is wrong.
    auto unknown = RemoteClient::connect({srv->base_url(), "", "no-such-model", 60});
    QVERIFY(!unknown);
    QVERIFY2(unknown.status().message().find("stories260K") != std::string::npos, unknown.status().message().c_str());
    auto badurl = RemoteClient::connect({"ftp://x", "", "", 60});
    QVERIFY(!badurl);
    QVERIFY(badurl.status().message().find("http://") != std::string::npos);
    const int dead_port = srv->port();
    srv->stop();
    auto dead = RemoteClient::connect({"http://127.0.0.1:" + std::to_string(dead_port) + "/v1", "", "", 5});
    QVERIFY(!dead);
    QVERIFY2(dead.status().message().find("cannot reach") != std::string::npos, dead.status().message().c_str());
    // A key the server does not accept.
    ServerOptions so;
    so.api_key = "right";
    auto keyed = start_server(so);
    auto refused = RemoteClient::connect({keyed->base_url(), "wrong", "", 5});
    QVERIFY(!refused);
    QVERIFY2(refused.status().message().find("refused") != std::string::npos, refused.status().message().c_str());
    QVERIFY(RemoteClient::connect({keyed->base_url(), "right", "", 5}));
  }
};

QTEST_GUILESS_MAIN(TestServer)
#include "test_server.moc"
