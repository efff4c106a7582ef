// The Compare window's batch sweep (offscreen) with stories260K: a sweep on
// its worker thread while the event loop keeps running, its points in order
// in the table and the chart with the roofline, the refusals before anything
// runs, Cancel in the middle and closing while it runs; phaselab
// --batch-sweep unattended.
#include <QChart>
#include <QChartView>
#include <QImage>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QLabel>
#include <QLineSeries>
#include <QProcess>
#include <QSignalSpy>
#include <QTableWidget>
#include <QTemporaryDir>
#include <QTest>
#include <QTimer>

#include "batch_sweep_panel.h"
#include "compare_window.h"
#include "gui_test_util.h"

using namespace phaselab;
using namespace phaselab::ui;

namespace {

QStringList seriesNames(QChart* chart) {
  QStringList names;
  for (QAbstractSeries* s : chart->series()) names << s->name();
  return names;
}

bool anyStartsWith(const QStringList& names, const QString& prefix) {
  return std::any_of(names.begin(), names.end(), [&](const QString& n) { return n.startsWith(prefix); });
}

}  // namespace

class TestGuiBatchSweep : public QObject {
  Q_OBJECT
  QTemporaryDir m_dir;

 private slots:
  void initTestCase() { testing::isolate(m_dir, "test_gui_batch_sweep"); }

  void sweep_measures_each_size_in_order() {
    CompareWindow w(nullptr);
    w.show();
    w.addModel(testing::stories());  // the first variant is the sweep's model
    QCOMPARE(w.batchSweep()->model(), testing::stories());
    w.setThreads(1);
    w.setBatchSweep(QStringLiteral("1,2,4"), 16, 8);
    w.showBatchSweep();
    QSignalSpy done(&w, &CompareWindow::batchSweepFinished);
    int ticks = 0;
    QTimer tick;
    connect(&tick, &QTimer::timeout, [&] { ticks++; });
    tick.start(5);
    QVERIFY(w.startBatchSweep());
    QVERIFY(w.isBatchSweepRunning());
    QVERIFY(!w.startBatchSweep());  // one sweep at a time
    QVERIFY(!w.startRun());         // nor a comparison beside it: both measure speed
    QVERIFY(w.lastError().contains(QStringLiteral("batch sweep is running")));
    QTRY_VERIFY_WITH_TIMEOUT(!w.isBatchSweepRunning(), 120000);
    QCOMPARE(done.size(), 1);
    QVERIFY2(done.first().at(0).toBool(), qPrintable(done.first().at(1).toString()));
    QVERIFY2(ticks > 3, "the event loop stopped while the sweep ran");

    const auto& points = w.batchPoints();
    QCOMPARE(points.size(), size_t(3));
    const int expected[] = {1, 2, 4};
    for (size_t i = 0; i < points.size(); i++) {
      QCOMPARE(points[i].batch, expected[i]);
      QCOMPARE(points[i].n_prompt, 16);
      QCOMPARE(points[i].n_gen, 8);
      QVERIFY(points[i].tg_tps > 0);
      QVERIFY(points[i].tpot_ms > 0);
      QVERIFY(points[i].pp_tps > 0);
    }
    QTableWidget* table = w.batchSweep()->table();
    QCOMPARE(table->rowCount(), 3);
    QCOMPARE(table->item(2, 0)->text(), QStringLiteral("4"));
    QCOMPARE(table->item(0, table->columnCount() - 1)->text(), QStringLiteral("1.00×"));

    // A CPU backend: the peaks were measured, so the roofline is drawn.
    QVERIFY(w.batchRidge() > 0);
    const QStringList names = seriesNames(w.batchSweep()->chart());
    QVERIFY2(anyStartsWith(names, QStringLiteral("decode tok/s")), qPrintable(names.join(QLatin1Char('|'))));
    QVERIFY(anyStartsWith(names, QStringLiteral("TPOT ms")));
    QVERIFY(anyStartsWith(names, QStringLiteral("bandwidth ceiling")));
    const bool ridgeOnChart = w.batchRidge() >= 1 && w.batchRidge() <= 8 * 4;
    QCOMPARE(anyStartsWith(names, QStringLiteral("compute-bound beyond ≈ ")), ridgeOnChart);
    auto* decode = qobject_cast<QLineSeries*>(w.batchSweep()->chart()->series().first());
    QVERIFY(decode);
    QCOMPARE(decode->count(), 3);
    QCOMPARE(decode->at(1).x(), 2.0);
    QVERIFY(w.batchSweep()->findChild<QLabel*>(QStringLiteral("batchSweepSummary"))->text().contains(
        QStringLiteral("compute-bound near batch")));
    // The comparison's charts are its own: the sweep's is not among them.
    QVERIFY(!w.chartViews().contains(w.batchSweep()->chartView()));
  }

  void bad_inputs_are_refused_before_running() {
    CompareWindow w(nullptr);
    QSignalSpy done(&w, &CompareWindow::batchSweepFinished);
    w.setBatchSweep(QStringLiteral("1,2"), 16, 8);
    QVERIFY(!w.startBatchSweep());  // no model yet
    QVERIFY(w.batchSweep()->lastError().contains(QStringLiteral("No model")));
    w.addModel(testing::stories());
    for (const QString& bad : {QStringLiteral("0,x"), QString(), QStringLiteral("1,,2"), QStringLiteral("5000")}) {
      w.setBatchSweep(bad, 16, 8);
      QVERIFY2(!w.startBatchSweep(), qPrintable(bad));
      QVERIFY(!w.isBatchSweepRunning());
      QVERIFY2(w.batchSweep()->lastError().contains(QStringLiteral("from 1 to 4096")), qPrintable(bad));
    }
    QVERIFY(w.batchSweep()->findChild<QLabel*>(QStringLiteral("batchSweepStatus"))->text().contains(QStringLiteral("5000")));
    w.setBatchModel(m_dir.filePath(QStringLiteral("missing.gguf")));
    w.setBatchSweep(QStringLiteral("1,2"), 16, 8);
    QVERIFY(!w.startBatchSweep());
    QVERIFY(w.batchSweep()->lastError().contains(QStringLiteral("No such model file")));
    QCOMPARE(done.size(), 6);
    QVERIFY(w.batchPoints().empty());

    // Sizes are sorted and each measured once.
    QString error;
    const auto sizes = BatchSweepPanel::parseSizes(QStringLiteral(" 8, 1,2,8"), &error);
    QVERIFY2(sizes, qPrintable(error));
    QCOMPARE(*sizes, (std::vector<int>{1, 2, 8}));
  }

  // An error of the engine's (more tokens than the model's context) is shown
  // as text with what to do.
  void engine_error_is_shown_with_a_hint() {
    CompareWindow w(nullptr);
    w.addModel(testing::stories());
    w.setThreads(1);
    w.setBatchSweep(QStringLiteral("1"), 60000, 8);
    QSignalSpy done(&w, &CompareWindow::batchSweepFinished);
    QVERIFY(w.startBatchSweep());
    QVERIFY(done.wait(60000));
    QCOMPARE(done.first().at(0).toBool(), false);
    QVERIFY2(w.batchSweep()->lastError().contains(QStringLiteral("Lower the prompt")),
             qPrintable(w.batchSweep()->lastError()));
    QVERIFY(!w.isBatchSweepRunning());
  }

  void cancel_mid_run_stops() {
    CompareWindow w(nullptr);
    w.addModel(testing::stories());
    w.setThreads(1);
    w.setBatchSweep(QStringLiteral("1,128,256"), 256, 200);  // long enough to cancel after the first size
    QSignalSpy done(&w, &CompareWindow::batchSweepFinished);
    QVERIFY(w.startBatchSweep());
    QTRY_VERIFY_WITH_TIMEOUT(w.batchPoints().size() >= 1, 120000);
    w.cancelBatchSweep();
    QTRY_VERIFY_WITH_TIMEOUT(!w.isBatchSweepRunning(), 60000);
    QCOMPARE(done.size(), 1);
    QCOMPARE(done.first().at(0).toBool(), false);
    QVERIFY(w.batchPoints().size() < 3);
    QCOMPARE(w.batchSweep()->table()->rowCount(), static_cast<int>(w.batchPoints().size()));  // what was measured stays
    // And it runs again afterwards.
    w.setBatchSweep(QStringLiteral("1"), 8, 4);
    QVERIFY(w.startBatchSweep());
    QTRY_VERIFY_WITH_TIMEOUT(!w.isBatchSweepRunning(), 60000);
    QCOMPARE(w.batchPoints().size(), size_t(1));
  }

  void closing_while_running_waits_for_the_worker() {
    auto* w = new CompareWindow(nullptr);
    w->addModel(testing::stories());
    w->setThreads(1);
    w->setBatchSweep(QStringLiteral("1,128,256"), 256, 200);
    QVERIFY(w->startBatchSweep());
    QTest::qWait(50);
    w->close();
    delete w;  // cancels and joins the worker; what it posts later finds no window
    QTest::qWait(100);
  }

  // phaselab --batch-sweep SIZES -m MODEL --quit: the sweep runs unattended
  // and prints its points as JSON; bad sizes are refused before anything runs.
  void unattended_mode() {
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.insert(QStringLiteral("QT_QPA_PLATFORM"), QStringLiteral("offscreen"));
    QProcess p;
    p.setProcessEnvironment(env);
    const QString png = m_dir.filePath(QStringLiteral("batch.png"));
    p.start(QStringLiteral(PHASELAB_GUI_PATH),
            {QStringLiteral("--db"), m_dir.filePath(QStringLiteral("unattended.sqlite")), QStringLiteral("--batch-sweep"),
             QStringLiteral("2,1"), QStringLiteral("-m"), testing::stories(), QStringLiteral("--threads"),
             QStringLiteral("1"), QStringLiteral("--screenshot"), png, QStringLiteral("--quit")});
    QVERIFY(p.waitForFinished(300000));
    QVERIFY2(p.exitCode() == 0, p.readAllStandardError().constData());
    const QJsonArray points = QJsonDocument::fromJson(p.readAllStandardOutput()).array();
    QCOMPARE(points.size(), 2);
    QCOMPARE(points[0].toObject()[QStringLiteral("batch")].toInt(), 1);
    QVERIFY(points[1].toObject()[QStringLiteral("tg_tps")].toDouble() > 0);
    QVERIFY(QImage(png).width() > 400);
    QProcess bad;
    bad.setProcessEnvironment(env);
    bad.start(QStringLiteral(PHASELAB_GUI_PATH),
              {QStringLiteral("--batch-sweep"), QStringLiteral("0,x"), testing::stories(), QStringLiteral("--quit")});
    QVERIFY(bad.waitForFinished(60000));
    QCOMPARE(bad.exitCode(), 2);
    QVERIFY(bad.readAllStandardError().contains("from 1 to 4096"));
  }
};

QTEST_MAIN(TestGuiBatchSweep)
#include "test_gui_batch_sweep.moc"
