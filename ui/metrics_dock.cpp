#include "metrics_dock.h"

#include <QApplication>
#include <QGraphicsSimpleTextItem>

#include "appearance.h"

#include <QBarCategoryAxis>
#include <QBarSet>
#include <QChart>
#include <QChartView>
#include <QCursor>
#include <QGraphicsLayout>
#include <QGraphicsSimpleTextItem>
#include <QGroupBox>
#include <QHorizontalStackedBarSeries>
#include <QLabel>
#include <QLineSeries>
#include <QProgressBar>
#include <QScrollArea>
#include <QTabWidget>
#include <QTimer>
#include <QToolTip>
#include <QVBoxLayout>
#include <QValueAxis>
#include <algorithm>
#include <cmath>

#include "chart_scale.h"
#include "phase_meter.h"
#include "phaselab/metrics.h"

namespace phaselab::ui {

namespace {

// Ticks that fit the chart's size, so that Qt never hides every other
// label for lack of room: a left axis needs ~22 px per label, a bottom axis
// ~40 px ("12000") or ~22 px for the turns' one or two digits. Measured on
// the chart's width and the plot area's height, neither of which depends
// on the labels, so a rescale cannot feed back into the next one.
int tickBudget(double pixels, double perTick, int most) {
  if (pixels <= 0) return most;  // not laid out yet
  return std::clamp(static_cast<int>(pixels / perTick) + 1, 3, most);
}

QChartView* makeChartView(QChart* chart, int minimumHeight) {
  chart->legend()->hide();
  chart->setMargins(QMargins(2, 2, 2, 2));
  chart->setBackgroundRoundness(0);
  chart->layout()->setContentsMargins(0, 0, 0, 0);  // fill the view
  // Follow the window's palette so the charts are readable in dark mode too.
  const QPalette pal;
  chart->setBackgroundBrush(pal.color(QPalette::Base));
  chart->setTitleBrush(pal.color(QPalette::Text));
  QFont title = chart->titleFont();
  title.setBold(true);
  chart->setTitleFont(title);
  auto* view = new QChartView(chart);
  view->setAccessibleName(chart->title());
  view->setRenderHint(QPainter::Antialiasing);
  view->setMinimumHeight(minimumHeight);
  return view;
}

void styleAxis(QAbstractAxis* axis) {
  const QPalette pal;
  axis->setLabelsBrush(pal.color(QPalette::Text));
  axis->setTitleBrush(pal.color(QPalette::Text));
  QFont f = axis->labelsFont();
  f.setPointSizeF(std::max(6.0, f.pointSizeF() * 0.8));
  axis->setLabelsFont(f);
  axis->setTitleFont(f);
}

// Colours and fonts again from the application's palette and font: after a
// theme or text-size change (View menu) the charts follow the window.
void restyleChart(QChart* chart) {
  const QPalette pal = QApplication::palette();
  chart->setBackgroundBrush(pal.color(QPalette::Base));
  chart->setTitleBrush(pal.color(QPalette::Text));
  QFont title = QApplication::font();
  title.setBold(true);
  chart->setTitleFont(title);
  chart->legend()->setLabelColor(pal.color(QPalette::Text));
  QFont small = QApplication::font();
  small.setPointSizeF(std::max(6.0, small.pointSizeF() * 0.8));
  chart->legend()->setFont(small);
  for (QAbstractAxis* axis : chart->axes()) {
    axis->setLabelsBrush(pal.color(QPalette::Text));
    axis->setTitleBrush(pal.color(QPalette::Text));
    axis->setLabelsFont(small);
    axis->setTitleFont(small);
    axis->setGridLineColor(pal.color(QPalette::Mid));
  }
  for (QGraphicsItem* item : chart->childItems())
    if (auto* text = dynamic_cast<QGraphicsSimpleTextItem*>(item)) text->setBrush(pal.color(QPalette::PlaceholderText));
}

// A grey "No answers yet" in the middle of the plot area while a chart is
// empty, so that an empty chart reads as empty and not as zero.
QGraphicsSimpleTextItem* addPlaceholder(QChart* chart, const QString& text) {
  auto* item = new QGraphicsSimpleTextItem(text, chart);
  item->setBrush(QPalette().color(QPalette::PlaceholderText));
  item->setZValue(10);
  auto center = [chart, item] { item->setPos(chart->plotArea().center() - item->boundingRect().center()); };
  QObject::connect(chart, &QChart::plotAreaChanged, chart, center);
  center();
  return item;
}

// The dock's content: 340 px wide where the window has room (charts need
// it), while the dock's minimum stays small for an 800x600 window.
class DockContent : public QWidget {
 public:
  QSize sizeHint() const override { return QWidget::sizeHint().expandedTo(QSize(340, 0)); }
};

QGroupBox* group(const QString& title, QWidget* content) {
  auto* box = new QGroupBox(title);
  auto* l = new QVBoxLayout(box);
  l->setContentsMargins(4, 4, 4, 4);
  l->addWidget(content);
  return box;
}

// A tab's page: scrolls only where the window is smaller than 1280x800.
QScrollArea* scrollPage(QWidget* content) {
  auto* scroll = new QScrollArea;
  scroll->setAccessibleName(QObject::tr("Metrics"));
  scroll->setWidgetResizable(true);
  scroll->setFrameShape(QFrame::NoFrame);
  scroll->setHorizontalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
  scroll->setWidget(content);
  return scroll;
}

}  // namespace

MetricsDock::MetricsDock(QWidget* parent) : QDockWidget(tr("Metrics"), parent) {
  setObjectName(QStringLiteral("metricsDock"));
  auto* content = new DockContent;
  auto* layout = new QVBoxLayout(content);
  layout->setContentsMargins(4, 4, 4, 4);
  m_header = new QLabel(tr("No model loaded"));
  m_header->setWordWrap(true);
  layout->addWidget(m_header);
  m_remoteNote = new QLabel(PhaseMeter::remoteNote());
  m_remoteNote->setObjectName(QStringLiteral("remoteNote"));
  m_remoteNote->setWordWrap(true);
  m_remoteNote->setToolTip(tr("Time to first token and tokens/s are measured here as the text arrives, network "
                              "included; the server's prefill time, KV cache and device use are not visible."));
  m_remoteNote->hide();
  layout->addWidget(m_remoteNote);

  QWidget* charts = buildCharts();
  buildMeterPage();
  m_tabs = new QTabWidget;
  m_tabs->setObjectName(QStringLiteral("metricsTabs"));
  m_tabs->setDocumentMode(true);
  m_tabs->addTab(scrollPage(charts), tr("Charts"));
  m_tabs->addTab(scrollPage(m_meterPage), tr("Phase meter && KV"));
  layout->addWidget(m_tabs, 1);

  connect(m_phaseMeter, &PhaseMeter::remeasureRequested, this, &MetricsDock::remeasureRequested);

  setWidget(content);
  // Fits beside the chat in an 800x600 window.
  setMinimumWidth(240);
  rescale();
}

// The Charts tab: decode tokens/s, time to first token, the request timeline.
QWidget* MetricsDock::buildCharts() {
  QChartView* decodeView = buildDecodeChart();
  QChartView* ttftView = buildTtftChart();
  QChartView* timelineView = buildTimelineChart();
  connectCharts();

  auto* charts = new QWidget;
  auto* chartCol = new QVBoxLayout(charts);
  chartCol->setContentsMargins(0, 0, 0, 0);
  chartCol->addWidget(decodeView, 2);
  chartCol->addWidget(ttftView, 2);
  chartCol->addWidget(timelineView, 3);
  return charts;
}

// Decode tokens/s over the answer: flat for a memory-bound decode, falling
// slowly as the KV cache (read every step) grows.
QChartView* MetricsDock::buildDecodeChart() {
  m_decodeChart = new QChart;
  m_decodeChart->setTitle(tr("Decode tokens/s over the answer"));
  m_decodeSeries = new QLineSeries;
  m_decodeSeries->setPointsVisible(true);
  m_decodeChart->addSeries(m_decodeSeries);
  m_decodeX = new QValueAxis;
  m_decodeX->setTitleText(tr("token"));
  m_decodeY = new QValueAxis;
  for (QValueAxis* a : {m_decodeX, m_decodeY}) styleAxis(a);
  m_decodeChart->addAxis(m_decodeX, Qt::AlignBottom);
  m_decodeChart->addAxis(m_decodeY, Qt::AlignLeft);
  m_decodeSeries->attachAxis(m_decodeX);
  m_decodeSeries->attachAxis(m_decodeY);
  m_decodeEmpty = addPlaceholder(m_decodeChart, tr("No tokens yet"));
  return makeChartView(m_decodeChart, 120);
}

QChartView* MetricsDock::buildTtftChart() {
  auto* ttftChart = m_ttftChart = new QChart;
  ttftChart->setTitle(tr("Time to first token per turn (ms)"));
  m_ttftSeries = new QLineSeries;
  m_ttftSeries->setPointsVisible(true);
  ttftChart->addSeries(m_ttftSeries);
  m_ttftX = new QValueAxis;
  m_ttftX->setTitleText(tr("turn"));
  m_ttftY = new QValueAxis;
  for (QValueAxis* a : {m_ttftX, m_ttftY}) styleAxis(a);
  ttftChart->addAxis(m_ttftX, Qt::AlignBottom);
  ttftChart->addAxis(m_ttftY, Qt::AlignLeft);
  m_ttftSeries->attachAxis(m_ttftX);
  m_ttftSeries->attachAxis(m_ttftY);
  m_ttftEmpty = addPlaceholder(ttftChart, tr("No answers yet"));
  return makeChartView(ttftChart, 120);
}

QChartView* MetricsDock::buildTimelineChart() {
  auto* timelineChart = m_timelineChart = new QChart;
  timelineChart->setTitle(tr("Request timeline (ms)"));
  m_timeline = new QHorizontalStackedBarSeries;
  m_timeline->setBarWidth(0.7);
  m_prefillSet = new QBarSet(tr("prefill"));
  m_decodeSet = new QBarSet(tr("decode"));
  m_timeline->append(m_prefillSet);
  m_timeline->append(m_decodeSet);
  timelineChart->addSeries(m_timeline);
  m_timelineCategories = new QBarCategoryAxis;
  // Qt elides "#12" to "..." unless a row is taller than the label plus a
  // generous padding; the rows are never shorter than the label itself.
  m_timelineCategories->setTruncateLabels(false);
  m_timelineX = new QValueAxis;
  styleAxis(m_timelineCategories);
  styleAxis(m_timelineX);
  timelineChart->addAxis(m_timelineCategories, Qt::AlignLeft);
  timelineChart->addAxis(m_timelineX, Qt::AlignBottom);
  m_timeline->attachAxis(m_timelineCategories);
  m_timeline->attachAxis(m_timelineX);
  m_timelineEmpty = addPlaceholder(timelineChart, tr("No requests yet"));
  // Room for kTimelineRequests rows whose labels are never elided.
  auto* timelineView = makeChartView(timelineChart, 210);
  timelineChart->legend()->show();
  timelineChart->legend()->setLabelColor(QPalette().color(QPalette::Text));
  timelineChart->legend()->setAlignment(Qt::AlignBottom);
  return timelineView;
}

// The charts follow the theme, rescale to their size, and explain a point
// under the mouse.
void MetricsDock::connectCharts() {
  connect(Appearance::instance(), &Appearance::changed, this, [this] {
    for (QChart* chart : {m_decodeChart, m_ttftChart, m_timelineChart}) restyleChart(chart);
  });
  for (QChart* chart : {m_decodeChart, m_ttftChart, m_timelineChart})
    connect(chart, &QChart::plotAreaChanged, this, [this] {
      if (m_rescalePending || tickBudgets() == m_budgets) return;
      m_rescalePending = true;  // after the layout that emitted this
      QTimer::singleShot(0, this, [this] {
        m_rescalePending = false;
        rescale();
      });
    });
  connect(m_decodeSeries, &QLineSeries::hovered, this,
          [this](const QPointF& p, bool state) { showPointToolTip(m_decodeSeries, p, state); });
  connect(m_ttftSeries, &QLineSeries::hovered, this,
          [this](const QPointF& p, bool state) { showPointToolTip(m_ttftSeries, p, state); });
  connect(m_timeline, &QHorizontalStackedBarSeries::hovered, this,
          [this](bool state, int index, QBarSet*) { showTimelineToolTip(state, index); });
}

// The Phase meter & KV tab: the phase meter, the KV cache's use, speculative
// decoding's acceptance.
void MetricsDock::buildMeterPage() {
  m_kvBar = new QProgressBar;
  m_kvBar->setRange(0, 1);
  m_kvBar->setValue(0);
  m_kvBar->setFormat(tr("no request yet"));
  m_kvBlocks = new QLabel(tr("paged in blocks of 16 positions"));
  m_kvBlocks->setWordWrap(true);
  auto* kvBox = new QWidget;
  auto* kvCol = new QVBoxLayout(kvBox);
  kvCol->setContentsMargins(0, 0, 0, 0);
  kvCol->addWidget(m_kvBar);
  kvCol->addWidget(m_kvBlocks);

  m_phaseMeter = new PhaseMeter;
  m_spec = new QLabel(tr("Speculative decoding is off (Settings, or the chat toolbar)."));
  m_spec->setObjectName(QStringLiteral("specLabel"));
  m_spec->setWordWrap(true);
  m_spec->setEnabled(false);

  m_meterPage = new QWidget;
  auto* meterCol = new QVBoxLayout(m_meterPage);
  meterCol->setContentsMargins(0, 0, 0, 0);
  meterCol->addWidget(group(tr("Phase meter"), m_phaseMeter));
  meterCol->addWidget(group(tr("KV cache (positions used / capacity)"), kvBox));
  meterCol->addWidget(group(tr("Speculative acceptance"), m_spec));
  meterCol->addStretch(1);
}

void MetricsDock::showPhaseMeter() { m_tabs->setCurrentIndex(1); }

void MetricsDock::setModel(const ModelInfo& info) {
  const bool wasRemote = m_remote;
  m_remote = info.remote;
  m_remoteNote->setVisible(m_remote);
  if (m_remote) {
    m_modelText = tr("%1 · remote server at %2").arg(info.name, info.remoteUrl);
    m_header->setText(m_modelText);
    m_kvStorage = QStringLiteral("—");
    m_phaseMeter->setModel(0, 0, false);
    m_phaseMeter->setRemote(true);
    m_kvBar->setRange(0, 1);
    m_kvBar->setValue(0);
    // A dash in the bar (a sentence there is clipped in a narrow dock), the
    // reason below it.
    m_kvBar->setFormat(QStringLiteral("—"));
    m_kvBar->setEnabled(false);  // greyed as the phase meter's bars
    m_kvBlocks->setText(tr("The server's KV cache is not visible from here."));
    // The wait for the first token is the network, the server's queue and
    // its prefill together: not the prefill alone.
    m_prefillSet->setLabel(tr("to first token"));
    m_spec->setEnabled(false);
    m_spec->setText(tr("— (the server's speculative decoding, if any, is not visible from here)"));
    return;
  }
  m_phaseMeter->setRemote(false);
  if (wasRemote) {
    m_kvBar->setEnabled(true);
    m_kvBar->setFormat(tr("no request yet"));
    m_kvBlocks->setText(tr("paged in blocks of 16 positions"));
    m_prefillSet->setLabel(tr("prefill"));
    m_spec->setText(tr("Speculative decoding is off (Settings, or the chat toolbar)."));
  }
  m_modelText = tr("%1 · %2 · %n thread(s) · context %3", "", info.threads).arg(info.name, info.backend).arg(info.contextSize);
  m_header->setText(m_modelText);
  m_kvStorage = tr("%1 storage, %2 MiB").arg(info.kvType.toUpper()).arg(info.kvBytes / 1048576.0, 0, 'f', 1);
  if (!info.kvWindowNote.isEmpty()) m_kvStorage += tr(" (%1)").arg(info.kvWindowNote);
  // The fast CPU backend ("cpu-avx512-vnni", "cpu-avx2", ...) multiplies 8-bit
  // activations by the quantized weights in integers; the reference path
  // and the GPU work in floats.
  m_phaseMeter->setModel(info.weightBytes, info.prefillOpsPerToken, multiplies_in_int8(info.backend.toStdString()),
                         info.maxBatch);
}

void MetricsDock::setPeaks(const HardwarePeaks& peaks) { m_phaseMeter->setPeaks(peaks); }

void MetricsDock::startRequest(const LiveMetrics& m) {
  m_requestId = m.requestId;
  m_requests++;
  m_decodeSeries->clear();
  m_maxTps = 0;
  m_maxTokens = 0;
  if (m_rows.size() >= kTimelineRequests) m_rows.removeFirst();
  m_rows.append({m_requests, 0, 0, 0});
  // Always kTimelineRequests slots, so a bar keeps its thickness from the
  // first request to the eighth: the newest on top, blank slots (distinct
  // runs of spaces; the axis needs unique names) at the bottom.
  QStringList cats;
  for (int i = m_rows.size(); i < kTimelineRequests; i++) cats << QString(i + 1, QLatin1Char(' '));
  for (const TimelineRow& r : m_rows) cats << QStringLiteral("#%1").arg(r.number);
  m_timelineCategories->setCategories(cats);
  refreshTimeline();
}

void MetricsDock::refreshTimeline() {
  QList<qreal> prefill(kTimelineRequests - m_rows.size(), 0), decode = prefill;
  for (const TimelineRow& r : m_rows) {
    prefill << r.prefillMs;
    decode << r.decodeMs;
  }
  m_prefillSet->remove(0, m_prefillSet->count());
  m_decodeSet->remove(0, m_decodeSet->count());
  m_prefillSet->append(prefill);
  m_decodeSet->append(decode);
}

// Every value axis on a 1-2-5 scale; the counts (tokens, turns) on integers.
// Headroom of 10% above the largest value keeps its marker off the frame.
QList<int> MetricsDock::tickBudgets() const {
  return {tickBudget(m_decodeChart->size().width(), 40, 6), tickBudget(m_decodeChart->plotArea().height(), 22, 6),
          tickBudget(m_ttftChart->size().width(), 22, 8), tickBudget(m_ttftChart->plotArea().height(), 22, 6),
          tickBudget(m_timelineChart->size().width(), 40, 6)};
}

void MetricsDock::rescale() {
  m_budgets = tickBudgets();
  applyScale(m_decodeX, niceScale(0, std::max(16.0, m_maxTokens * 1.05), m_budgets[0], true));
  applyScale(m_decodeY, niceScale(0, m_maxTps > 0 ? m_maxTps * 1.1 : 10, m_budgets[1]));
  // One turn to the right of the last, so that its marker is not on the frame.
  applyScale(m_ttftX, niceScale(0, std::max(5, m_maxTurn + 1), m_budgets[2], true));
  applyScale(m_ttftY, niceScale(0, m_maxTtft > 0 ? m_maxTtft * 1.1 : 100, m_budgets[3]));
  double maxTimeline = 0;
  for (const TimelineRow& r : m_rows) maxTimeline = std::max(maxTimeline, r.prefillMs + r.decodeMs);
  applyScale(m_timelineX, niceScale(0, maxTimeline > 0 ? maxTimeline * 1.05 : 100, m_budgets[4]));
  m_decodeEmpty->setVisible(m_decodeSeries->count() == 0);
  m_ttftEmpty->setVisible(m_ttftSeries->count() == 0);
  m_timelineEmpty->setVisible(m_rows.isEmpty());
}

void MetricsDock::updateMetrics(const LiveMetrics& m) {
  if (m.requestId != m_requestId) startRequest(m);
  const int last = m_rows.size() - 1;
  if (m.phase == Phase::prefill) {
    // A remote server's prompt length is known at the end (its usage).
    m_header->setText(m.remote ? m_modelText + tr(" — waiting for the first token")
                               : m_modelText + tr(" — prefill of %1 tokens").arg(m.nPrompt - m.nReused));
  } else {
    // The final snapshot's window is the tail since the last one, often a
    // few tokens: plot it only where no earlier point covers that token.
    const bool first = m_decodeSeries->count() == 0;
    const double tps = m.phase == Phase::done && first ? m.decodeTps : m.windowTps;
    const bool newToken = first || m.nGenerated > m_decodeSeries->at(m_decodeSeries->count() - 1).x();
    if (m.nGenerated > 0 && tps > 0 && newToken) {
      m_decodeSeries->append(m.nGenerated, tps);
      m_maxTps = std::max(m_maxTps, tps);
    }
    m_maxTokens = std::max(m_maxTokens, m.nGenerated);
    TimelineRow& row = m_rows[last];
    row.prefillMs = m.ttftMs;
    row.decodeMs = std::max(0.0, m.elapsedMs - m.ttftMs);
    row.tokens = m.nGenerated;
    const int bar = kTimelineRequests - 1;  // the newest row's slot
    m_prefillSet->replace(bar, row.prefillMs);
    m_decodeSet->replace(bar, row.decodeMs);
    const QString phase = m.phase == Phase::done ? tr("done") : tr("decoding");
    // (No rate yet at the first token.)
    m_header->setText(m_modelText + (m.decodeTps > 0 ? tr(" — %1, %2 tokens, %3 tok/s")
                                                           .arg(phase)
                                                           .arg(m.nGenerated)
                                                           .arg(m.decodeTps, 0, 'f', 1)
                                                     : tr(" — %1, %2 tokens").arg(phase).arg(m.nGenerated)));
  }
  // A request stopped before its first token has no TTFT: a point at 0 ms
  // would be a marker on the axis that reads as "instant".
  if (m.phase == Phase::done && m.nGenerated > 0 && m.ttftMs > 0 && m_ttftRequestId != m.requestId) {
    m_ttftRequestId = m.requestId;
    m_ttftSeries->append(m_requests, m.ttftMs);
    m_maxTtft = std::max(m_maxTtft, m.ttftMs);
    m_maxTurn = m_requests;
  }
  rescale();
  if (m.kvCapacity > 0) {
    m_kvBar->setRange(0, static_cast<int>(m.kvCapacity));
    m_kvBar->setValue(static_cast<int>(std::min(m.kvUsed, m.kvCapacity)));
    m_kvBar->setFormat(tr("%1 / %2 (%p%)").arg(m.kvUsed).arg(m.kvCapacity));
  }
  if (!m.speculative.isEmpty()) {
    m_spec->setEnabled(true);
    const QString why = tr(" Verification checks all drafted tokens in one pass, so accepted drafts are tokens "
                           "that cost no pass of their own.");
    if (m.specDrafted <= 0) {
      // Nothing to verify yet (a lookup finds no match in the context): each
      // target pass made its one token, as without speculation.
      m_spec->setText(tr("%1: no drafts yet, so 1.00 token per target pass.").arg(m.speculative) + why);
    } else {
      QString text = tr("%1: %2 drafted, %3 accepted (%4%)")
                         .arg(m.speculative)
                         .arg(m.specDrafted)
                         .arg(m.specAccepted)
                         .arg(100.0 * m.specAcceptance, 0, 'f', 0);
      // Every pass makes at least one token; below 1 the count is not in yet.
      if (m.tokensPerPass >= 1) text += tr(", %1 tokens per target pass").arg(m.tokensPerPass, 0, 'f', 2);
      m_spec->setText(text + QLatin1Char('.') + why);
    }
  } else if (m.phase == Phase::done && !m.remote) {
    m_spec->setEnabled(false);
    m_spec->setText(tr("Speculative decoding is off (Settings, or the chat toolbar)."));
  }
  if (m.phase == Phase::done && m.kvBlocksTotal > 0)
    m_kvBlocks->setText(tr("%1 of %2 blocks in use, %3 cached for reuse, %4 shared; %5 prompt tokens reused; %6")
                            .arg(m.kvBlocksUsed)
                            .arg(m.kvBlocksTotal)
                            .arg(m.kvBlocksCached)
                            .arg(m.kvBlocksShared)
                            .arg(m.nReused)
                            .arg(m_kvStorage));
  m_phaseMeter->update(m);
}

// The exact value of the data point nearest the hovered spot of the line.
void MetricsDock::showPointToolTip(QLineSeries* series, const QPointF& hovered, bool state) {
  if (!state || series->count() == 0) {
    QToolTip::hideText();
    return;
  }
  const QList<QPointF> points = series->points();
  const QPointF p = *std::min_element(points.begin(), points.end(), [&](const QPointF& a, const QPointF& b) {
    return std::abs(a.x() - hovered.x()) < std::abs(b.x() - hovered.x());
  });
  const QString text = series == m_ttftSeries
                           ? tr("Turn %1: first token after %2 ms").arg(p.x()).arg(p.y(), 0, 'f', 1)
                           : tr("Token %1: %2 tokens/s").arg(p.x()).arg(p.y(), 0, 'f', 1);
  QToolTip::showText(QCursor::pos(), text);
}

void MetricsDock::showTimelineToolTip(bool state, int index) {
  index -= kTimelineRequests - m_rows.size();  // past the blank slots
  if (!state || index < 0 || index >= m_rows.size()) {
    QToolTip::hideText();
    return;
  }
  const TimelineRow& r = m_rows[index];
  if (m_remote) {
    QToolTip::showText(QCursor::pos(), tr("#%1: first token after %2 ms + decode %3 ms = %4 ms, %n token(s)", "",
                                          r.tokens)
                                           .arg(r.number)
                                           .arg(r.prefillMs, 0, 'f', 1)
                                           .arg(r.decodeMs, 0, 'f', 1)
                                           .arg(r.prefillMs + r.decodeMs, 0, 'f', 1));
    return;
  }
  QToolTip::showText(QCursor::pos(), tr("#%1: prefill %2 ms + decode %3 ms = %4 ms, %n token(s)", "", r.tokens)
                                         .arg(r.number)
                                         .arg(r.prefillMs, 0, 'f', 1)
                                         .arg(r.decodeMs, 0, 'f', 1)
                                         .arg(r.prefillMs + r.decodeMs, 0, 'f', 1));
}

QString MetricsDock::specText() const { return m_spec->text(); }
bool MetricsDock::isRemoteNoteShown() const { return m_remoteNote->isVisibleTo(this); }
QString MetricsDock::remoteNoteText() const { return m_remoteNote->text(); }

int MetricsDock::decodePointCount() const { return m_decodeSeries->count(); }
int MetricsDock::ttftPointCount() const { return m_ttftSeries->count(); }
QList<QPointF> MetricsDock::ttftPoints() const { return m_ttftSeries->points(); }
int MetricsDock::timelineCount() const { return m_rows.size(); }
QStringList MetricsDock::timelineLabels() const {
  QStringList out;
  for (const QString& c : m_timelineCategories->categories())
    if (!c.trimmed().isEmpty()) out << c;
  return out;
}
QString MetricsDock::kvText() const { return m_kvBar->text(); }

QStringList MetricsDock::placeholders() const {
  QStringList out;
  for (QGraphicsSimpleTextItem* item : {m_decodeEmpty, m_ttftEmpty, m_timelineEmpty})
    if (item->isVisible()) out << item->text();
  return out;
}

}  // namespace phaselab::ui
