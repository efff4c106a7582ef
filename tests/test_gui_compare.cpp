// The Compare window (offscreen) with stories260K and a quantization of it:
// a run in a phaselab-cli child process while the event loop keeps running
// (the variant's peak memory its own, not this process's), rows filling the
// table as each variant finishes with mean ± sd, the charts (prefill and
// decode on their own axes, the KL 0 point inside the plot), the layout at
// 800x600, the run saved and reopened with its inputs, CSV and JSON export,
// Cancel, and the refusals before anything runs; the main window's Compare
// action.
#include <QAction>
#include <QChart>
#include <QComboBox>
#include <QChartView>
#include <QCheckBox>
#include <QLegendMarker>
#include <QFile>
#include <QImage>
#include <QProcess>
#include <QPushButton>
#include <QMenu>
#include <QJsonArray>
#include <QJsonDocument>
#include <QScrollArea>
#include <QScrollBar>
#include <QSignalSpy>
#include <QTableWidget>
#include <QValueAxis>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstring>
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
  static constexpr size_t kBallastMiB = 384;
  QTemporaryDir m_dir;
  ConversationStore m_store;

  void small(CompareWindow& w) {
    w.setTextFile(QString::fromStdString(bundled_text_path("eval-en.txt")));
    w.setChunks(2);
    w.setThreads(1);
    w.setSpeedTests(32, 16, 2);
    w.setCliPath(QStringLiteral(PHASELAB_CLI_PATH));
  }

  // The value axis of the chart titled title (among the window's charts).
  static QValueAxis* valueAxis(CompareWindow& w, const QString& title, Qt::Orientation o) {
    for (QChartView* v : w.chartViews())
      if (v->chart()->title() == title)
        for (QAbstractAxis* a : v->chart()->axes(o))
          if (auto* va = qobject_cast<QValueAxis*>(a)) return va;
    return nullptr;
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
    // Rows that reach the table while the run goes on (not all at its end).
    int rowsWhileRunning = 0;
    connect(w.resultsTable()->model(), &QAbstractItemModel::rowsInserted, [&] { rowsWhileRunning += w.isRunning(); });
    // This process's high-water mark goes far above what stories260K needs:
    // a variant measured here would report it as its peak.
    std::vector<char> ballast(kBallastMiB << 20);
    std::memset(ballast.data(), 1, ballast.size());
    QVERIFY(w.startRun());
    QVERIFY(w.isRunning());
    QVERIFY(!w.startRun());  // one run at a time
    QVERIFY(done.wait(180000));
    QVERIFY2(done.first().at(0).toBool(), qPrintable(done.first().at(1).toString()));
    QVERIFY(ballast[ballast.size() / 2] == 1);  // held through the run
    QVERIFY2(ticks > 3, "the event loop stopped while the comparison ran");
    QCOMPARE(w.rows().size(), size_t(2));
    QCOMPARE(w.rows()[0].kld, 0.0);
    QVERIFY(w.rows()[1].kld > 0);
    QCOMPARE(w.resultsTable()->rowCount(), 2);
    QVERIFY(w.resultsTable()->item(0, 0)->text().contains(QStringLiteral("reference")));
    for (QChartView* v : w.chartViews()) QVERIFY2(!v->chart()->series().isEmpty(), qPrintable(v->chart()->title()));

    // Measured by phaselab-cli in a process of its own: each peak is that
    // process's, far below this one's.
    QVERIFY(w.childProcessId() > 0 && w.childProcessId() != QCoreApplication::applicationPid());
    QVERIFY(w.childArguments().startsWith(QStringLiteral("compare")));
    QVERIFY(w.childArguments().contains(QStringLiteral("--json")));
    for (const CompareRow& r : w.rows()) qInfo("%s: peak RSS %.0f MiB (child)", r.name.c_str(), r.peak_rss_mib);
    for (const CompareRow& r : w.rows())
      QVERIFY2(r.peak_rss_mib > 0 && r.peak_rss_mib < kBallastMiB / 2,
               qPrintable(QStringLiteral("%1: peak %2 MiB").arg(QString::fromStdString(r.name)).arg(r.peak_rss_mib)));
    // Each speed with its spread, in the table as "mean ± sd".
    for (const CompareRow& r : w.rows()) {
      QCOMPARE(r.repetitions, 2);
      for (double sd : {r.pp_sd, r.tg_sd, r.ttft_sd_ms}) QVERIFY(std::isfinite(sd) && sd >= 0);
    }
    for (int c : {3, 4, 5}) {
      const QString cell = w.resultsTable()->item(1, c)->text();
      QVERIFY2(cell.contains(QStringLiteral(" ± ")), qPrintable(cell));
      QCOMPARE(cell.section(QStringLiteral(" ± "), 0, 0).toDouble(),
               QString::number(c == 3 ? w.rows()[1].pp : c == 4 ? w.rows()[1].tg : w.rows()[1].ttft_ms, 'f', 1).toDouble());
    }
    QVERIFY2(rowsWhileRunning >= 1, "the table filled only when the run had ended");

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
    // ... with its inputs, so that Run repeats it: the same child command.
    QCOMPARE(reopened.variantCount(), 2);
    QCOMPARE(reopened.chunks(), 2);
    QCOMPARE(reopened.threads(), 1);
    QCOMPARE(reopened.repetitions(), 2);
    QCOMPARE(reopened.textFile(), w.textFile());
    QVERIFY(reopened.variants()[1].quantize_to == FileType::Q8_0);
    reopened.setCliPath(QStringLiteral(PHASELAB_CLI_PATH));
    QSignalSpy again(&reopened, &CompareWindow::runFinished);
    QVERIFY(reopened.startRun());
    QCOMPARE(reopened.childArguments(), w.childArguments());
    reopened.cancelRun();
    QVERIFY(again.wait(60000));

    // Export.
    const QString csv = m_dir.filePath(QStringLiteral("c.csv")), json = m_dir.filePath(QStringLiteral("c.json"));
    QVERIFY(w.exportCsv(csv));
    QVERIFY(w.exportJson(json));
    QFile c(csv);
    QVERIFY(c.open(QIODevice::ReadOnly));
    const QList<QByteArray> lines = c.readAll().trimmed().split('\n');
    QCOMPARE(lines.size(), 3);
    QVERIFY(lines[0].startsWith("name,file,"));
    QVERIFY(lines[0].contains(",tg128_sd,"));
    QFile j(json);
    QVERIFY(j.open(QIODevice::ReadOnly));
    QCOMPARE(QJsonDocument::fromJson(j.readAll()).array().size(), 2);
    CompareWindow empty(&m_store);
    QVERIFY(!empty.exportCsv(csv));  // nothing to export yet
  }

  // Pruned variants (a measured drop and a given one) and self-speculation
  // beside the reference: made by the child `compare`, shown by their
  // source, kept through the variants' JSON.
  void pruned_and_self_speculative_rows() {
    CompareWindow w(&m_store);
    w.show();
    QVERIFY(!w.addPruned(QStringLiteral("layers:n1")));  // no model yet
    w.addModel(testing::stories());
    QVERIFY(w.addPruned(QStringLiteral("layers:n1")));
    QVERIFY(w.addPruned(QStringLiteral("layers:2")));
    QVERIFY(!w.addPruned(QStringLiteral("layers:9-2")));
    w.addModel(testing::stories());
    auto* spec = qobject_cast<QComboBox*>(w.variantsTable()->cellWidget(3, 4));
    QVERIFY(spec);
    spec->setCurrentIndex(spec->findData(QStringLiteral("self")));
    QCOMPARE(w.variantCount(), 4);
    QCOMPARE(w.variantsTable()->item(2, 1)->text(), QStringLiteral("pruned 2"));
    QCOMPARE(w.variants()[1].prune, std::string("layers:n1"));
    QCOMPARE(w.variants()[3].speculative, std::string("self"));
    // The two drops are also measured as the first's drafts.
    for (int r : {1, 2}) {
      auto* draft = qobject_cast<QCheckBox*>(w.variantsTable()->cellWidget(r, 5));
      QVERIFY(draft && !draft->isChecked());
      draft->setChecked(true);
    }
    QVERIFY(w.variants()[1].draft && w.variants()[2].draft && !w.variants()[3].draft);
    small(w);
    QSignalSpy done(&w, &CompareWindow::runFinished);
    QVERIFY(w.startRun());
    QVERIFY(w.childArguments().join(QLatin1Char(' ')).contains(QStringLiteral("\"prune\":\"layers:n1\"")));
    QVERIFY(w.childArguments().join(QLatin1Char(' ')).contains(QStringLiteral("\"draft\":true")));
    QVERIFY(done.wait(180000));
    QVERIFY2(done.first().at(0).toBool(), qPrintable(done.first().at(1).toString()));
    const auto& rows = w.rows();
    QCOMPARE(rows.size(), size_t(4));
    // The measured drop names the layer it chose; both drops change the model.
    QVERIFY2(rows[1].prune.rfind("layers:", 0) == 0 && rows[1].prune.rfind("layers:n", 0) != 0, rows[1].prune.c_str());
    QCOMPARE(rows[2].prune, std::string("layers:2"));
    for (int i : {1, 2}) {
      QVERIFY(rows[i].kld > 0);
      QVERIFY(rows[i].size_mib < rows[0].size_mib);
    }
    // Self-speculation decodes the same model: no divergence.
    QCOMPARE(rows[3].speculative, std::string("self"));
    QCOMPARE(rows[3].kld, 0.0);
    QVERIFY(rows[3].tg > 0);
    QVERIFY(rows[3].tokens_per_pass >= 1);  // its own speculation's figures
    // The drafts: measured, shown in the table and on the acceptance chart
    // (a circle and a square per other row, a star per draft; one legend
    // entry per row).
    QVERIFY(rows[1].draft && rows[2].draft && !rows[3].draft);
    for (int i : {1, 2}) {
      QVERIFY(rows[i].draft_tg > 0 && rows[i].draft_base_tg > 0 && rows[i].draft_tokens_per_pass >= 1);
      QVERIFY(w.resultsTable()->item(i, 12)->text().contains(QStringLiteral("×")));
      QVERIFY(w.resultsTable()->item(i, 12)->toolTip().contains(QStringLiteral("plainly")));
    }
    QCOMPARE(w.resultsTable()->item(0, 12)->text(), QStringLiteral("target"));
    QCOMPARE(w.resultsTable()->item(3, 12)->text(), QStringLiteral("—"));
    QVERIFY(w.resultsTable()->item(1, 11)->text().endsWith(QLatin1Char('%')));
    QChart* acc = w.acceptanceChart();
    QCOMPARE(acc->series().size(), 3 + 3 + 2);
    int tab = -1;
    for (int t = 0; t < w.resultTabs()->count(); t++)
      if (w.resultTabs()->tabText(t) == QStringLiteral("Drafts")) tab = t;
    QVERIFY(tab >= 0);
    w.resultTabs()->setCurrentIndex(tab);
    QCoreApplication::processEvents();
    int visibleMarkers = 0;
    for (QLegendMarker* m : acc->legend()->markers()) visibleMarkers += m->isVisible();
    QCOMPARE(visibleMarkers, 3);
    // An FFN width cut from the Add Pruned menu: named by what it keeps.
    QAction* ffn = nullptr;
    for (QAction* a : w.findChild<QPushButton*>(QStringLiteral("addPruned"))->menu()->actions())
      if (a->text().contains(QStringLiteral("75%"))) ffn = a;
    QVERIFY(ffn);
    ffn->trigger();
    QCOMPARE(w.variantCount(), 5);
    QCOMPARE(w.variantsTable()->item(4, 1)->text(), QStringLiteral("FFN 75%"));
    QCOMPARE(w.variants()[4].prune, std::string("ffn:75%"));
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
    // The child is gone, not measuring on for no one.
    QVERIFY(w.childProcessId() > 0);
    QVERIFY(::kill(static_cast<pid_t>(w.childProcessId()), 0) == -1 && errno == ESRCH);
  }

  // No phaselab-cli to run: a clear error, nothing measured in this process.
  void missing_cli_is_named() {
    CompareWindow w(&m_store);
    w.addModel(testing::stories());
    small(w);
    w.setCliPath(m_dir.filePath(QStringLiteral("no-such-phaselab-cli")));
    QVERIFY(!w.startRun());
    QVERIFY2(w.lastError().contains(QStringLiteral("no-such-phaselab-cli")), qPrintable(w.lastError()));
    QVERIFY(!w.isRunning());
  }

  // Prefill and decode each on an axis of their own, the scatter's axes
  // reaching past the reference's KL 0 so its point is drawn whole (rows of
  // a saved run: no measuring needed).
  void charts_scale_each_figure() {
    CompareRow ref, q4;
    ref.name = "F16", q4.name = "Q4_0";
    ref.reference = true;
    ref.pp = 2400, ref.tg = 38, ref.peak_rss_mib = 800;
    q4.pp = 1900, q4.tg = 61, q4.kld = 0.031, q4.peak_rss_mib = 300;
    const qint64 id = m_store.saveCompareRun(QStringLiteral("synthetic"), QByteArray("{}"),
                                             QByteArray::fromStdString(compare_rows_json({ref, q4})));
    QVERIFY(id > 0);
    CompareWindow w(&m_store);
    QVERIFY(w.openSavedRun(id));
    QValueAxis* decode = valueAxis(w, QStringLiteral("Decode tokens/s"), Qt::Vertical);
    QValueAxis* prefill = valueAxis(w, QStringLiteral("Prefill tokens/s"), Qt::Vertical);
    QVERIFY2(decode && prefill, "no separate prefill and decode charts");
    QVERIFY(decode->max() >= 61 && decode->max() < 2 * 61);  // decode's bars fill their chart
    QVERIFY(prefill->max() >= 2400 && prefill->max() < 2 * 2400);
    const QString scatter = QStringLiteral("Decode speed against KL divergence (point size: peak memory)");
    QValueAxis* kl = valueAxis(w, scatter, Qt::Horizontal);
    QValueAxis* speed = valueAxis(w, scatter, Qt::Vertical);
    QVERIFY(kl && speed);
    QVERIFY2(kl->min() < 0 && -kl->min() >= 0.05 * (kl->max() - kl->min()), "the KL 0 point sits on the plot's edge");
    QVERIFY(kl->max() > 0.031);
    QVERIFY(speed->max() > 61 && speed->min() < 38);
  }

  // At 800x600 (less a title bar) the Models page shows everything without
  // scrolling: table, buttons, form, Run, and the charts with their legends.
  void fits_800x600() {
    CompareWindow w(&m_store);
    w.addModel(testing::stories());
    // It opens no larger than the screen (offscreen: 800x600) ...
    const QSize screen = w.screen()->availableGeometry().size();
    QVERIFY2(w.width() <= screen.width() && w.height() <= screen.height(),
             qPrintable(QStringLiteral("%1x%2 on %3x%4").arg(w.width()).arg(w.height()).arg(screen.width()).arg(screen.height())));
    // ... and can be smaller still.
    const QSize min = w.minimumSizeHint();
    qInfo("minimum size %dx%d", min.width(), min.height());
    QVERIFY2(min.width() <= 800 && min.height() <= 560,
             qPrintable(QStringLiteral("minimum %1x%2").arg(min.width()).arg(min.height())));
    w.resize(800, 560);
    w.show();
    QVERIFY(QTest::qWaitForWindowExposed(&w));
    auto* scroll = w.findChild<QScrollArea*>();
    QVERIFY(scroll);
    QCOMPARE(scroll->verticalScrollBar()->maximum(), 0);
    QCOMPARE(scroll->horizontalScrollBar()->maximum(), 0);
    for (QChartView* v : w.chartViews()) QVERIFY(v->minimumHeight() <= 160);
    // Five variants: the table scrolls past three rows, leaving the charts
    // the height they need (offscreen is an 800x600 screen).
    CompareWindow five(&m_store);
    for (int i = 0; i < 5; i++) five.addModel(testing::stories());
    five.resize(800, 560);
    five.show();
    QVERIFY(QTest::qWaitForWindowExposed(&five));
    QVERIFY(five.variantsTable()->height() < 5 * five.variantsTable()->rowHeight(0));
    const int chart = five.resultTabs()->currentWidget()->height();
    QVERIFY2(chart >= 200, qPrintable(QString::number(chart)));
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
