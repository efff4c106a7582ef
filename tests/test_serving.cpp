// The serving benchmark (phaselab/serving_bench.h, serving_http.h): its
// statistics on known inputs, the workload's determinism and distinct
// prompts of exact lengths, runs in process under the three policies and
// over HTTP against PhaseLab's own server, and the JSON contract's keys.
// No test asserts a time.
#include <QTemporaryDir>
#include <QtTest>
#include <sched.h>

#include <nlohmann/json.hpp>
#include <set>

#include "phaselab/openai_server.h"
#include "phaselab/scheduler.h"
#include "phaselab/serving_bench.h"
#include "phaselab/serving_http.h"
#include "tiny_model.h"

using namespace phaselab;
using namespace phaselab::testing;
using nlohmann::json;

namespace {

RequestTrace trace(ServingKind kind, double arrive, std::vector<double> tokens, bool ok = true) {
  RequestTrace r;
  r.kind = kind;
  r.arrive_ms = arrive;
  r.token_ms = std::move(tokens);
  r.tokens = static_cast<int>(r.token_ms.size());
  r.ok = ok;
  return r;
}

// A workload small enough for stories260K in a second.
ServingWorkload tiny_workload() {
  ServingWorkload w;
  w.streams = 2;
  w.chat_prompt = 12;
  w.chat_answer = 8;
  w.long_prompt = 200;
  w.long_answer = 4;
  w.long_count = 1;
  w.long_start_s = 0.02;
  w.baseline = false;
  return w;
}

// Every key of docs/serving.md's contract, at the top, in "workload" and in a row.
void check_contract_keys(const json& j) {
  for (const char* k : {"model", "backend", "threads", "workload", "targets", "rows"})
    QVERIFY2(j.contains(k), k);
  for (const char* k : {"streams", "chat_prompt", "chat_answer", "long_prompt", "long_answer", "long_count",
                        "long_rate", "long_start_s", "duration_s", "seed", "baseline"})
    QVERIFY2(j["workload"].contains(k), k);
  QVERIFY(j["targets"].contains("ttft_ms") && j["targets"].contains("itl_ms"));
  for (const json& row : j["rows"]) {
    for (const char* k : {"policy", "label", "target", "placement", "requests", "ok", "duration_s", "tokens",
                          "tokens_per_s", "ttft_ms", "ttft_long_ms", "itl_ms", "tpot_ms", "max_stall_ms", "goodput_rps",
                          "goodput_fraction", "kv_transfers", "kv_transfer_bytes", "kv_transfer_ms", "timeline"})
      QVERIFY2(row.contains(k), k);
    for (const char* s : {"ttft_ms", "ttft_long_ms", "itl_ms", "tpot_ms"})
      for (const char* k : {"n", "p50", "p90", "p99", "max", "mean"}) QVERIFY2(row[s].contains(k), k);
    for (const json& e : row["timeline"])
      for (const char* k : {"stream", "kind", "arrive_ms", "n_prompt", "first_token_ms", "token_ms", "ok"})
        QVERIFY2(e.contains(k), k);
  }
}

// The CPUs this thread may run on.
int allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) qFatal("sched_getaffinity failed");
  return CPU_COUNT(&set);
}

}  // namespace

class TestServing : public QObject {
  Q_OBJECT

 private slots:
  void summary_of_known_values() {
    std::vector<double> v;
    for (int i = 100; i >= 1; i--) v.push_back(i);  // unsorted on purpose
    const LatencySummary s = summarize(v);
    QCOMPARE(s.n, size_t{100});
    QCOMPARE(s.p50, 50.5);
    QVERIFY(std::abs(s.p90 - 90.1) < 1e-9);
    QVERIFY(std::abs(s.p99 - 99.01) < 1e-9);
    QCOMPARE(s.max, 100.0);
    QCOMPARE(s.mean, 50.5);
    const LatencySummary none = summarize({});
    QCOMPARE(none.n, size_t{0});
    QCOMPARE(none.max, 0.0);
  }

  // ITL and the max stall are of the chat streams' gaps only (ok requests);
  // TTFT counts from arrival; TPOT spreads a request's decode over its gaps.
  void gaps_stall_ttft_and_tpot() {
    const std::vector<RequestTrace> rs = {
        trace(ServingKind::chat, 0, {100, 130, 160, 400}),        // gaps 30 30 240
        trace(ServingKind::chat, 10, {50, 60}),                    // gap 10
        trace(ServingKind::long_doc, 20, {1020, 2020}),            // gap 1000: not ITL
        trace(ServingKind::chat, 0, {5, 905}, /*ok=*/false),       // failed: not counted
    };
    std::vector<double> gaps = chat_gaps(rs);
    std::sort(gaps.begin(), gaps.end());
    QCOMPARE(gaps, (std::vector<double>{10, 30, 30, 240}));
    QCOMPARE(summarize(gaps).max, 240.0);
    QCOMPARE(ttfts(rs), (std::vector<double>{100, 40, 1000}));
    QCOMPARE(ttfts(rs, ServingKind::long_doc), (std::vector<double>{1000}));
    QCOMPARE(tpots(rs), (std::vector<double>{100, 10, 1000}));
  }

  void goodput_needs_both_targets() {
    const ServingTargets t{500, 100};
    const std::vector<RequestTrace> rs = {
        trace(ServingKind::chat, 0, {100, 150, 200}),             // meets both
        trace(ServingKind::chat, 0, {600, 650}),                  // TTFT over
        trace(ServingKind::chat, 0, {100, 250}),                  // one gap over
        trace(ServingKind::chat, 0, {100, 150}, /*ok=*/false),    // failed
        trace(ServingKind::long_doc, 100, {600, 700}),            // TTFT 500, gap 100: both at the limit
    };
    QVERIFY(meets_targets(rs[0], t));
    QVERIFY(!meets_targets(rs[1], t));
    QVERIFY(!meets_targets(rs[2], t));
    QVERIFY(!meets_targets(rs[3], t));
    QVERIFY(meets_targets(rs[4], t));
    const Goodput g = goodput(rs, t, 4.0);
    QCOMPARE(g.met, 2);
    QCOMPARE(g.per_s, 0.5);
    QCOMPARE(g.fraction, 0.4);
  }

  void plan_has_the_baseline_first_and_alternates() {
    ServingWorkload w = tiny_workload();
    w.baseline = true;
    const std::vector<SchedulePolicy> ps = {*parse_schedule_policy("prefill-first"), *parse_schedule_policy("chunked:32")};
    const auto runs = plan_serving_runs(w, ps, 2);
    QCOMPARE(runs.size(), size_t{5});
    QCOMPARE(runs[0].workload.long_count, 0);
    QCOMPARE(runs[0].policy.name(), std::string("prefill-first"));
    QVERIFY(runs[0].label.find("baseline") != std::string::npos);
    const char* order[] = {"prefill-first", "chunked:32", "prefill-first", "chunked:32"};
    for (int i = 0; i < 4; i++) {
      QCOMPARE(runs[i + 1].label, std::string(order[i]));
      QCOMPARE(runs[i + 1].workload.long_count, 1);
    }
    // Every run its own prompts (a server's prefix cache would otherwise
    // answer a repeat's long prompt at once), the same arrivals and lengths.
    std::set<std::string> texts;
    for (const ServingRun& r : runs) {
      if (!r.label.starts_with("baseline")) QCOMPARE(long_arrivals_s(r.workload), long_arrivals_s(runs[1].workload));
      const PromptSource src = PromptSource(nullptr, w).for_run(r.workload);
      texts.insert(src.prompt(ServingKind::long_doc, 0, 0).text);
      texts.insert(src.prompt(ServingKind::chat, 0, 0).text);
    }
    QCOMPARE(texts.size(), 2 * runs.size());
    w.baseline = false;
    QCOMPARE(plan_serving_runs(w, ps, 1).size(), size_t{2});
  }

  void arrivals_are_seeded_poisson() {
    ServingWorkload w = tiny_workload();
    w.long_count = 50;
    w.long_rate = 4;
    w.long_start_s = 1;
    const auto a = long_arrivals_s(w);
    QCOMPARE(a, long_arrivals_s(w));
    QCOMPARE(a.size(), size_t{50});
    QCOMPARE(a.front(), 1.0);
    QVERIFY(std::is_sorted(a.begin(), a.end()));
    // 49 exponential gaps of mean 0.25 s: their mean is within a wide band of it.
    const double mean_gap = (a.back() - a.front()) / 49;
    QVERIFY2(mean_gap > 0.125 && mean_gap < 0.5, qPrintable(QString::number(mean_gap)));
    w.seed = 2;
    QVERIFY(long_arrivals_s(w) != a);
    w.long_rate = 0;
    for (double t : long_arrivals_s(w)) QCOMPARE(t, 1.0);
  }

  // Prompts: exactly the asked token count (BOS included), the same for the
  // same seed, different for every request, and another seed another text.
  void prompts_are_exact_distinct_and_seeded() {
    const Tokenizer& tok = shared_stories()->tokenizer();
    ServingWorkload w = tiny_workload();
    const PromptSource a(&tok, w), b(&tok, w);
    std::set<std::vector<int32_t>> seen;
    for (int s = 0; s < 3; s++)
      for (int i = 0; i < 4; i++) {
        const ServingPrompt p = a.prompt(ServingKind::chat, s, i);
        QCOMPARE(static_cast<int>(p.tokens.size()), w.chat_prompt);
        QCOMPARE(p.tokens, b.prompt(ServingKind::chat, s, i).tokens);
        QVERIFY(!p.text.empty());
        QVERIFY(seen.insert(p.tokens).second);
      }
    const ServingPrompt l = a.prompt(ServingKind::long_doc, w.streams, 0);
    QCOMPARE(static_cast<int>(l.tokens.size()), w.long_prompt);
    QVERIFY(seen.insert(l.tokens).second);
    QCOMPARE(l.tokens.front(), tok.bos());
    w.seed = 7;
    QVERIFY(PromptSource(&tok, w).prompt(ServingKind::chat, 0, 0).tokens != a.prompt(ServingKind::chat, 0, 0).tokens);
    // Without a tokenizer: that many words.
    const ServingPrompt words = PromptSource(nullptr, w).prompt(ServingKind::chat, 0, 0);
    QVERIFY(words.tokens.empty());
    QCOMPARE(static_cast<int>(QString::fromStdString(words.text).split(' ').size()), w.chat_prompt);
  }

  void prompts_file_is_read_and_bad_lines_named() {
    QTemporaryDir dir;
    const QString good = dir.filePath("good.jsonl"), bad = dir.filePath("bad.jsonl");
    QFile f(good);
    QVERIFY(f.open(QIODevice::WriteOnly));
    f.write("{\"prompt\": \"one\"}\n\n{\"prompt\": \"two\", \"kind\": \"long\"}\n{\"prompt\": \"three\"}\n");
    f.close();
    auto ps = read_prompts_jsonl(good.toStdString());
    QVERIFY(ps.is_ok());
    QCOMPARE(ps->size(), size_t{3});
    QVERIFY((*ps)[1].kind == ServingKind::long_doc);
    ServingWorkload w = tiny_workload();
    const PromptSource src(nullptr, w, *ps);
    QCOMPARE(src.prompt(ServingKind::chat, 0, 0).text, std::string("one"));
    QCOMPARE(src.prompt(ServingKind::chat, 1, 0).text, std::string("three"));
    QCOMPARE(src.prompt(ServingKind::long_doc, w.streams, 0).text, std::string("two"));
    QFile g(bad);
    QVERIFY(g.open(QIODevice::WriteOnly));
    g.write("{\"prompt\": \"one\"}\n{\"text\": \"two\"}\n");
    g.close();
    auto err = read_prompts_jsonl(bad.toStdString());
    QVERIFY(!err.is_ok());
    QVERIFY2(err.status().message().find("line 2") != std::string::npos, err.status().message().c_str());
    QVERIFY(!read_prompts_jsonl(dir.filePath("missing.jsonl").toStdString()).is_ok());
  }

  // Fixed-length greedy answers, in process and in the HTTP body (stories260K
  // never ends a story within these lengths, so a run cannot show it).
  void requests_run_to_their_length() {
    const ServingWorkload w = tiny_workload();
    const GenerateOptions chat = serving_generate_options(w, ServingKind::chat);
    const GenerateOptions lng = serving_generate_options(w, ServingKind::long_doc);
    QVERIFY(chat.ignore_eos && lng.ignore_eos);
    QCOMPARE(chat.n_predict, w.chat_answer);
    QCOMPARE(lng.n_predict, w.long_answer);
    QCOMPARE(chat.sampling.temperature, 0.f);
    const json body = remote_sampling_fields(chat);
    QVERIFY(body.value("ignore_eos", false));
    QCOMPARE(body["max_tokens"].get<int>(), w.chat_answer);
    QVERIFY(!remote_sampling_fields(GenerateOptions{}).contains("ignore_eos"));
  }

  void bad_workloads_are_refused() {
    ServingWorkload w = tiny_workload();
    QVERIFY(validate_workload(w).is_ok());
    w.streams = 0;
    w.long_count = 0;
    QVERIFY(!validate_workload(w).is_ok());
    w = tiny_workload();
    w.long_rate = -1;
    QVERIFY(!validate_workload(w).is_ok());
    w = tiny_workload();
    w.chat_answer = 0;
    QVERIFY(!validate_workload(w).is_ok());
  }

  // The three policies in process: every request ok with its whole answer,
  // the long one's TTFT reported, a KV transfer only when disaggregated,
  // and the JSON with every key of the contract.
  void in_process_runs_under_each_policy() {
    const ServingWorkload w = tiny_workload();
    InProcessTarget target;
    target.model = shared_stories();
    target.backend.kind = BackendKind::cpu;
    target.backend.n_threads = 2;
    target.backend.max_batch = 64;
    target.n_ctx = 512;
    const PromptSource prompts(&target.model->tokenizer(), w);
    ServingReport rep;
    rep.workload = w;
    const int cpus_before = allowed_cpus();
    for (const char* name : {"prefill-first", "chunked:32", "disaggregated:1+1"}) {
      ServingRun run{*parse_schedule_policy(name), name, w};
      int progress_calls = 0, last_done = 0;
      auto row = run_serving_in_process(target, run, prompts, [&](const ServingProgress& p) {
        progress_calls++;
        QVERIFY(p.requests_done >= last_done);
        last_done = p.requests_done;
      });
      QVERIFY2(row.is_ok(), row.is_ok() ? "" : row.status().message().c_str());
      QVERIFY(row->requests.size() >= size_t(w.streams + 1));
      // One call per finished request at least (more while a prefill runs long).
      QVERIFY(progress_calls >= static_cast<int>(row->requests.size()));
      QCOMPARE(last_done, static_cast<int>(row->requests.size()));
      int longs = 0;
      for (const RequestTrace& r : row->requests) {
        QVERIFY2(r.ok, r.error.c_str());
        const bool chat = r.kind == ServingKind::chat;
        longs += chat ? 0 : 1;
        QCOMPARE(static_cast<int>(r.token_ms.size()), chat ? w.chat_answer : w.long_answer);
        QCOMPARE(r.n_prompt, chat ? w.chat_prompt : w.long_prompt);
        QVERIFY(r.token_ms.front() >= r.arrive_ms);
        QVERIFY(std::is_sorted(r.token_ms.begin(), r.token_ms.end()));
      }
      QCOMPARE(longs, 1);
      const bool disaggregated = std::string(name).starts_with("disaggregated");
      QCOMPARE(row->kv_transfer.transfers > 0, disaggregated);
      QCOMPARE(row->kv_transfer.bytes > 0, disaggregated);
      QCOMPARE(row->policy, std::string(name));
      QCOMPARE(row->target, std::string("in-process"));
      rep.rows.push_back(std::move(*row));
    }
    // The disaggregated run pinned its stepping thread, not this one (whose
    // CPU mask the next run's backend threads would inherit).
    QCOMPARE(allowed_cpus(), cpus_before);
    const json j = json::parse(serving_report_json(rep));
    check_contract_keys(j);
    QCOMPARE(j["rows"].size(), size_t{3});
    for (const json& row : j["rows"]) {
      QCOMPARE(row["ok"].get<int>(), row["requests"].get<int>());
      QCOMPARE(row["ttft_long_ms"]["n"].get<int>(), 1);
      QVERIFY(row["itl_ms"]["n"].get<int>() > 0);
      QVERIFY(row["tokens_per_s"].get<double>() > 0);
      QCOMPARE(row["goodput_fraction"].get<double>(), 1.0);  // targets of 5 s and 250 ms on a model this small
    }
    QCOMPARE(j["rows"][2]["kv_transfers"].get<int>() > 0, true);
    QCOMPARE(j["rows"][0]["kv_transfers"].get<int>(), 0);
  }

  void in_process_run_stops_when_cancelled() {
    ServingWorkload w = tiny_workload();
    w.duration_s = 3600;  // would run for an hour
    InProcessTarget target;
    target.model = shared_stories();
    target.backend.n_threads = 1;
    target.n_ctx = 512;
    std::atomic<bool> stop{false};
    const PromptSource prompts(&target.model->tokenizer(), w);
    auto row = run_serving_in_process(target, {SchedulePolicy{}, "chunked", w}, prompts,
                                      [&](const ServingProgress& p) {
                                        if (p.requests_done >= 3) stop.store(true);
                                      },
                                      &stop);
    QVERIFY(!row.is_ok());
    QCOMPARE(row.status().code(), StatusCode::cancelled);
  }

  // The same workload over HTTP against PhaseLab's own server on a free port.
  void http_run_against_phaselab_serve() {
    SchedulerOptions o;
    o.n_ctx = 512;
    o.kv_positions = 2048;
    o.max_seqs = 8;
    auto backend = make_cpu_backend(shared_stories(), 2, 64);
    QVERIFY(backend.is_ok());
    auto sched = Scheduler::create(shared_stories(), std::move(*backend), o);
    QVERIFY(sched.is_ok());
    ServerOptions so;
    so.port = 0;
    auto srv = OpenAiServer::create(std::move(*sched), so);
    QVERIFY(srv.is_ok());
    QVERIFY((*srv)->start().is_ok());
    const ServingWorkload w = tiny_workload();
    const PromptSource prompts(&shared_stories()->tokenizer(), w);
    const RemoteEndpoint ep{(*srv)->base_url(), "", "", 60};
    auto row = run_serving_http(ep, {SchedulePolicy{}, "chunked", w}, prompts);
    QVERIFY2(row.is_ok(), row.is_ok() ? "" : row.status().message().c_str());
    QVERIFY(row->requests.size() >= size_t(w.streams + 1));
    int longs = 0;
    for (const RequestTrace& r : row->requests) {
      QVERIFY2(r.ok, r.error.c_str());
      longs += r.kind == ServingKind::long_doc ? 1 : 0;
      // ignore_eos reached the server: every answer has its whole length.
      QCOMPARE(r.tokens, r.kind == ServingKind::chat ? w.chat_answer : w.long_answer);
      // And every token's time (an event per token, text or not: a token
      // missed would double the gap after it).
      QCOMPARE(int(r.token_ms.size()), r.tokens);
    }
    QCOMPARE(longs, 1);
    QCOMPARE(row->target, ep.url);
    ServingReport rep;
    rep.workload = w;
    rep.rows.push_back(std::move(*row));
    check_contract_keys(json::parse(serving_report_json(rep)));
    (*srv)->stop();
  }
};

QTEST_GUILESS_MAIN(TestServing)
#include "test_serving.moc"
