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
#include "phaselab/speculative.h"

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

// Colours are not set here: restyleChart() sets them all, at construction
// and after every theme change, so a chart made in a dark window looks the
// same as one switched to dark later.
QChartView* makeChartView(QChart* chart, int minimumHeight) {
  chart->legend()->hide();
  chart->setMargins(QMargins(2, 2, 2, 2));
  chart->setBackgroundRoundness(0);
  chart->layout()->setContentsMargins(0, 0, 0, 0);  // fill the view
  auto* view = new QChartView(chart);
  view->setAccessibleName(chart->title());
  view->setRenderHint(QPainter::Antialiasing);
  view->setMinimumHeight(minimumHeight);
  return view;
}

QColor mix(const QColor& a, const QColor& b, double towardB) {
  return QColor::fromRgbF(static_cast<float>(a.redF() + (b.redF() - a.redF()) * towardB),
                          static_cast<float>(a.greenF() + (b.greenF() - a.greenF()) * towardB),
                          static_cast<float>(a.blueF() + (b.blueF() - a.blueF()) * towardB));
}

// The one place the charts take colours and fonts from the application's
// palette and font: at construction and after a theme or text-size change
// (View menu). The grid is a sixth of the way from the plot's background to
// its text, a thin guide in either theme; the axis lines a little stronger.
void restyleChart(QChart* chart) {
  const QPalette pal = QApplication::palette();
  const QColor base = pal.color(QPalette::Base), text = pal.color(QPalette::Text);
  chart->setBackgroundBrush(base);
  chart->setTitleBrush(text);
  QFont title = QApplication::font();
  title.setBold(true);
  chart->setTitleFont(title);
  chart->legend()->setLabelColor(text);
  QFont small = QApplication::font();
  small.setPointSizeF(std::max(6.0, small.pointSizeF() * 0.8));
  chart->legend()->setFont(small);
  QPen grid(mix(base, text, 0.17), 1);
  grid.setCosmetic(true);
  QPen line(mix(base, text, 0.45), 1);
  line.setCosmetic(true);
  for (QAbstractAxis* axis : chart->axes()) {
    axis->setLabelsBrush(text);
    axis->setTitleBrush(text);
    axis->setLabelsFont(small);
    axis->setTitleFont(small);
    axis->setGridLinePen(grid);
    axis->setMinorGridLinePen(grid);
    axis->setLinePen(line);
  }
  for (QGraphicsItem* item : chart->childItems())
    if (auto* placeholder = dynamic_cast<QGraphicsSimpleTextItem*>(item))
      placeholder->setBrush(pal.color(QPalette::PlaceholderText));
}

// "Prompt lookup" for the setting and the draft source's name "lookup".
QString speculativeName(const QString& mode) {
  if (mode == QLatin1String(to_string(SpeculativeMode::prompt_lookup))) return QObject::tr("Prompt lookup");
  if (mode == QLatin1String(to_string(SpeculativeMode::draft_model))) return QObject::tr("Draft model");
  if (mode == QLatin1String(to_string(SpeculativeMode::self_draft))) return QObject::tr("Self (layers skipped)");
  return mode;
}

bool isSpeculativeOff(const QString& mode) {
  return mode.isEmpty() || mode == QLatin1String(to_string(SpeculativeMode::off));
}

// A grey "No answers yet" in the middle of the plot area while a chart is
// empty, so that an empty chart reads as empty and not as zero.
QGraphicsSimpleTextItem* addPlaceholder(QChart* chart, const QString& text) {
  auto* item = new QGraphicsSimpleTextItem(text, chart);
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
  restyleCharts();
  setSpeculativeMode(QString::fromLatin1(to_string(SpeculativeMode::off)));
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
  timelineChart->addAxis(m_timelineCategories, Qt::AlignLeft);
  timelineChart->addAxis(m_timelineX, Qt::AlignBottom);
  m_timeline->attachAxis(m_timelineCategories);
  m_timeline->attachAxis(m_timelineX);
  m_timelineEmpty = addPlaceholder(timelineChart, tr("No requests yet"));
  // Room for kTimelineRequests rows whose labels are never elided.
  auto* timelineView = makeChartView(timelineChart, 210);
  timelineChart->legend()->show();
  timelineChart->legend()->setAlignment(Qt::AlignBottom);
  return timelineView;
}

// The charts follow the theme, rescale to their size, and explain a point
// under the mouse.
void MetricsDock::connectCharts() {
  connect(Appearance::instance(), &Appearance::changed, this, &MetricsDock::restyleCharts);
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

void MetricsDock::restyleCharts() {
  for (QChart* chart : {m_decodeChart, m_ttftChart, m_timelineChart}) restyleChart(chart);
}

void MetricsDock::showPhaseMeter() { m_tabs->setCurrentIndex(1); }

void MetricsDock::setModel(const ModelInfo& info) {
  m_remote = info.remote;
  m_remoteNote->setVisible(m_remote);
  m_phaseMeter->setRemote(m_remote);
  if (m_remote) {
    m_modelText = tr("%1 · remote server at %2").arg(info.name, info.remoteUrl);
    m_header->setText(m_modelText);
    m_kvStorage = QStringLiteral("—");
    m_contextSize = m_kvPoolBlocks = 0;
    m_phaseMeter->setModel(0, 0, false);
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
  m_prefillSet->setLabel(tr("prefill"));
  m_modelText = tr("%1 · %2 · %n thread(s) · context %3", "", info.threads).arg(info.name, unbrokenName(info.backend)).arg(info.contextSize);
  m_header->setText(m_modelText);
  m_kvStorage = tr("%1 storage, %2 MiB").arg(info.kvType.toUpper()).arg(info.kvBytes / 1048576.0, 0, 'f', 1);
  if (!info.kvWindowNote.isEmpty()) m_kvStorage += tr(" (%1)").arg(info.kvWindowNote);
  m_contextSize = info.contextSize;
  m_kvPoolBlocks = info.kvBlocks;
  // A new session has a new, empty pool: the previous model's figures
  // describe nothing now.
  showKvPoolEmpty();
  showSpeculativeSelected();  // measured with the previous model: not this one's
  // The fast CPU backend ("cpu-avx512-vnni", "cpu-avx2", ...) multiplies 8-bit
  // activations by the quantized weights in integers; the reference path
  // and the GPU work in floats.
  m_phaseMeter->setModel(info.weightBytes, info.prefillOpsPerToken, multiplies_in_int8(info.backend.toStdString()),
                         info.maxBatch);
  m_phaseMeter->setExperts(info.expertsUsed, info.experts);
}

void MetricsDock::showKvPoolEmpty() {
  m_kvBar->setEnabled(true);
  m_kvBar->setRange(0, std::max(1, m_contextSize));
  m_kvBar->setValue(0);
  m_kvBar->setFormat(tr("0 / %1 (0%)").arg(m_contextSize));
  m_kvBlocks->setText(m_kvPoolBlocks > 0 ? tr("No request yet: 0 of %1 blocks of 16 positions in use, none cached; %2")
                                               .arg(m_kvPoolBlocks)
                                               .arg(m_kvStorage)
                                         : tr("No request yet; paged in blocks of 16 positions; %1").arg(m_kvStorage));
}

void MetricsDock::setSpeculativeMode(const QString& mode) {
  if (mode == m_specMode) return;  // what a request measured with it stays
  m_specMode = mode;
  showSpeculativeSelected();
}

void MetricsDock::showSpeculativeSelected() {
  if (m_remote) return;  // the remote text stays: the setting is not sent to a server
  if (isSpeculativeOff(m_specMode)) {
    m_spec->setEnabled(false);
    m_spec->setText(tr("Speculative decoding is off (Settings, or the chat toolbar)."));
    return;
  }
  m_spec->setEnabled(true);
  m_spec->setText(tr("%1 is selected; no request has measured it yet.").arg(speculativeName(m_specMode)));
}

void MetricsDock::setPeaks(const HardwarePeaks& peaks) { m_phaseMeter->setPeaks(peaks); }

void MetricsDock::showConversation(qint64 id, const QList<MessageRecord>& messages) {
  if (id != 0 && id == m_conversationId) return;  // the same one again (a mode change relabels it)
  m_conversationId = id;
  clearCharts();
  // Each answer was one request: the turns count as they did live.
  for (const MessageRecord& msg : messages) {
    if (msg.role != QLatin1String("assistant")) continue;
    m_requests++;
    const RequestStats& st = msg.stats;
    if (!msg.hasStats || !st.error.isEmpty()) continue;
    if (m_rows.size() >= kTimelineRequests) m_rows.removeFirst();
    m_rows.append({m_requests, st.ttftMs, st.decodeMs, st.nGenerated});
    if (st.nGenerated > 0 && st.ttftMs > 0) {  // as live: no TTFT without a first token
      m_ttftSeries->append(m_requests, st.ttftMs);
      m_maxTtft = std::max(m_maxTtft, st.ttftMs);
      m_maxTurn = m_requests;
    }
  }
  setTimelineCategories();
  refreshTimeline();
  rescale();
}

void MetricsDock::clearCharts() {
  m_otherConversationRequest = m_requestId;  // if it still runs, it is the other conversation's
  m_requestId = 0;
  m_requests = 0;
  m_decodeSeries->clear();
  m_ttftSeries->clear();
  m_rows.clear();
  m_maxTps = m_maxTtft = 0;
  m_maxTurn = m_maxTokens = 0;
  m_header->setText(m_modelText.isEmpty() ? tr("No model loaded") : m_modelText);
  setTimelineCategories();
  refreshTimeline();
  rescale();
}

void MetricsDock::startRequest(const LiveMetrics& m) {
  m_requestId = m.requestId;
  m_requests++;
  m_decodeSeries->clear();
  m_maxTps = 0;
  m_maxTokens = 0;
  if (m_rows.size() >= kTimelineRequests) m_rows.removeFirst();
  m_rows.append({m_requests, 0, 0, 0});
  setTimelineCategories();
  refreshTimeline();
}

// Always kTimelineRequests slots, so a bar keeps its thickness from the
// first request to the eighth: the newest on top, blank slots (distinct
// runs of spaces; the axis needs unique names) at the bottom.
void MetricsDock::setTimelineCategories() {
  QStringList cats;
  for (int i = m_rows.size(); i < kTimelineRequests; i++) cats << QString(i + 1, QLatin1Char(' '));
  for (const TimelineRow& r : m_rows) cats << QStringLiteral("#%1").arg(r.number);
  m_timelineCategories->setCategories(cats);
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
  // The rest of a request of the conversation shown before (stopped when
  // another was opened) stays out of this conversation's charts.
  if (m.requestId != m_otherConversationRequest) updateCharts(m);
  updateKvPanel(m);
  updateSpecPanel(m);
  m_phaseMeter->update(m);
}

void MetricsDock::updateCharts(const LiveMetrics& m) {
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
}

void MetricsDock::updateKvPanel(const LiveMetrics& m) {
  if (m.remote) return;  // the server's cache is not visible (setModel said so)
  if (!m.kvCache) {
    // Every step recomputes all positions: no blocks, nothing reused. The
    // previous request's figures would describe a cache this one never used.
    m_kvBar->setEnabled(false);
    m_kvBar->setRange(0, 1);
    m_kvBar->setValue(0);
    m_kvBar->setFormat(tr("off for this request"));
    m_kvBlocks->setText(tr("The KV cache is off for this request: every token recomputes all positions, so no "
                           "blocks are used and no prompt tokens are reused."));
    return;
  }
  m_kvBar->setEnabled(true);
  if (m.kvCapacity > 0) {
    m_kvBar->setRange(0, static_cast<int>(m.kvCapacity));
    m_kvBar->setValue(static_cast<int>(std::min(m.kvUsed, m.kvCapacity)));
    m_kvBar->setFormat(tr("%1 / %2 (%p%)").arg(m.kvUsed).arg(m.kvCapacity));
  }
  if (m.phase == Phase::done && m.kvBlocksTotal > 0) {
    m_kvBlocks->setText(tr("%1 of %2 blocks in use, %3 cached for reuse, %4 shared; %5 prompt tokens reused; %6")
                            .arg(m.kvBlocksUsed)
                            .arg(m.kvBlocksTotal)
                            .arg(m.kvBlocksCached)
                            .arg(m.kvBlocksShared)
                            .arg(m.nReused)
                            .arg(m_kvStorage));
  } else if (m.phase == Phase::prefill) {
    // The pool's blocks are counted at the end; the previous request's count
    // is not this one's.
    m_kvBlocks->setText(tr("This request reuses %1 prompt tokens; its blocks are counted when it ends; %2")
                            .arg(m.nReused)
                            .arg(m_kvStorage));
  }
}

void MetricsDock::updateSpecPanel(const LiveMetrics& m) {
  if (!m.speculative.isEmpty()) {
    m_spec->setEnabled(true);
    const QString name = speculativeName(m.speculative);
    const QString why = tr(" Verification checks all drafted tokens in one pass, so accepted drafts are tokens "
                           "that cost no pass of their own.");
    if (m.specDrafted <= 0) {
      // Nothing to verify yet (a lookup finds no match in the context): each
      // target pass made its one token, as without speculation.
      m_spec->setText(tr("%1: no drafts yet, so 1.00 token per target pass.").arg(name) + why);
    } else {
      QString text = tr("%1: %2 drafted, %3 accepted (%4%)")
                         .arg(name)
                         .arg(m.specDrafted)
                         .arg(m.specAccepted)
                         .arg(100.0 * m.specAcceptance, 0, 'f', 0);
      // Every pass makes at least one token; below 1 the count is not in yet.
      if (m.tokensPerPass >= 1) text += tr(", %1 tokens per target pass").arg(m.tokensPerPass, 0, 'f', 2);
      m_spec->setText(text + QLatin1Char('.') + why);
    }
  } else if (m.phase == Phase::done && !m.remote) {
    m_spec->setEnabled(false);
    // Selected but not used: the draft model could not be loaded (the error
    // banner says why).
    m_spec->setText(isSpeculativeOff(m_specMode)
                        ? tr("Speculative decoding is off (Settings, or the chat toolbar).")
                        : tr("%1 is selected, but this request ran without speculative decoding.")
                              .arg(speculativeName(m_specMode)));
  }
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
QString MetricsDock::kvBlocksText() const { return m_kvBlocks->text(); }

QStringList MetricsDock::placeholders() const {
  QStringList out;
  for (QGraphicsSimpleTextItem* item : {m_decodeEmpty, m_ttftEmpty, m_timelineEmpty})
    if (item->isVisible()) out << item->text();
  return out;
}

}  // namespace phaselab::ui
