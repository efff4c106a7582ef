// phaselab/compare.h and `phaselab-cli compare`: the rows' contract (the
// reference has KL 0 and top-1 agreement 1; a quantization of it is close
// but not equal), each speed's spread over the repetitions, the cache of
// quantized variants, refusals before anything runs, the rows' and variants'
// JSON both ways, and the CLI's JSON, progress lines, per-variant settings
// and stop on SIGTERM (what the desktop window's child process relies on).
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QProcess>
#include <QSignalSpy>
#include <QTemporaryDir>
#include <QTest>
#include <cmath>
#include <filesystem>

#include "phaselab/compare.h"
#include "phaselab/log.h"

using namespace phaselab;

namespace {
std::string stories() { return std::string(PHASELAB_TEST_DATA) + "/stories260K.gguf"; }

CompareOptions small(const std::string& cache) {
  CompareOptions o;
  o.text = "Once upon a time, there was a little girl named Lily. She loved to play outside in the sunshine. "
           "One day, she saw a big, red ball in the park. She ran to it and kicked it high into the sky. ";
  for (int i = 0; i < 4; i++) o.text += o.text;
  o.n_ctx = 64;
  o.n_chunks = 2;
  o.n_prompt = 32;
  o.n_gen = 16;
  o.repetitions = 1;
  o.n_threads = 1;
  o.cache_dir = cache;
  return o;
}
}  // namespace

class TestCompare : public QObject {
  Q_OBJECT
  QTemporaryDir m_dir;

 private slots:
  void reference_and_quantization_rows() {
    std::vector<CompareVariant> v(2);
    v[0].file = v[1].file = stories();
    v[1].quantize_to = FileType::Q8_0;
    const std::string cache = (m_dir.path() + "/cache").toStdString();
    std::vector<CompareProgress> seen;
    auto rows = run_compare(v, small(cache), [&](const CompareProgress& p) { seen.push_back(p); });
    QVERIFY2(rows.is_ok(), rows.status().message().c_str());
    QCOMPARE(rows->size(), size_t(2));
    const CompareRow& ref = (*rows)[0];
    const CompareRow& q8 = (*rows)[1];
    QVERIFY(ref.reference && !q8.reference);
    QCOMPARE(ref.kld, 0.0);
    QCOMPARE(ref.top1_agree, 1.0);
    QVERIFY(ref.pp > 0 && ref.tg > 0 && ref.ttft_ms > 0 && ref.peak_rss_mib > 0 && ref.size_mib > 0);
    QVERIFY(ref.ppl > 1 && std::isfinite(ref.ppl));
    // Q8_0 of an F32 model: close to it, but not the same numbers.
    QVERIFY2(q8.kld > 0 && q8.kld < 0.05, qPrintable(QString::number(q8.kld)));
    QVERIFY(q8.top1_agree > 0.8 && q8.top1_agree <= 1);
    QVERIFY(std::abs(q8.ppl - ref.ppl) / ref.ppl < 0.05);
    QVERIFY(q8.size_mib < ref.size_mib);
    QCOMPARE(q8.file_type, std::string("Q8_0"));
    QVERIFY(q8.file.find(cache) == 0);
    // Progress covers the run in order and ends at 1.
    QVERIFY(!seen.empty());
    for (size_t i = 1; i < seen.size(); i++) QVERIFY(seen[i].fraction >= seen[i - 1].fraction - 1e-9);
    QVERIFY(seen.back().fraction > 0.99);

    // The quantized file is reused while it is newer than its source.
    const auto before = std::filesystem::last_write_time(q8.file);
    std::vector<CompareVariant> again = {v[0], v[1]};
    auto rows2 = run_compare(again, small(cache));
    QVERIFY(rows2.is_ok());
    QVERIFY(std::filesystem::last_write_time((*rows2)[1].file) == before);
  }

  void refusals_name_what_is_wrong() {
    const CompareOptions o = small(m_dir.path().toStdString());
    CompareVariant missing;
    missing.file = "/nonexistent/model.gguf";
    QCOMPARE(validate_compare({missing}, o).code(), StatusCode::invalid_argument);
    QVERIFY(validate_compare({missing}, o).message().find("no such model file") != std::string::npos);
    CompareVariant bad;
    bad.file = stories();
    bad.backend = "tpu";
    QVERIFY(validate_compare({bad}, o).message().find("unknown backend") != std::string::npos);
    CompareVariant spec;
    spec.file = stories();
    spec.kv_cache = false;
    spec.speculative = "lookup";
    QVERIFY(validate_compare({spec}, o).message().find("KV cache") != std::string::npos);
    QVERIFY(!validate_compare({}, o));
    CompareVariant prune;
    prune.file = stories();
    prune.prune = "layers:x";
    QVERIFY(validate_compare({prune}, o).message().find("layers:A-B") != std::string::npos);
    CompareVariant self;
    self.file = stories();
    self.speculative = "self";
    QVERIFY(validate_compare({self}, o));
    self.backend = "cuda";
    QVERIFY(validate_compare({self}, o).message().find("CPU backends") != std::string::npos);
    CompareVariant target, draft;
    target.file = draft.file = stories();
    draft.draft = true;
    QVERIFY(validate_compare({target, draft}, o));
    QVERIFY(validate_compare({draft, target}, o).message().find("first variant is the target") != std::string::npos);
    CompareOptions no_tg = o;
    no_tg.n_gen = 0;
    QVERIFY(validate_compare({target, draft}, no_tg).message().find("-n") != std::string::npos);
    CompareOptions big_k = o;
    big_k.draft_k = 17;
    QVERIFY(!validate_compare({target, draft}, big_k));
    target.kv_cache = false;
    QVERIFY(validate_compare({target, draft}, o).message().find("KV cache") != std::string::npos);
    CompareOptions odd = o;
    odd.n_ctx = 63;
    CompareVariant ok;
    ok.file = stories();
    QVERIFY(!validate_compare({ok}, odd));
    QVERIFY(validate_compare({ok}, o));
  }

  // Distillation, measured: variants marked draft are run as the first's
  // speculative draft. A Q8_0 copy of the model drafts nearly every token
  // right; the model with one of its 5 layers dropped far fewer; the
  // teacher-forced acceptances on the text rank them the same way, and the
  // sampled one is within its bounds of the greedy one's neighbourhood.
  void drafts_are_measured_against_the_first() {
    std::vector<CompareVariant> v(4);
    v[0].file = v[1].file = v[2].file = v[3].file = stories();
    v[1].quantize_to = FileType::Q8_0;
    v[1].draft = true;
    v[2].prune = "layers:2";
    v[2].draft = true;
    v[3].prune = "ffn:50%";  // an FFN width cut, made into the cache; not a draft
    CompareOptions o = small((m_dir.path() + "/cache-draft").toStdString());
    o.n_gen = 32;
    o.draft_k = 3;
    std::vector<double> fractions;
    bool draft_stage = false;
    auto rows = run_compare(v, o, [&](const CompareProgress& p) {
      fractions.push_back(p.fraction);
      draft_stage |= p.stage == "draft";
    });
    QVERIFY2(rows.is_ok(), rows.status().message().c_str());
    QVERIFY(draft_stage);
    for (size_t i = 1; i < fractions.size(); i++) QVERIFY(fractions[i] >= fractions[i - 1] - 1e-9);
    const CompareRow &ref = (*rows)[0], &q8 = (*rows)[1], &pruned = (*rows)[2];
    QVERIFY(!ref.draft && ref.draft_tg == 0);
    QCOMPARE(ref.accept_sampled, 1.0);
    for (const CompareRow* r : {&q8, &pruned}) {
      qInfo("%s as a draft: kld %.4f, greedy %.3f, sampled %.3f on the text; decoding: %.3f kept, %.2f tokens/pass, "
            "%.1f vs %.1f tok/s",
            r->name.c_str(), r->kld, r->top1_agree, r->accept_sampled, r->draft_acceptance, r->draft_tokens_per_pass,
            r->draft_tg, r->draft_base_tg);
      QVERIFY(r->draft);
      QCOMPARE(r->draft_k, 3);
      QVERIFY(r->draft_tg > 0 && r->draft_base_tg > 0);
      QVERIFY(std::fabs(r->draft_speedup - r->draft_tg / r->draft_base_tg) < 1e-9);
      QVERIFY(r->draft_acceptance > 0 && r->draft_acceptance <= 1);
      // Tokens per target pass: 1 + the accepted run, at most k + 1.
      QVERIFY(r->draft_tokens_per_pass >= 1 && r->draft_tokens_per_pass <= 4);
      QVERIFY(r->accept_sampled > 0 && r->accept_sampled <= 1);
    }
    QVERIFY(q8.draft_acceptance > 0.9);
    QVERIFY(q8.draft_tokens_per_pass > 3);
    QVERIFY(pruned.draft_acceptance < q8.draft_acceptance);
    QVERIFY(pruned.top1_agree < q8.top1_agree && pruned.accept_sampled < q8.accept_sampled);
    QVERIFY(pruned.kld > q8.kld);
    const CompareRow& ffn = (*rows)[3];
    QCOMPARE(ffn.name, std::string("FFN 50%"));
    QCOMPARE(ffn.prune, std::string("ffn:50%"));
    QVERIFY(ffn.file.find("-pruned-ffn50.gguf") != std::string::npos);
    QVERIFY(ffn.size_mib < ref.size_mib && ffn.kld > 0 && !ffn.draft && ffn.accept_sampled > 0);
    // The table adds the drafts' section.
    const std::string table = compare_rows_table(*rows, o.n_prompt, o.n_gen);
    QVERIFY(table.find("As speculative drafts of") != std::string::npos);
    QVERIFY(table.find("x |") != std::string::npos);
    // A row without the draft test still has its teacher-forced figures.
    std::vector<CompareVariant> plain = {v[0], v[1]};
    plain[1].draft = false;
    auto rows2 = run_compare(plain, o);
    QVERIFY(rows2.is_ok());
    QVERIFY(!(*rows2)[1].draft && (*rows2)[1].draft_tg == 0 && (*rows2)[1].accept_sampled > 0.5);
  }

  void cancel_stops_the_run() {
    CompareVariant v;
    v.file = stories();
    std::atomic<bool> cancel{true};
    auto rows = run_compare({v}, small(m_dir.path().toStdString()), {}, &cancel);
    QVERIFY(!rows.is_ok());
    QCOMPARE(rows.status().code(), StatusCode::cancelled);
  }

  // Each speed is measured opts.repetitions times and keeps its spread, as
  // bench -r does; the "done" report carries the finished row.
  void speeds_keep_their_spread() {
    CompareVariant v;
    v.file = stories();
    CompareOptions o = small(m_dir.path().toStdString());
    o.repetitions = 3;
    std::vector<CompareRow> reported;
    auto rows = run_compare({v}, o, [&](const CompareProgress& p) {
      if (p.row) reported.push_back(*p.row);
      QCOMPARE(p.row != nullptr, p.stage == "done");
    });
    QVERIFY2(rows.is_ok(), rows.status().message().c_str());
    const CompareRow& r = rows->front();
    QCOMPARE(r.repetitions, 3);
    QCOMPARE(r.n_prompt, 32);
    QCOMPARE(r.n_gen, 16);
    for (double sd : {r.pp_sd, r.tg_sd, r.ttft_sd_ms}) QVERIFY(std::isfinite(sd) && sd >= 0);
    // Three timed runs never take the same nanoseconds: a spread of exactly 0
    // everywhere would mean it is not computed.
    QVERIFY(r.pp_sd > 0 || r.tg_sd > 0 || r.ttft_sd_ms > 0);
    QCOMPARE(reported.size(), size_t(1));
    QCOMPARE(compare_row_json(reported[0]), compare_row_json(r));
    // The table prints "mean ± sd".
    const std::string table = compare_rows_table(*rows, 32, 16);
    QVERIFY2(table.find("\u00b1") != std::string::npos, table.c_str());
  }

  void rows_and_variants_json_both_ways() {
    CompareRow r;
    r.name = "Q8_0";
    r.file = "/m/a, \"b\".gguf";
    r.pp = 1234.5, r.pp_sd = 12.25, r.tg = 45.5, r.tg_sd = 0.75, r.ttft_ms = 20.5, r.ttft_sd_ms = 1.5;
    r.repetitions = 3, r.n_prompt = 512, r.n_gen = 128, r.kld = 0.0125, r.kv_cache = false, r.peak_rss_mib = 300;
    r.accept_sampled = 0.8125, r.draft = true, r.draft_k = 4, r.draft_tg = 60.5, r.draft_base_tg = 50.25;
    r.draft_speedup = 1.25, r.draft_acceptance = 0.75, r.draft_tokens_per_pass = 3.5, r.spec_acceptance = 0.5;
    const std::string line = compare_row_json(r);
    QVERIFY(line.find('\n') == std::string::npos);  // one line of the progress stream
    auto one = compare_row_from_json(line);
    QVERIFY2(one.is_ok(), one.status().message().c_str());
    QCOMPARE(compare_row_json(*one), line);
    auto all = compare_rows_from_json(compare_rows_json({r, r}));
    QVERIFY(all.is_ok());
    QCOMPARE(all->size(), size_t(2));
    QCOMPARE((*all)[1].tg_sd, 0.75);
    QCOMPARE((*all)[1].kv_cache, false);
    QCOMPARE((*all)[1].draft, true);
    QCOMPARE((*all)[1].draft_k, 4);
    QCOMPARE((*all)[1].draft_tokens_per_pass, 3.5);
    QCOMPARE((*all)[1].accept_sampled, 0.8125);
    QVERIFY(compare_rows_csv({r}).find(",true,4,60.5,") != std::string::npos);
    // A row saved before the spread was kept: no repetitions, no spread.
    auto old = compare_rows_from_json(R"([{"name": "a", "tg128": 40, "pp512": 900, "ttft_ms": 12}])");
    QVERIFY(old.is_ok());
    QCOMPARE((*old)[0].repetitions, 0);
    QCOMPARE((*old)[0].top1_agree, 1.0);
    QVERIFY((*old)[0].accept_sampled < 0 && !(*old)[0].draft);  // not measured then
    QVERIFY(compare_rows_from_json("[{\"name\": \"a\"}]").status().message().find("row 1") != std::string::npos);
    QVERIFY(compare_rows_from_json("[{\"name\": 5, \"tg128\": 1}]").status().message().find("'name'") != std::string::npos);
    QVERIFY(!compare_rows_from_json("not json"));

    CompareProgress p{1, 3, "tg", 0.5, "Q8_0: decode 16"};
    const QJsonObject progress = QJsonDocument::fromJson(QByteArray::fromStdString(compare_progress_json(p))).object();
    QCOMPARE(progress["progress"].toObject()["message"].toString(), QStringLiteral("Q8_0: decode 16"));
    p.row = &r;
    QVERIFY(QJsonDocument::fromJson(QByteArray::fromStdString(compare_progress_json(p))).object().contains("row"));

    std::vector<CompareVariant> vs(2);
    vs[0].file = "/m/a.gguf";
    vs[1].file = "/m/a.gguf";
    vs[1].quantize_to = FileType::Q4_K_M;
    vs[1].backend = "cpu-portable";
    vs[1].kv_cache = false;
    vs[1].prune = "layers:n2";
    vs[1].draft = true;
    auto back = compare_variants_from_json(compare_variants_json(vs));
    QVERIFY2(back.is_ok(), back.status().message().c_str());
    QCOMPARE(back->size(), size_t(2));
    QVERIFY(!(*back)[0].quantize_to);
    QCOMPARE(*(*back)[1].quantize_to, FileType::Q4_K_M);
    QCOMPARE((*back)[1].backend, std::string("cpu-portable"));
    QCOMPARE((*back)[1].kv_cache, false);
    QCOMPARE((*back)[1].prune, std::string("layers:n2"));
    QVERIFY((*back)[0].prune.empty());
    QVERIFY((*back)[1].draft && !(*back)[0].draft);
    QVERIFY(compare_variants_from_json(R"([{"file": "a", "quantize_to": "Q9"}])").status().message().find("Q9") !=
            std::string::npos);
    QVERIFY(compare_variants_from_json(R"([{"quantize_to": "Q8_0"}])").status().message().find("variant 1") !=
            std::string::npos);
  }

  // --progress-json: progress and each row as JSON lines on stderr, before
  // the final array on stdout, which holds the same rows; --variants-json
  // gives each variant its own settings.
  void cli_progress_lines_and_variants() {
    std::vector<CompareVariant> vs(2);
    vs[0].file = vs[1].file = stories();
    vs[1].quantize_to = FileType::Q8_0;
    vs[1].kv_cache = false;
    QProcess p;
    p.start(QStringLiteral(PHASELAB_CLI_PATH),
            {"compare", "--variants-json", QString::fromStdString(compare_variants_json(vs)), "-c", "64", "--chunks",
             "2", "-p", "32", "-n", "16", "-r", "2", "-t", "1", "--cache", m_dir.filePath("cli-cache"), "--json",
             "--progress-json"});
    QVERIFY(p.waitForFinished(120000));
    const QByteArray err = p.readAllStandardError();
    QVERIFY2(p.exitCode() == 0, err.constData());
    auto rows = compare_rows_from_json(p.readAllStandardOutput().toStdString());
    QVERIFY2(rows.is_ok(), rows.status().message().c_str());
    QCOMPARE(rows->size(), size_t(2));
    QCOMPARE((*rows)[1].kv_cache, false);
    QCOMPARE((*rows)[1].file_type, std::string("Q8_0"));
    QCOMPARE((*rows)[0].repetitions, 2);
    std::vector<std::string> streamed;
    int progress = 0;
    for (const QByteArray& line : err.split('\n')) {
      const QJsonObject o = QJsonDocument::fromJson(line).object();
      if (o.contains("row"))
        streamed.push_back(QJsonDocument(o["row"].toObject()).toJson(QJsonDocument::Compact).toStdString());
      if (o.contains("progress")) progress++;
    }
    QVERIFY(progress > 5);
    QCOMPARE(streamed.size(), size_t(2));
    for (size_t i = 0; i < 2; i++) {
      auto row = compare_row_from_json(streamed[i]);
      QVERIFY(row.is_ok());
      QCOMPARE(compare_row_json(*row), compare_row_json((*rows)[i]));
    }
    // One way of naming the variants at a time.
    QProcess both;
    both.start(QStringLiteral(PHASELAB_CLI_PATH), {"compare", "-m", QString::fromStdString(stories()), "--variants-json",
                                                   QString::fromStdString(compare_variants_json(vs))});
    QVERIFY(both.waitForFinished(30000));
    QCOMPARE(both.exitCode(), 2);
    QVERIFY(both.readAllStandardError().contains("--variants-json"));
  }

  // SIGTERM (the window's Cancel) stops the run at its next step with an
  // error line, instead of killing the process mid-write.
  void cli_stops_on_sigterm() {
    QProcess p;
    p.start(QStringLiteral(PHASELAB_CLI_PATH),
            {"compare", "-m", QString::fromStdString(stories()), "-c", "64", "--chunks", "-1", "-p", "32", "-n", "256",
             "-r", "100", "-t", "1", "--json", "--progress-json"});
    QVERIFY(p.waitForStarted(10000));
    QSignalSpy said(&p, &QProcess::readyReadStandardError);
    QVERIFY(said.wait(60000));  // measuring
    p.terminate();
    QVERIFY(p.waitForFinished(60000));
    QCOMPARE(p.exitStatus(), QProcess::NormalExit);
    QVERIFY(p.exitCode() != 0);
    QVERIFY(p.readAllStandardError().contains("cancelled"));
    QVERIFY(p.readAllStandardOutput().isEmpty());
  }

  void cli_json_contract() {
    QProcess p;
    p.start(QStringLiteral(PHASELAB_CLI_PATH),
            {"compare", "-m", QString::fromStdString(stories()), "--quant", "Q4_0", "-c", "64", "--chunks", "2", "-p",
             "32", "-n", "16", "-r", "1", "-t", "1", "--cache", m_dir.filePath("cli-cache"), "--json", "--draft",
             "--draft-k", "2"});
    QVERIFY(p.waitForFinished(120000));
    QCOMPARE(p.exitCode(), 0);
    const QJsonArray rows = QJsonDocument::fromJson(p.readAllStandardOutput()).array();
    QCOMPARE(rows.size(), 2);
    for (const auto& r : rows) {
      const QJsonObject o = r.toObject();
      for (const char* key : {"name", "file", "type_mix", "size_mib", "pp512", "pp512_sd", "tg128", "tg128_sd",
                              "ttft_ms", "ttft_ms_sd", "repetitions", "peak_rss_mib", "ppl", "kld", "top1_agree"})
        QVERIFY2(o.contains(QLatin1String(key)), key);
    }
    QCOMPARE(rows[0].toObject()["kld"].toDouble(), 0.0);
    QVERIFY(rows[1].toObject()["kld"].toDouble() > 0);
    // --draft: every variant after the first is measured as its draft.
    QVERIFY(!rows[0].toObject()["draft"].toBool() && rows[1].toObject()["draft"].toBool());
    QCOMPARE(rows[1].toObject()["draft_k"].toInt(), 2);
    QVERIFY(rows[1].toObject()["draft_tokens_per_pass"].toDouble() >= 1);
    QProcess lone;
    lone.start(QStringLiteral(PHASELAB_CLI_PATH), {"compare", "-m", QString::fromStdString(stories()), "--draft"});
    QVERIFY(lone.waitForFinished(30000));
    QCOMPARE(lone.exitCode(), 2);
    QVERIFY(lone.readAllStandardError().contains("--draft"));
    // Bad input: exit 2 with one line.
    QProcess bad;
    bad.start(QStringLiteral(PHASELAB_CLI_PATH), {"compare", "-m", QString::fromStdString(stories()), "--quant", "Q3_XX"});
    QVERIFY(bad.waitForFinished(30000));
    QCOMPARE(bad.exitCode(), 2);
    QVERIFY(bad.readAllStandardError().contains("Q3_XX"));
  }
};

QTEST_GUILESS_MAIN(TestCompare)
#include "test_compare.moc"
