// The metrics dock's charts read well: ticks on 1-2-5 steps with labels
// that show them exactly, integer ticks for counts, turn 1 at x = 1, a
// timeline that stays labelled for many requests, tooltips with exact
// values, the phase meter reachable without scrolling at 1280x800, and a
// speculative line that never claims 0 tokens per target pass.
#include <QBarCategoryAxis>
#include <QBarSet>
#include <QChart>
#include <QChartView>
#include <QFontMetrics>
#include <QHorizontalStackedBarSeries>
#include <QLineSeries>
#include <QMainWindow>
#include <QRandomGenerator>
#include <QScrollArea>
#include <QScrollBar>
#include <QSignalSpy>
#include <QTabWidget>
#include <QTemporaryDir>
#include <QTest>
#include <QToolTip>
#include <QValueAxis>
#include <cmath>

#include "chart_scale.h"
#include "gui_test_util.h"
#include "main_window.h"
#include "metrics_dock.h"
#include "phase_meter.h"

using namespace phaselab::ui;

namespace {

// One request as the engine worker reports it: prefill, decode snapshots
// every ~250 ms, done.
void feedRequest(MetricsDock& dock, int id, double ttftMs, int tokens, double tps) {
  LiveMetrics m;
  m.requestId = id;
  m.phase = Phase::prefill;
  m.nPrompt = 40;
  m.kvCapacity = 512;
  dock.updateMetrics(m);
  m.phase = Phase::decode;
  m.ttftMs = ttftMs;
  m.prefillTps = 40 / (ttftMs / 1000);
  const int stepTokens = std::max(1, static_cast<int>(tps / 4));
  for (int n = stepTokens; n < tokens; n += stepTokens) {
    m.nGenerated = n;
    m.elapsedMs = ttftMs + 1000 * n / tps;
    m.decodeTps = tps;
    m.windowTps = tps * (0.95 + 0.1 * ((n / stepTokens) % 2));
    m.kvUsed = 40 + n;
    dock.updateMetrics(m);
  }
  m.phase = Phase::done;
  m.nGenerated = tokens;
  m.elapsedMs = ttftMs + 1000 * tokens / tps;
  m.decodeTps = tps;
  m.windowTps = tps;
  m.kvUsed = 40 + tokens;
  dock.updateMetrics(m);
}

// 1, 2 or 5 x a power of ten.
bool isNiceStep(double step) {
  if (!(step > 0)) return false;
  const double mantissa = step / std::pow(10.0, std::floor(std::log10(step) + 1e-9));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (std::abs(mantissa - m) < 1e-6) return true;
  return false;
}

// The ticks a fixed-count value axis draws, and the labels it writes.
struct AxisTicks {
  QList<double> values;
  QStringList labels;
};
AxisTicks ticksOf(const QValueAxis* a) {
  AxisTicks t;
  const int n = a->tickCount();
  for (int i = 0; i < n; i++) {
    const double v = a->min() + i * (a->max() - a->min()) / (n - 1);
    t.values << v;
    t.labels << QString::asprintf(a->labelFormat().toUtf8().constData(), v);
  }
  return t;
}

QList<QChartView*> chartViews(MetricsDock& dock) { return dock.findChildren<QChartView*>(); }

QChart* chartWith(MetricsDock& dock, const QString& titleStart) {
  for (QChartView* v : chartViews(dock))
    if (v->chart()->title().startsWith(titleStart)) return v->chart();
  return nullptr;
}

// Every value axis of every chart: a 1-2-5 step, each label the tick's value
// exactly and distinct from its neighbours, integer ticks on the count axes,
// every plotted point inside the range.
void checkAxes(MetricsDock& dock, const char* when) {
  const QList<QChartView*> views = chartViews(dock);
  QCOMPARE(views.size(), 3);
  int axes = 0;
  for (QChartView* view : views) {
    for (QAbstractAxis* abstract : view->chart()->axes()) {
      auto* a = qobject_cast<QValueAxis*>(abstract);
      if (!a) continue;
      axes++;
      const QString where = QStringLiteral("%1: '%2' axis '%3' %4..%5 in %6 ticks")
                                .arg(QLatin1String(when), view->chart()->title(), a->titleText())
                                .arg(a->min())
                                .arg(a->max())
                                .arg(a->tickCount());
      QVERIFY2(a->tickType() == QValueAxis::TicksFixed, qPrintable(where));
      QVERIFY2(a->tickCount() >= 2 && a->tickCount() <= 8, qPrintable(where));
      const double step = (a->max() - a->min()) / (a->tickCount() - 1);
      QVERIFY2(isNiceStep(step), qPrintable(where));
      const AxisTicks t = ticksOf(a);
      for (int i = 0; i < t.values.size(); i++) {
        const double k = t.values[i] / step;
        QVERIFY2(std::abs(k - std::round(k)) < 1e-6, qPrintable(where + QStringLiteral(": tick %1").arg(t.values[i])));
        bool ok = false;
        const double shown = t.labels[i].toDouble(&ok);
        QVERIFY2(ok && std::abs(shown - t.values[i]) <= step * 1e-6,
                 qPrintable(where + QStringLiteral(": tick %1 labelled '%2'").arg(t.values[i]).arg(t.labels[i])));
        if (i > 0) QVERIFY2(t.labels[i] != t.labels[i - 1], qPrintable(where + QStringLiteral(": ") + t.labels.join(u',')));
      }
      const bool counts = a->titleText() == QLatin1String("turn") || a->titleText() == QLatin1String("token");
      if (counts) {
        QVERIFY2(step >= 1, qPrintable(where));
        for (double v : t.values) QVERIFY2(v == std::round(v), qPrintable(where + QStringLiteral(": tick %1").arg(v)));
      }
      for (QAbstractSeries* s : view->chart()->series()) {
        auto* xy = qobject_cast<QXYSeries*>(s);
        if (!xy) continue;
        const bool horizontal = a->alignment() == Qt::AlignBottom;
        for (const QPointF& p : xy->points()) {
          const double v = horizontal ? p.x() : p.y();
          QVERIFY2(v >= a->min() && v <= a->max(), qPrintable(where + QStringLiteral(": point %1").arg(v)));
        }
      }
    }
  }
  QCOMPARE(axes, 5);
}

struct DockWindow {
  QMainWindow window;
  MetricsDock* dock = new MetricsDock(&window);
  explicit DockWindow(QSize size) {
    window.addDockWidget(Qt::RightDockWidgetArea, dock);
    auto* central = new QWidget;
    central->setMinimumSize(400, 300);  // a chat view's worth
    window.setCentralWidget(central);
    window.resize(size);
    window.show();
  }
  void settle() {
    // The charts lay out, then adapt their tick counts to their size.
    for (int i = 0; i < 3; i++) QTest::qWait(20);
  }
};

QScrollArea* pageScroll(MetricsDock& dock, int index) { return qobject_cast<QScrollArea*>(dock.tabs()->widget(index)); }

}  // namespace

class TestGuiCharts : public QObject {
  Q_OBJECT
  QTemporaryDir m_dir;

 private slots:
  void initTestCase() { testing::isolate(m_dir, "test_gui_charts"); }

  void nice_scale_uses_1_2_5_steps() {
    struct Case {
      double lo, hi;
      int maxTicks;
      bool integer;
      double min, max, step;
      int decimals;
    };
    const Case cases[] = {
        {0, 49.5, 6, false, 0, 50, 10, 0},     {0, 52, 6, false, 0, 60, 20, 0},
        {0, 6195, 6, false, 0, 8000, 2000, 0}, {0, 1, 6, false, 0, 1, 0.2, 1},
        {0, 0, 6, false, 0, 1, 0.2, 1},        {0, 0.0037, 6, false, 0, 0.004, 0.001, 3},
        {0, 0.3, 4, false, 0, 0.3, 0.1, 1},    {0, 5, 8, true, 0, 5, 1, 0},
        {0, 0.5, 6, true, 0, 1, 1, 0},         {0, 13, 8, true, 0, 14, 2, 0},
        {-3, 7, 6, false, -5, 10, 5, 0},       {0, 123456 * 1.1, 6, false, 0, 150000, 50000, 0},
    };
    for (const Case& c : cases) {
      const NiceScale s = niceScale(c.lo, c.hi, c.maxTicks, c.integer);
      const QString what = QStringLiteral("[%1, %2] in %3 ticks: %4..%5 step %6")
                               .arg(c.lo)
                               .arg(c.hi)
                               .arg(c.maxTicks)
                               .arg(s.min)
                               .arg(s.max)
                               .arg(s.step);
      QVERIFY2(s.min == c.min && s.max == c.max && s.step == c.step && s.decimals == c.decimals, qPrintable(what));
      QCOMPARE(s.ticks, static_cast<int>(std::lround((c.max - c.min) / c.step)) + 1);
    }
    QCOMPARE(tickValues(niceScale(0, 0.3, 4)), (QList<double>{0, 0.1, 0.2, 0.3}));
    QCOMPARE(labelFormat(niceScale(0, 0.3, 4)), QStringLiteral("%.1f"));
    QCOMPARE(labelFormat(niceScale(0, 5, 8, true)), QStringLiteral("%.0f"));
    // Any range: the smallest 1-2-5 step that fits, covering [lo, hi].
    QRandomGenerator rng(7);
    for (int i = 0; i < 2000; i++) {
      const double scale = std::pow(10.0, rng.bounded(12) - 6);
      const double lo = rng.bounded(1.0) < 0.5 ? 0 : (rng.bounded(2.0) - 1) * scale;
      const double hi = lo + rng.bounded(1.0) * scale;
      const int maxTicks = 3 + rng.bounded(6);
      const NiceScale s = niceScale(lo, hi, maxTicks);
      const QString what = QStringLiteral("[%1, %2] in %3").arg(lo).arg(hi).arg(maxTicks);
      QVERIFY2(isNiceStep(s.step), qPrintable(what));
      QVERIFY2(s.ticks >= 2 && s.ticks <= maxTicks, qPrintable(what));
      QVERIFY2(s.min <= lo && s.max >= hi, qPrintable(what));
      QVERIFY2(s.ticks == 2 || s.max - s.min < 2 * (hi - lo) + 2 * s.step, qPrintable(what));
      const QList<double> ticks = tickValues(s);
      QStringList labels;
      for (double t : ticks) labels << QString::asprintf(labelFormat(s).toUtf8().constData(), t);
      QCOMPARE(QSet<QString>(labels.begin(), labels.end()).size(), labels.size());
    }
  }

  // Empty, one turn, three, twelve requests, then huge and tiny values: every
  // tick of every axis is a nice number, labelled as itself.
  void every_axis_ticks_on_nice_numbers() {
    for (QSize size : {QSize(1280, 800), QSize(800, 600)}) {
      DockWindow w(size);
      MetricsDock& dock = *w.dock;
      w.settle();
      checkAxes(dock, "empty");
      if (QTest::currentTestFailed()) return;
      QCOMPARE(dock.placeholders().size(), 3);
      QVERIFY(dock.placeholders().contains(QStringLiteral("No answers yet")));
      feedRequest(dock, 1, 180, 120, 45);
      w.settle();
      checkAxes(dock, "1 turn");
      if (QTest::currentTestFailed()) return;
      QVERIFY(dock.placeholders().isEmpty());
      feedRequest(dock, 2, 5632, 300, 31);
      feedRequest(dock, 3, 240, 60, 44);
      w.settle();
      checkAxes(dock, "3 turns");
      if (QTest::currentTestFailed()) return;
      for (int i = 4; i <= 12; i++) feedRequest(dock, i, 100 + 37 * i, 20 + 9 * i, 40);
      w.settle();
      checkAxes(dock, "12 requests");
      if (QTest::currentTestFailed()) return;
      feedRequest(dock, 13, 123456, 5000, 1234.5);
      w.settle();
      checkAxes(dock, "large");
      if (QTest::currentTestFailed()) return;
      for (int i = 14; i <= 30; i++) feedRequest(dock, i, 0.37, 3, 0.03);
      w.settle();
      checkAxes(dock, "tiny");
      if (QTest::currentTestFailed()) return;
    }
  }

  void turn_one_is_plotted_at_one() {
    DockWindow w({1280, 800});
    feedRequest(*w.dock, 1, 180, 40, 45);
    w.settle();
    QCOMPARE(w.dock->ttftPoints(), (QList<QPointF>{{1, 180}}));
    auto* x = qobject_cast<QValueAxis*>(chartWith(*w.dock, QStringLiteral("Time to first"))->axes(Qt::Horizontal).first());
    const AxisTicks t = ticksOf(x);
    QVERIFY2(t.values.contains(1.0) && t.labels.contains(QStringLiteral("1")), qPrintable(t.labels.join(u' ')));
    feedRequest(*w.dock, 2, 200, 40, 45);
    feedRequest(*w.dock, 3, 220, 40, 45);
    QCOMPARE(w.dock->ttftPoints(), (QList<QPointF>{{1, 180}, {2, 200}, {3, 220}}));
    QCOMPARE(ticksOf(x).labels, (QStringList{"0", "1", "2", "3", "4", "5"}));
  }

  // A request stopped before its first token has no TTFT: no marker at 0 ms,
  // and a repeated "done" adds no second point.
  void no_ttft_marker_without_a_first_token() {
    DockWindow w({1280, 800});
    feedRequest(*w.dock, 1, 180, 40, 45);
    LiveMetrics cancelled;
    cancelled.requestId = 2;
    cancelled.phase = Phase::prefill;
    w.dock->updateMetrics(cancelled);
    cancelled.phase = Phase::done;
    w.dock->updateMetrics(cancelled);
    QCOMPARE(w.dock->ttftPointCount(), 1);
    LiveMetrics again;
    again.requestId = 3;
    again.phase = Phase::done;
    again.ttftMs = 90;
    again.nGenerated = 5;
    again.elapsedMs = 200;
    again.decodeTps = 25;
    w.dock->updateMetrics(again);
    w.dock->updateMetrics(again);
    QCOMPARE(w.dock->ttftPoints(), (QList<QPointF>{{1, 180}, {3, 90}}));
    QCOMPARE(w.dock->decodePointCount(), 1);
  }

  // The last kTimelineRequests requests, newest on top, labelled "#n" in
  // rows at least as tall as the label, at 1280x800 and at 800x600.
  void timeline_keeps_the_last_rows_labelled() {
    for (QSize size : {QSize(1280, 800), QSize(800, 600)}) {
      DockWindow w(size);
      for (int i = 1; i <= 12; i++) feedRequest(*w.dock, i, 100 + 10 * i, 30, 40);
      w.settle();
      QCOMPARE(w.dock->timelineCount(), MetricsDock::kTimelineRequests);
      QCOMPARE(w.dock->timelineLabels(), (QStringList{"#5", "#6", "#7", "#8", "#9", "#10", "#11", "#12"}));
      QChart* chart = chartWith(*w.dock, QStringLiteral("Request timeline"));
      auto* rows = qobject_cast<QBarCategoryAxis*>(chart->axes(Qt::Vertical).first());
      QVERIFY(!rows->labelsTruncated());
      const double rowHeight = chart->plotArea().height() / MetricsDock::kTimelineRequests;
      const int labelHeight = QFontMetrics(rows->labelsFont()).height();
      QVERIFY2(rowHeight >= labelHeight, qPrintable(QStringLiteral("%1 px rows for %2 px labels at %3x%4")
                                                        .arg(rowHeight)
                                                        .arg(labelHeight)
                                                        .arg(size.width())
                                                        .arg(size.height())));
      auto* series = qobject_cast<QHorizontalStackedBarSeries*>(chart->series().first());
      QCOMPARE(series->barSets().first()->count(), MetricsDock::kTimelineRequests);
    }
  }

  void tooltips_show_exact_values() {
    DockWindow w({1280, 800});
    feedRequest(*w.dock, 1, 180.25, 40, 45);
    feedRequest(*w.dock, 2, 212.5, 30, 40);
    QChart* timeline = chartWith(*w.dock, QStringLiteral("Request timeline"));
    auto* bars = qobject_cast<QHorizontalStackedBarSeries*>(timeline->series().first());
    emit bars->hovered(true, MetricsDock::kTimelineRequests - 2, bars->barSets().first());
    QVERIFY2(QToolTip::text().contains(QStringLiteral("#1: prefill 180.3 ms + decode 888.9 ms")), qPrintable(QToolTip::text()));
    emit bars->hovered(true, 0, bars->barSets().first());  // a blank slot
    QTRY_VERIFY(QToolTip::text().isEmpty());
    auto* ttft = qobject_cast<QLineSeries*>(chartWith(*w.dock, QStringLiteral("Time to first"))->series().first());
    emit ttft->hovered(QPointF(1.8, 205), true);
    QVERIFY2(QToolTip::text().contains(QStringLiteral("Turn 2: first token after 212.5 ms")), qPrintable(QToolTip::text()));
    auto* decode = qobject_cast<QLineSeries*>(chartWith(*w.dock, QStringLiteral("Decode"))->series().first());
    emit decode->hovered(QPointF(29.5, 40), true);
    QVERIFY2(QToolTip::text().contains(QStringLiteral("Token 30: 40.0 tokens/s")), qPrintable(QToolTip::text()));
  }

  // In the real window at 1280x800 neither tab scrolls, and the phase meter
  // is in full view once its tab is up; at 800x600 the dock may be narrow
  // and the phase meter still shows whole.
  void phase_meter_fits_without_scrolling() {
    QTemporaryDir db;
    const MainWindow::Options o = testing::windowOptions(db.filePath(QStringLiteral("w.sqlite")));
    for (QSize size : {QSize(1280, 800), QSize(800, 600)}) {
      MainWindow w(o);
      w.resize(size);
      w.show();
      QVERIFY(QTest::qWaitForWindowExposed(&w));
      MetricsDock* dock = w.metricsDock();
      for (int i = 1; i <= 3; i++) feedRequest(*dock, i, 150, 40, 45);
      QVERIFY(dock->minimumWidth() <= 260);
      dock->showPhaseMeter();
      QTest::qWait(50);
      const QString where = QStringLiteral("%1x%2, dock %3x%4")
                                .arg(size.width())
                                .arg(size.height())
                                .arg(dock->width())
                                .arg(dock->height());
      if (!dock->isVisible()) continue;  // a narrow layout may tab it behind the list
      PhaseMeter* meter = dock->phaseMeter();
      QVERIFY2(meter->isVisible(), qPrintable(where));
      QVERIFY2(meter->visibleRegion().boundingRect() == meter->rect(),
               qPrintable(where + QStringLiteral(": phase meter shows %1 px of %2")
                                      .arg(meter->visibleRegion().boundingRect().height())
                                      .arg(meter->height())));
      QCOMPARE(pageScroll(*dock, 1)->verticalScrollBar()->maximum(), 0);
      if (size.height() >= 800) {
        dock->tabs()->setCurrentIndex(0);
        QTest::qWait(50);
        QVERIFY2(pageScroll(*dock, 0)->verticalScrollBar()->maximum() == 0, qPrintable(where));
      }
    }
  }

  void speculative_text_never_shows_zero_tokens_per_pass() {
    DockWindow w({1280, 800});
    LiveMetrics m;
    m.requestId = 1;
    m.phase = Phase::decode;
    m.speculative = QStringLiteral("lookup");
    m.nGenerated = 10;
    m.ttftMs = 20;
    m.elapsedMs = 300;
    m.windowTps = 30;
    w.dock->updateMetrics(m);  // a lookup that found nothing to draft
    QVERIFY2(!w.dock->specText().contains(QStringLiteral("0.00")), qPrintable(w.dock->specText()));
    QVERIFY2(w.dock->specText().contains(QStringLiteral("no drafts yet")) &&
                 w.dock->specText().contains(QStringLiteral("1.00 token per target pass")),
             qPrintable(w.dock->specText()));
    m.specDrafted = 8;
    m.specAccepted = 3;
    m.specAcceptance = 3.0 / 8;  // the engine's RequestMetrics::spec_acceptance
    w.dock->updateMetrics(m);  // drafts counted, passes not in yet
    QVERIFY2(!w.dock->specText().contains(QStringLiteral("0.00")), qPrintable(w.dock->specText()));
    QVERIFY2(w.dock->specText().contains(QStringLiteral("8 drafted, 3 accepted (38%)")), qPrintable(w.dock->specText()));
    m.phase = Phase::done;
    m.tokensPerPass = 1.6;
    w.dock->updateMetrics(m);
    QVERIFY2(w.dock->specText().contains(QStringLiteral("1.60 tokens per target pass")), qPrintable(w.dock->specText()));
  }

  void remeasure_is_forwarded() {
    MetricsDock dock;
    QSignalSpy spy(&dock, &MetricsDock::remeasureRequested);
    emit dock.phaseMeter()->remeasureRequested();
    QCOMPARE(spy.size(), 1);
  }

  // PHASELAB_SCREENSHOTS=dir: the dock at 1280x800 and 800x600 after a few
  // requests, to look at.
  void screenshots() {
    const QString dir = qEnvironmentVariable("PHASELAB_SCREENSHOTS");
    if (dir.isEmpty()) QSKIP("set PHASELAB_SCREENSHOTS=dir to write them");
    DockWindow w({1280, 800});
    w.settle();
    w.window.grab().save(dir + QStringLiteral("/charts-0-empty.png"));
    feedRequest(*w.dock, 1, 180, 120, 45);
    w.settle();
    w.window.grab().save(dir + QStringLiteral("/charts-1-one.png"));
    feedRequest(*w.dock, 2, 5632, 300, 31);
    feedRequest(*w.dock, 3, 240, 60, 44);
    w.settle();
    w.window.grab().save(dir + QStringLiteral("/charts-2-three.png"));
    for (int i = 4; i <= 12; i++) feedRequest(*w.dock, i, 100 + 37 * i, 20 + 9 * i, 40);
    w.settle();
    w.window.grab().save(dir + QStringLiteral("/charts-3-twelve.png"));
    HardwarePeaks peaks;
    peaks.memoryBandwidth = 20e9;
    peaks.peakFlops = 100e9;
    w.dock->setPeaks(peaks);
    LiveMetrics spec;
    spec.requestId = 13;
    spec.phase = Phase::done;
    spec.speculative = QStringLiteral("lookup");
    w.dock->updateMetrics(spec);
    w.dock->showPhaseMeter();
    w.settle();
    w.window.grab().save(dir + QStringLiteral("/charts-4-meter.png"));
    w.window.resize(800, 600);
    w.settle();
    w.window.grab().save(dir + QStringLiteral("/charts-5-small-meter.png"));
    w.dock->tabs()->setCurrentIndex(0);
    w.settle();
    w.window.grab().save(dir + QStringLiteral("/charts-6-small-charts.png"));
  }
};

QTEST_MAIN(TestGuiCharts)
#include "test_gui_charts.moc"
