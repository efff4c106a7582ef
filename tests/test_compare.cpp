// phaselab/compare.h and `phaselab-cli compare`: the rows' contract (the
// reference has KL 0 and top-1 agreement 1; a quantization of it is close
// but not equal), the cache of quantized variants, refusals before anything
// runs, and the CLI's JSON.
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QProcess>
#include <QTemporaryDir>
#include <QTest>
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
    CompareOptions odd = o;
    odd.n_ctx = 63;
    CompareVariant ok;
    ok.file = stories();
    QVERIFY(!validate_compare({ok}, odd));
    QVERIFY(validate_compare({ok}, o));
  }

  void cancel_stops_the_run() {
    CompareVariant v;
    v.file = stories();
    std::atomic<bool> cancel{true};
    auto rows = run_compare({v}, small(m_dir.path().toStdString()), {}, &cancel);
    QVERIFY(!rows.is_ok());
    QCOMPARE(rows.status().code(), StatusCode::cancelled);
  }

  void cli_json_contract() {
    QProcess p;
    p.start(QStringLiteral(PHASELAB_CLI_PATH),
            {"compare", "-m", QString::fromStdString(stories()), "--quant", "Q4_0", "-c", "64", "--chunks", "2", "-p",
             "32", "-n", "16", "-r", "1", "-t", "1", "--cache", m_dir.filePath("cli-cache"), "--json"});
    QVERIFY(p.waitForFinished(120000));
    QCOMPARE(p.exitCode(), 0);
    const QJsonArray rows = QJsonDocument::fromJson(p.readAllStandardOutput()).array();
    QCOMPARE(rows.size(), 2);
    for (const auto& r : rows) {
      const QJsonObject o = r.toObject();
      for (const char* key : {"name", "file", "type_mix", "size_mib", "pp512", "tg128", "ttft_ms", "peak_rss_mib",
                              "ppl", "kld", "top1_agree"})
        QVERIFY2(o.contains(QLatin1String(key)), key);
    }
    QCOMPARE(rows[0].toObject()["kld"].toDouble(), 0.0);
    QVERIFY(rows[1].toObject()["kld"].toDouble() > 0);
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
