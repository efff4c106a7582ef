// The Compare window (offscreen) with stories260K and a quantization of it:
// a run on its worker thread while the event loop keeps running, the table
// and charts, the run saved and reopened, CSV and JSON export, Cancel, and
// the refusals before anything runs; the main window's Compare action.
#include <QAction>
#include <QChart>
#include <QChartView>
#include <QFile>
#include <QImage>
#include <QProcess>
#include <QJsonArray>
#include <QJsonDocument>
#include <QSignalSpy>
#include <QTableWidget>
#include <QTemporaryDir>
#include <QTest>
#include <QTimer>

#include "compare_window.h"
#include "conversation_store.h"
#include "engine_controller.h"
#include "gui_test_util.h"
#include "main_window.h"
#include "phaselab/log.h"

using namespace phaselab;
using namespace phaselab::ui;

class TestGuiCompare : public QObject {
  Q_OBJECT
  QTemporaryDir m_dir;
  ConversationStore m_store;

  void small(CompareWindow& w) {
    w.setTextFile(QString::fromStdString(bundled_text_path("eval-en.txt")));
    w.setChunks(2);
    w.setThreads(1);
    w.setSpeedTests(32, 16, 1);
  }

 private slots:
  void initTestCase() {
    testing::isolate(m_dir, "test_gui_compare");
    QVERIFY(m_store.open(m_dir.filePath(QStringLiteral("compare.sqlite"))));
  }

  void run_shows_saves_and_exports() {
    CompareWindow w(&m_store);
    w.show();
    w.addModel(testing::stories());
    QVERIFY(w.addQuantization(QStringLiteral("Q8_0")));
    QVERIFY(!w.addQuantization(QStringLiteral("Q3_XX")));
    QCOMPARE(w.variantCount(), 2);
    small(w);
    const int savedBefore = m_store.compareRuns().size();
    QSignalSpy done(&w, &CompareWindow::runFinished);
    int ticks = 0;
    QTimer tick;
    connect(&tick, &QTimer::timeout, [&] { ticks++; });
    tick.start(5);
    QVERIFY(w.startRun());
    QVERIFY(w.isRunning());
    QVERIFY(!w.startRun());  // one run at a time
    QVERIFY(done.wait(180000));
    QVERIFY2(done.first().at(0).toBool(), qPrintable(done.first().at(1).toString()));
    QVERIFY2(ticks > 3, "the event loop stopped while the comparison ran");  // it ran on the worker thread
    QCOMPARE(w.rows().size(), size_t(2));
    QCOMPARE(w.rows()[0].kld, 0.0);
    QVERIFY(w.rows()[1].kld > 0);
    QCOMPARE(w.resultsTable()->rowCount(), 2);
    QVERIFY(w.resultsTable()->item(0, 0)->text().contains(QStringLiteral("reference")));
    for (QChartView* v : w.chartViews()) QVERIFY2(!v->chart()->series().isEmpty(), qPrintable(v->chart()->title()));

    // Saved, and reopened as it was.
    const auto runs = m_store.compareRuns();
    QCOMPARE(runs.size(), savedBefore + 1);
    QString error;
    const auto back = CompareWindow::rowsFromJson(runs.first().rows, &error);
    QVERIFY2(back.size() == 2, qPrintable(error));
    QCOMPARE(back[1].kld, w.rows()[1].kld);
    QCOMPARE(back[0].name, w.rows()[0].name);
    CompareWindow reopened(&m_store);
    QVERIFY(reopened.openSavedRun(runs.first().id));
    QCOMPARE(reopened.resultsTable()->rowCount(), 2);
    QVERIFY(!reopened.openSavedRun(-5));

    // Export.
    const QString csv = m_dir.filePath(QStringLiteral("c.csv")), json = m_dir.filePath(QStringLiteral("c.json"));
    QVERIFY(w.exportCsv(csv));
    QVERIFY(w.exportJson(json));
    QFile c(csv);
    QVERIFY(c.open(QIODevice::ReadOnly));
    const QList<QByteArray> lines = c.readAll().trimmed().split('\n');
    QCOMPARE(lines.size(), 3);
    QVERIFY(lines[0].startsWith("name,file,"));
    QFile j(json);
    QVERIFY(j.open(QIODevice::ReadOnly));
    QCOMPARE(QJsonDocument::fromJson(j.readAll()).array().size(), 2);
    CompareWindow empty(&m_store);
    QVERIFY(!empty.exportCsv(csv));  // nothing to export yet
  }

  void cancel_stops_without_saving() {
    CompareWindow w(&m_store);
    w.addModel(testing::stories());
    w.addQuantization(QStringLiteral("Q4_0"));
    small(w);
    w.setChunks(50);  // long enough to cancel in the middle
    const int before = m_store.compareRuns().size();
    QSignalSpy done(&w, &CompareWindow::runFinished);
    QVERIFY(w.startRun());
    w.cancelRun();
    QVERIFY(done.wait(60000));
    QCOMPARE(done.first().at(0).toBool(), false);
    QCOMPARE(m_store.compareRuns().size(), before);
    QVERIFY(!w.isRunning());
  }

  void refusals_before_running() {
    CompareWindow w(&m_store);
    small(w);
    QSignalSpy done(&w, &CompareWindow::runFinished);
    QVERIFY(!w.startRun());  // no variants
    QVERIFY(w.lastError().contains(QStringLiteral("at least one model")));
    QVERIFY(!w.addQuantization(QStringLiteral("Q8_0")));  // no model to quantize yet
    w.addModel(m_dir.filePath(QStringLiteral("missing.gguf")));
    QVERIFY(!w.startRun());
    QVERIFY(w.lastError().contains(QStringLiteral("no such model file")));
    CompareWindow noText(&m_store);
    noText.addModel(testing::stories());
    noText.setTextFile(m_dir.filePath(QStringLiteral("missing.txt")));
    QVERIFY(!noText.startRun());
    QVERIFY(noText.lastError().contains(QStringLiteral("evaluation text")));
  }

  // File > Compare Models opens the window with the loaded model first.
  void main_window_opens_it_with_the_loaded_model() {
    const MainWindow::Options o = testing::windowOptions(m_dir.filePath(QStringLiteral("main.sqlite")));
    MainWindow w(o);
    w.show();
    QSignalSpy ready(&w, &MainWindow::modelReady);
    w.loadModel(testing::stories());
    QVERIFY(ready.wait(20000));
    QAction* compare = w.findChild<QAction*>(QStringLiteral("compareAction"));
    QVERIFY(compare);
    compare->trigger();
    QVERIFY(w.compareWindow()->isVisible());
    QCOMPARE(w.compareWindow()->variantCount(), 1);
  }

  // phaselab --compare ... --screenshot --quit: the window runs unattended,
  // prints the rows as JSON and saves its picture.
  void unattended_mode() {
    QProcess p;
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.insert(QStringLiteral("QT_QPA_PLATFORM"), QStringLiteral("offscreen"));
    p.setProcessEnvironment(env);
    const QString png = m_dir.filePath(QStringLiteral("compare.png"));
    p.start(QStringLiteral(PHASELAB_GUI_PATH),
            {QStringLiteral("--db"), m_dir.filePath(QStringLiteral("unattended.sqlite")), QStringLiteral("--compare"),
             testing::stories(), QStringLiteral("--quant"), QStringLiteral("Q4_0"), QStringLiteral("--chunks"),
             QStringLiteral("2"), QStringLiteral("--threads"), QStringLiteral("1"), QStringLiteral("--screenshot"), png,
             QStringLiteral("--quit")});
    QVERIFY(p.waitForFinished(300000));
    QVERIFY2(p.exitCode() == 0, p.readAllStandardError().constData());
    const QJsonArray rows = QJsonDocument::fromJson(p.readAllStandardOutput()).array();
    QCOMPARE(rows.size(), 2);
    QCOMPARE(rows[1].toObject()[QStringLiteral("name")].toString(), QStringLiteral("Q4_0"));
    QVERIFY(QImage(png).width() > 400);
    // A bad type is refused before anything runs.
    QProcess bad;
    bad.setProcessEnvironment(env);
    bad.start(QStringLiteral(PHASELAB_GUI_PATH), {QStringLiteral("--compare"), testing::stories(), QStringLiteral("--quant"),
                                                  QStringLiteral("Q9"), QStringLiteral("--quit")});
    QVERIFY(bad.waitForFinished(60000));
    QCOMPARE(bad.exitCode(), 2);
  }
};

QTEST_MAIN(TestGuiCompare)
#include "test_gui_compare.moc"
