// The Serving lab (offscreen) on a result written per the contract of
// `phaselab-cli bench --serving --json` (tests/data/serving-fixture.json,
// made by make-serving-fixture.py: a baseline, prefill-first, chunked:256
// and disaggregated:1+1 with one 2000-token prompt): the parser's rows and
// its clear errors on bad or cut-short JSON; the timeline's geometry, where
// the stall under prefill-first is a far wider gap than under chunked and
// lies under the long prompt's prefill band; the table's formatted figures;
// the CDF charts; saving, reopening with the inputs, export and import;
// the child-process path with a stand-in CLI (results, an error, Cancel);
// the window at 800x600 and 1280x800; the main window's action; and a run
// of the real phaselab-cli on stories260K under the three policies.
#include <QAction>
#include <QChart>
#include <QComboBox>
#include <QLabel>
#include <QFile>
#include <QLineSeries>
#include <QLogValueAxis>
#include <QScrollArea>
#include <QScrollBar>
#include <QSignalSpy>
#include <QTableWidget>
#include <QTemporaryDir>
#include <QTest>
#include <algorithm>

#include "conversation_store.h"
#include "gui_test_util.h"
#include "main_window.h"
#include "serving_charts.h"
#include "serving_inputs.h"
#include "serving_lab_window.h"
#include "serving_process.h"
#include "serving_result.h"
#include "serving_timeline.h"

using namespace phaselab::ui;

namespace {

QByteArray fixtureText() {
  QFile f(QStringLiteral(PHASELAB_TEST_DATA "/serving-fixture.json"));
  if (!f.open(QIODevice::ReadOnly)) return {};
  return f.readAll();
}

ServingResult fixture() {
  QString error;
  auto r = parseServingResult(fixtureText(), &error);
  if (!r) qFatal("fixture: %s", qPrintable(error));
  return *r;
}

const ServingRow* rowByLabel(const ServingResult& r, const QString& label) {
  for (const ServingRow& row : r.rows)
    if (row.label == label) return &row;
  return nullptr;
}

// The widest stall drawn in a chat lane (pixels).
double widestChatStallPx(const TimelineModel& m, const std::vector<LaidOutLane>& lanes) {
  double w = 0;
  for (size_t i = 0; i < lanes.size(); i++)
    if (!m.lanes[i].isLong) w = std::max(w, lanes[i].stall.width());
  return w;
}

}  // namespace

class TestGuiServingLab : public QObject {
  Q_OBJECT
  QTemporaryDir m_dir;
  ConversationStore m_store;

  // A stand-in for phaselab-cli: a shell script with this body.
  QString fakeCli(const QString& name, const QString& body) {
    const QString path = m_dir.filePath(name);
    QFile f(path);
    if (!f.open(QIODevice::WriteOnly)) return {};
    f.write(("#!/bin/sh\n" + body + "\n").toUtf8());
    f.close();
    f.setPermissions(f.permissions() | QFileDevice::ExeOwner);
    return path;
  }

 private slots:
  void initTestCase() {
    testing::isolate(m_dir, "test_gui_serving_lab");
    QVERIFY(m_store.open(m_dir.filePath(QStringLiteral("lab.sqlite"))));
    QVERIFY(!fixtureText().isEmpty());
  }

  void parser_reads_the_contract() {
    QString error;
    const auto r = parseServingResult(fixtureText(), &error);
    QVERIFY2(r, qPrintable(error));
    QCOMPARE(r->model, QStringLiteral("gemma-3-270m-q4_k_m.gguf"));
    QCOMPARE(r->threads, 2);
    QCOMPARE(r->workload.streams, 4);
    QCOMPARE(r->workload.longPrompt, 2000);
    QCOMPARE(r->ttftTargetMs, 5000.0);
    QCOMPARE(r->itlTargetMs, 250.0);
    QCOMPARE(r->rows.size(), size_t(4));
    QVERIFY(r->rows[0].isBaseline());
    QCOMPARE(r->rows[1].policy, QStringLiteral("prefill-first"));
    QCOMPARE(r->rows[2].policy, QStringLiteral("chunked:256"));
    QCOMPARE(r->rows[3].policy, QStringLiteral("disaggregated:1+1"));
    for (size_t i = 1; i < 4; i++) QVERIFY(!r->rows[i].isBaseline());
    const ServingRow& pf = r->rows[1];
    QCOMPARE(pf.requests, 9);
    QCOMPARE(pf.timeline.size(), size_t(9));
    QCOMPARE(std::count_if(pf.timeline.begin(), pf.timeline.end(), [](const ServingRequestTrace& t) { return t.isLong; }), 1);
    QCOMPARE(pf.ttftLongMs.n, 1);
    QCOMPARE(pf.ttftLongMs.p50, 2345.0);
    QCOMPARE(pf.itlMs.n, 8 * 127);
    QCOMPARE(r->rows[3].kvTransfers, 1);
    QCOMPARE(r->rows[3].kvTransferBytes, 36864000.0);
    QCOMPARE(r->rows[3].kvTransferMs, 3.7);
    // The CLI's max stall is the largest gap of the chat timelines it printed.
    for (const ServingRow& row : r->rows) QVERIFY(qAbs(largestChatGapMs(row) - row.maxStallMs) < 0.01);
    // The stall: under prefill-first about the long prompt's prefill, under chunked a few gaps.
    QVERIFY(pf.maxStallMs > 0.9 * pf.ttftLongMs.p50);
    QVERIFY(r->rows[2].maxStallMs < 4 * r->rows[2].itlMs.p50);
  }

  void parser_round_trips() {
    const ServingResult r = fixture();
    QString error;
    const auto back = parseServingResult(servingResultJson(r), &error);
    QVERIFY2(back, qPrintable(error));
    QCOMPARE(servingResultJson(*back), servingResultJson(r));
    QCOMPARE(back->rows[1].timeline[4].tokenMs, r.rows[1].timeline[4].tokenMs);
  }

  void parser_refuses_bad_input_clearly() {
    const QByteArray text = fixtureText();
    struct Case {
      QByteArray json;
      const char* says;
    };
    const Case cases[] = {
        {text.left(text.size() / 2), "not valid JSON"},
        {text.left(text.size() - 3), "not valid JSON"},
        {QByteArray(), "empty"},
        {QByteArray("\x01\xff garbage"), "not valid JSON"},
        {QByteArray("[1, 2]"), "not a JSON object"},
        {QByteArray("{}"), "\"rows\""},
        {QByteArray("{\"rows\": 3}"), "\"rows\""},
        {QByteArray("{\"rows\": []}"), "no rows"},
        {QByteArray("{\"rows\": [{\"label\": \"x\"}]}"), "Row 1"},
        {QByteArray("{\"rows\": [7]}"), "Row 1"},
        {QByteArray("{\"rows\": [{\"policy\": \"chunked:8\", \"timeline\": [{\"token_ms\": [1, \"a\"]}]}]}"), "timeline entry 1"},
        {QByteArray("{\"rows\": [{\"policy\": \"chunked:8\", \"timeline\": {}}]}"), "timeline"},
    };
    for (const Case& c : cases) {
      QString error;
      QVERIFY2(!parseServingResult(c.json, &error), c.says);
      QVERIFY2(error.contains(QLatin1String(c.says)), qPrintable(error));
    }
    QString error;
    parseServingResult(text.left(text.size() / 2), &error);
    QVERIFY2(error.contains(QStringLiteral("run it again")), qPrintable(error));  // says what to do
  }

  void stderr_lines() {
    auto p = parseServingStderrLine(R"({"progress": {"run": 2, "of": 4, "label": "chunked:256", "elapsed_s": 3.2, "requests_done": 5}})");
    QCOMPARE(p.kind, ServingStderrLine::Progress);
    QCOMPARE(p.progress.run, 2);
    QCOMPARE(p.progress.of, 4);
    QCOMPARE(p.progress.label, QStringLiteral("chunked:256"));
    QCOMPARE(p.progress.requestsDone, 5);
    QCOMPARE(parseServingStderrLine(R"({"done": true})").kind, ServingStderrLine::Done);
    const auto e = parseServingStderrLine(R"({"error": "unknown policy 'x'"})");
    QCOMPARE(e.kind, ServingStderrLine::Error);
    QCOMPARE(e.error, QStringLiteral("unknown policy 'x'"));
    QCOMPARE(parseServingStderrLine("warning: something").kind, ServingStderrLine::Other);
    QCOMPARE(parseServingStderrLine("{broken").kind, ServingStderrLine::Other);
  }

  void arguments_name_the_workload() {
    ServingRequest r;
    r.model = QStringLiteral("/m/g.gguf");
    r.threads = 2;
    r.policies = {QStringLiteral("prefill-first"), QStringLiteral("chunked:256")};
    r.streams = 3;
    r.longPrompt = 1500;
    const QStringList a = ServingProcess::arguments(r);
    QCOMPARE(a.mid(0, 2), (QStringList{QStringLiteral("bench"), QStringLiteral("--serving")}));
    QCOMPARE(a[a.indexOf(QStringLiteral("-m")) + 1], r.model);
    QCOMPARE(a[a.indexOf(QStringLiteral("--policy")) + 1], QStringLiteral("prefill-first,chunked:256"));
    QCOMPARE(a[a.indexOf(QStringLiteral("--streams")) + 1], QStringLiteral("3"));
    QCOMPARE(a[a.indexOf(QStringLiteral("--long-prompt")) + 1], QStringLiteral("1500"));
    QCOMPARE(a[a.indexOf(QStringLiteral("-t")) + 1], QStringLiteral("2"));
    QVERIFY(a.contains(QStringLiteral("--json")) && a.contains(QStringLiteral("--progress-json")));
    QVERIFY(!a.contains(QStringLiteral("--no-baseline")));
    r.baseline = false;
    QVERIFY(ServingProcess::arguments(r).contains(QStringLiteral("--no-baseline")));
  }

  void timeline_lays_out_the_stall() {
    const ServingResult r = fixture();
    const TimelineModel pf = timelineModel(*rowByLabel(r, QStringLiteral("prefill-first")));
    const TimelineModel ch = timelineModel(*rowByLabel(r, QStringLiteral("chunked:256")));
    // One lane per chat stream, then the long request.
    QCOMPARE(pf.lanes.size(), size_t(5));
    for (size_t i = 0; i < 4; i++) QVERIFY(!pf.lanes[i].isLong);
    QVERIFY(pf.lanes[4].isLong);
    QCOMPARE(pf.lanes[0].ticksMs.size(), size_t(2 * 128));
    QCOMPARE(pf.lanes[4].prefillMs.size(), size_t(1));
    // Both on one scale, as the window draws them.
    const double span = std::max(pf.endMs, ch.endMs);
    const QRectF plot(60, 0, 1000, 200);
    const auto pfLanes = layoutTimeline(pf, plot, span);
    const auto chLanes = layoutTimeline(ch, plot, span);
    QCOMPARE(pfLanes.size(), size_t(5));
    for (const LaidOutLane& l : pfLanes) QVERIFY(plot.contains(l.rect.center()));
    const double pfStall = widestChatStallPx(pf, pfLanes), chStall = widestChatStallPx(ch, chLanes);
    qInfo("widest chat gap: prefill-first %.0f px, chunked %.0f px (of %.0f)", pfStall, chStall, plot.width());
    QVERIFY(pfStall > 100);
    QVERIFY(pfStall > 10 * chStall);
    // The gap lies under the long prompt's band, in every chat lane.
    const QRectF band = pfLanes[4].bands.at(0);
    QVERIFY(band.width() > 100);
    for (size_t i = 0; i < 4; i++) {
      const QRectF stall = pfLanes[i].stall;
      QVERIFY(stall.width() > 0.8 * band.width());
      QVERIFY(stall.left() < band.right() && stall.right() > band.left());
    }
    // Each chat lane marks its two requests' arrivals; the long lane its one.
    QCOMPARE(pfLanes[0].arrivalX.size(), size_t(2));
    QCOMPARE(pfLanes[4].arrivalX.size(), size_t(1));
    QCOMPARE(pfLanes[4].arrivalX[0], pfLanes[4].bands[0].left());
    // Ticks are token times on that scale.
    QCOMPARE(pfLanes[0].tickX.front(), plot.left() + pf.lanes[0].ticksMs.front() / span * plot.width());
    // The widget draws that layout in its plot area.
    ServingTimelineWidget w;
    w.resize(900, 300);
    w.setRow(*rowByLabel(r, QStringLiteral("prefill-first")), span);
    QCOMPARE(w.model().lanes.size(), size_t(5));
    QVERIFY(w.plotRect().width() > 700);
    QCOMPARE(w.spanMs(), span);
  }

  void window_shows_the_result() {
    ServingLabWindow w(&m_store);
    w.resize(1280, 800);
    w.show();
    QVERIFY(QTest::qWaitForWindowExposed(&w));
    const ServingResult r = fixture();
    w.showResult(r);
    // Every run one above the other first, on one time axis; then each alone.
    QCOMPARE(w.policySelector()->count(), 5);
    QCOMPARE(w.timeline()->groupCount(), 4);
    QCOMPARE(w.timeline()->group(1).title, QStringLiteral("prefill-first"));
    QCOMPARE(w.timeline()->group(0).model.lanes.size(), size_t(4));  // the baseline has no long lane
    QCOMPARE(w.timeline()->group(1).model.lanes.size(), size_t(5));
    for (int g = 1; g < 4; g++) {
      QVERIFY(w.timeline()->groupRect(g).top() >= w.timeline()->groupRect(g - 1).bottom());
      QVERIFY(w.timeline()->plotRect().contains(w.timeline()->groupRect(g)));
    }
    w.policySelector()->setCurrentIndex(2);
    QCOMPARE(w.timeline()->groupCount(), 1);
    QCOMPARE(w.timeline()->model().lanes.size(), size_t(5));
    QCOMPARE(w.timeline()->groupRect(0), w.timeline()->plotRect());
    QTableWidget* t = w.resultsTable();
    QCOMPARE(t->rowCount(), 4);
    auto cell = [t](int row, int col) { return t->item(row, col)->text(); };
    QCOMPARE(cell(1, 0), QStringLiteral("prefill-first"));
    QCOMPARE(cell(1, 1), QStringLiteral("68.1 / 2163"));  // TTFT p50 / p99 (ms): 68.07, 2163.2
    QCOMPARE(cell(1, 2), QStringLiteral("2345 / 2345"));  // the long request's
    QCOMPARE(cell(1, 3), QStringLiteral("32.7 / 38.3"));  // ITL p50 / p99: 32.68, 38.3
    QCOMPARE(cell(1, 4), QStringLiteral("2383"));         // max stall: 2383.34 ms
    QCOMPARE(cell(0, 2), QStringLiteral("—"));            // the baseline has no long request
    QCOMPARE(cell(1, 6), QStringLiteral("0.46/s (56%)"));  // 5 of 9 requests in 10.8 s
    QCOMPARE(cell(3, 7), QStringLiteral("35.2 MiB, 3.7 ms"));  // 36,864,000 bytes
    QCOMPARE(cell(2, 7), QStringLiteral("—"));
    QCOMPARE(cell(2, 5), QStringLiteral("100.7"));        // tokens/s
    QVERIFY(t->item(1, 3)->toolTip().contains(QString::number(8 * 127)));  // what it divides by
    // The table fits the window: no column cut off.
    QVERIFY(t->horizontalScrollBar()->maximum() == 0);
    // A CDF per run, the ITL on a log axis (30 ms gaps beside a 2.4 s stall).
    QCOMPARE(w.itlChart()->series().size(), 4);
    QCOMPARE(w.ttftChart()->series().size(), 4);
    QVERIFY(!w.itlChart()->axes(Qt::Horizontal).isEmpty());
    QVERIFY(qobject_cast<QLogValueAxis*>(w.itlChart()->axes(Qt::Horizontal).first()));
    auto* pfItl = qobject_cast<QLineSeries*>(w.itlChart()->series().at(1));
    QVERIFY(pfItl);
    QCOMPARE(pfItl->points().last().y(), 1.0);
    QVERIFY(pfItl->points().last().x() > 2000);
    for (const ServingRow& row : r.rows) QVERIFY(w.cdfLegend()->text().contains(row.label.toHtmlEscaped()));
    QVERIFY(w.explanation()->text().contains(QStringLiteral("Goodput")));
  }

  void cdf_points() {
    const QList<QPointF> p = cdfPoints({3, 1, 2, 2});
    QCOMPARE(p.first(), QPointF(1, 0));
    QCOMPARE(p.last(), QPointF(3, 1));
    for (qsizetype i = 1; i < p.size(); i++) QVERIFY(p[i].x() >= p[i - 1].x() && p[i].y() >= p[i - 1].y());
    std::vector<double> many(100000);
    for (size_t i = 0; i < many.size(); i++) many[i] = static_cast<double>(i % 977);
    QVERIFY(cdfPoints(many).size() <= 620);
    QVERIFY(cdfPoints({}).isEmpty());
  }

  void saved_and_reopened_with_inputs() {
    ServingLabWindow w(&m_store);
    ServingRequest in;
    in.model = testing::stories();
    in.threads = 1;
    in.policies = {QStringLiteral("chunked:64"), QStringLiteral("chunked:auto"), QStringLiteral("disaggregated:2+3")};
    in.streams = 6;
    in.longPrompt = 700;
    in.longCount = 3;
    in.longRate = 0.5;
    in.durationS = 20;
    in.ttftTargetMs = 1500;
    in.itlTargetMs = 90;
    in.baseline = false;
    w.inputs()->setRequest(in);
    const ServingResult r = fixture();
    const int before = m_store.servingRuns().size();
    const qint64 id = w.saveResult(r, QStringLiteral("round trip"));
    QVERIFY(id > 0);
    QCOMPARE(m_store.servingRuns().size(), before + 1);
    QCOMPARE(w.savedRuns()->itemData(0).toLongLong(), id);

    ServingLabWindow reopened(&m_store);
    QVERIFY(reopened.openSavedRun(id));
    QVERIFY(reopened.result());
    QCOMPARE(servingResultJson(*reopened.result()), servingResultJson(r));
    QCOMPARE(reopened.resultsTable()->rowCount(), 4);
    const ServingRequest back = reopened.inputs()->request();
    QCOMPARE(back.model, in.model);
    QCOMPARE(back.threads, in.threads);
    QCOMPARE(back.policies, in.policies);
    QCOMPARE(back.streams, in.streams);
    QCOMPARE(back.longPrompt, in.longPrompt);
    QCOMPARE(back.longCount, in.longCount);
    QCOMPARE(back.longRate, in.longRate);
    QCOMPARE(back.durationS, in.durationS);
    QCOMPARE(back.ttftTargetMs, in.ttftTargetMs);
    QCOMPARE(back.itlTargetMs, in.itlTargetMs);
    QCOMPARE(back.baseline, in.baseline);
    QVERIFY(!reopened.openSavedRun(-3));
    QVERIFY(!reopened.lastError().isEmpty());
    QVERIFY(m_store.deleteServingRun(id));
    QCOMPARE(m_store.servingRuns().size(), before);
  }

  void export_and_import() {
    ServingLabWindow w(&m_store);
    QVERIFY(!w.exportJson(m_dir.filePath(QStringLiteral("none.json"))));  // nothing shown yet
    w.showResult(fixture());
    const QString json = m_dir.filePath(QStringLiteral("serving.json")), csv = m_dir.filePath(QStringLiteral("serving.csv"));
    QVERIFY(w.exportJson(json));
    QVERIFY(w.exportCsv(csv));
    QFile c(csv);
    QVERIFY(c.open(QIODevice::ReadOnly));
    const QList<QByteArray> lines = c.readAll().trimmed().split('\n');
    QCOMPARE(lines.size(), 5);
    QVERIFY(lines[0].startsWith("label,policy,target"));
    QVERIFY(lines[2].startsWith("prefill-first,prefill-first,in-process,9,9,"));
    QVERIFY(lines[2].contains(",2383.34,"));
    QVERIFY(lines[4].contains(",36864000,"));

    ServingLabWindow other(&m_store);
    const int before = m_store.servingRuns().size();
    QVERIFY2(other.importResults(json), qPrintable(other.lastError()));
    QCOMPARE(servingResultJson(*other.result()), servingResultJson(fixture()));
    QCOMPARE(m_store.servingRuns().size(), before + 1);  // an opened result is kept like a run
    // Its inputs are the result's workload.
    const ServingRequest q = other.inputs()->request();
    QCOMPARE(q.streams, 4);
    QCOMPARE(q.longPrompt, 2000);
    QCOMPARE(q.policies, (QStringList{QStringLiteral("prefill-first"), QStringLiteral("chunked:256"),
                                      QStringLiteral("disaggregated:1+1")}));
    QVERIFY(q.baseline);

    // A cut-short file: an error that says so, the result shown stays.
    const QString cut = m_dir.filePath(QStringLiteral("cut.json"));
    QFile f(cut);
    QVERIFY(f.open(QIODevice::WriteOnly));
    f.write(fixtureText().left(5000));
    f.close();
    QVERIFY(!other.importResults(cut));
    QVERIFY2(other.lastError().contains(QStringLiteral("not valid JSON")), qPrintable(other.lastError()));
    QVERIFY(other.result());
    QVERIFY(!other.importResults(m_dir.filePath(QStringLiteral("missing.json"))));
    QCOMPARE(m_store.servingRuns().size(), before + 1);
  }

  // The child-process path with stand-ins for phaselab-cli.
  void run_in_a_child() {
    ServingLabWindow w(&m_store);
    w.inputs()->setModel(testing::stories());
    const QString ok = fakeCli(QStringLiteral("cli-ok"), QStringLiteral(
        "echo '{\"progress\": {\"run\": 1, \"of\": 4, \"label\": \"baseline\", \"elapsed_s\": 0.1, \"requests_done\": 0}}' >&2\n"
        "echo 'a warning line' >&2\n"
        "cat '" PHASELAB_TEST_DATA "/serving-fixture.json'\n"
        "echo '{\"done\": true}' >&2"));
    w.setCliPath(ok);
    const int before = m_store.servingRuns().size();
    QSignalSpy done(&w, &ServingLabWindow::runFinished);
    QVERIFY(w.startRun());
    QVERIFY(!w.startRun());  // one at a time
    QVERIFY(done.wait(20000));
    QVERIFY2(done.first().at(0).toBool(), qPrintable(done.first().at(1).toString()));
    QCOMPARE(w.result()->rows.size(), size_t(4));
    QCOMPARE(m_store.servingRuns().size(), before + 1);
    QVERIFY(w.childCommand().contains(QStringLiteral("bench --serving")));

    const QString failing = fakeCli(QStringLiteral("cli-fail"), QStringLiteral(
        "echo '{\"error\": \"unknown policy: fifo (use prefill-first, chunked:N or disaggregated:P+D)\"}' >&2\nexit 2"));
    w.setCliPath(failing);
    done.clear();
    QVERIFY(w.startRun());
    QVERIFY(done.wait(20000));
    QVERIFY(!done.first().at(0).toBool());
    QVERIFY2(done.first().at(1).toString().startsWith(QStringLiteral("unknown policy: fifo")), qPrintable(done.first().at(1).toString()));
    QVERIFY(!w.result());  // the failed run's (nothing), not the last one's

    const QString garbled = fakeCli(QStringLiteral("cli-cut"), QStringLiteral("echo '{\"rows\": [{\"policy\": '"));
    w.setCliPath(garbled);
    done.clear();
    QVERIFY(w.startRun());
    QVERIFY(done.wait(20000));
    QVERIFY(!done.first().at(0).toBool());
    QVERIFY2(done.first().at(1).toString().contains(QStringLiteral("not valid JSON")), qPrintable(done.first().at(1).toString()));

    const QString slow = fakeCli(QStringLiteral("cli-slow"), QStringLiteral("exec sleep 60"));
    w.setCliPath(slow);
    done.clear();
    QVERIFY(w.startRun());
    QVERIFY(w.isRunning());
    w.cancelRun();
    QVERIFY(done.wait(10000));  // SIGTERM, not the 60 s
    QCOMPARE(done.first().at(1).toString(), QStringLiteral("cancelled"));
    QVERIFY(!w.isRunning());

    // Refusals before anything starts.
    w.inputs()->setModel(m_dir.filePath(QStringLiteral("no-such.gguf")));
    QVERIFY(!w.startRun());
    QVERIFY(w.lastError().contains(QStringLiteral("does not exist")));
    w.inputs()->setModel(testing::stories());
    w.setCliPath(m_dir.filePath(QStringLiteral("no-such-cli")));
    QVERIFY(!w.startRun());
    QVERIFY(!w.lastError().isEmpty());
  }

  // The real phaselab-cli on stories260K: the window runs the policies and
  // the baseline in a child and shows what the CLI measured.
  void real_cli_runs_every_policy() {
    ServingLabWindow w(&m_store);
    ServingRequest r;
    r.model = testing::stories();
    r.threads = 2;
    r.policies = {QStringLiteral("prefill-first"), QStringLiteral("chunked:16"), QStringLiteral("chunked:auto"),
                  QStringLiteral("disaggregated:1+1")};
    r.streams = 2;
    r.longPrompt = 300;
    r.longCount = 2;
    r.longRate = 4;
    w.inputs()->setRequest(r);
    w.setCliPath(QStringLiteral(PHASELAB_CLI_PATH));
    const int before = m_store.servingRuns().size();
    QSignalSpy done(&w, &ServingLabWindow::runFinished);
    QVERIFY(w.startRun());
    QVERIFY(w.childCommand().contains(QStringLiteral("--policy prefill-first,chunked:16,chunked:auto,disaggregated:1+1")));
    QVERIFY(done.wait(240000));
    QVERIFY2(done.first().at(0).toBool(), qPrintable(done.first().at(1).toString()));
    QCOMPARE(m_store.servingRuns().size(), before + 1);
    const ServingResult& res = *w.result();
    QCOMPARE(res.rows.size(), size_t(5));
    QVERIFY(res.rows[0].isBaseline());
    QCOMPARE(res.rows[1].policy, QStringLiteral("prefill-first"));
    QCOMPARE(res.rows[2].policy, QStringLiteral("chunked:16"));
    QCOMPARE(res.rows[3].policy, QStringLiteral("chunked:auto"));
    QCOMPARE(res.rows[4].policy, QStringLiteral("disaggregated:1+1"));
    QCOMPARE(w.resultsTable()->rowCount(), 5);
    for (const ServingRow& row : res.rows) {
      const int longs = row.isBaseline() ? 0 : 2;
      QCOMPARE(row.ok, row.requests);
      QVERIFY2(row.requests >= 2 + longs, qPrintable(row.label));
      QCOMPARE(int(row.timeline.size()), row.requests);
      int longSeen = 0;
      for (const ServingRequestTrace& t : row.timeline) {
        longSeen += t.isLong;
        QCOMPARE(int(t.tokenMs.size()), t.isLong ? res.workload.longAnswer : res.workload.chatAnswer);
        QVERIFY(t.arriveMs <= t.firstTokenMs && t.firstTokenMs == t.tokenMs.front());
        QVERIFY(std::is_sorted(t.tokenMs.begin(), t.tokenMs.end()));
        if (t.isLong) QCOMPARE(t.nPrompt, 300);
      }
      QCOMPARE(longSeen, longs);
      // The CLI's longest stall is the widest gap of the timeline drawn.
      QVERIFY2(std::abs(largestChatGapMs(row) - row.maxStallMs) < 0.01, qPrintable(row.label));
      // Every disaggregated request's K/V went from the prefill worker to the decode worker.
      if (row.policy.startsWith(QStringLiteral("disaggregated"))) {
        QCOMPARE(row.kvTransfers, row.requests);
        QVERIFY(row.kvTransferBytes > 0 && !row.placement.isEmpty());
      } else {
        QCOMPARE(row.kvTransfers, 0);
      }
    }
  }

  void fits_800x600_and_1280x800() {
    for (const QSize size : {QSize(800, 600), QSize(1280, 800)}) {
      ServingLabWindow w(&m_store);
      w.resize(size);
      w.show();
      QVERIFY(QTest::qWaitForWindowExposed(&w));
      w.showResult(fixture());
      QTest::qWait(50);
      auto* scroll = qobject_cast<QScrollArea*>(w.centralWidget());
      QVERIFY(scroll);
      // Nothing cut on the right: the page is no wider than the window.
      QVERIFY2(scroll->horizontalScrollBar()->maximum() == 0,
               qPrintable(QStringLiteral("%1x%2: %3 px too wide").arg(size.width()).arg(size.height())
                              .arg(scroll->horizontalScrollBar()->maximum())));
      QVERIFY(w.timeline()->isVisible());
      QVERIFY(w.timeline()->height() >= 5 * 10);
    }
  }

  void main_window_opens_the_lab() {
    MainWindow w(testing::windowOptions(m_dir.filePath(QStringLiteral("main.sqlite"))));
    w.show();
    QAction* a = w.findChild<QAction*>(QStringLiteral("servingLabAction"));
    QVERIFY(a);
    a->trigger();
    ServingLabWindow* lab = w.servingLabWindow();
    QVERIFY(lab->isVisible());
    QCOMPARE(lab, w.servingLabWindow());  // made once
  }
};

QTEST_MAIN(TestGuiServingLab)
#include "test_gui_serving_lab.moc"
