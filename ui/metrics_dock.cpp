#include "metrics_dock.h"

#include <QBarCategoryAxis>
#include <QBarSet>
#include <QChart>
#include <QChartView>
#include <QGroupBox>
#include <QHorizontalStackedBarSeries>
#include <QLabel>
#include <QLineSeries>
#include <QProgressBar>
#include <QScrollArea>
#include <QVBoxLayout>
#include <QValueAxis>
#include <algorithm>

#include "phase_meter.h"

namespace phaselab::ui {

namespace {

QChartView* makeChartView(QChart* chart) {
  chart->legend()->hide();
  chart->setMargins(QMargins(2, 2, 2, 2));
  chart->setBackgroundRoundness(0);
  // Follow the window's palette so the charts are readable in dark mode too.
  const QPalette pal;
  chart->setBackgroundBrush(pal.color(QPalette::Base));
  chart->setTitleBrush(pal.color(QPalette::Text));
  auto* view = new QChartView(chart);
  view->setRenderHint(QPainter::Antialiasing);
  view->setMinimumHeight(150);
  return view;
}

void styleAxis(QAbstractAxis* axis) {
  const QPalette pal;
  axis->setLabelsBrush(pal.color(QPalette::Text));
  axis->setTitleBrush(pal.color(QPalette::Text));
  QFont f = axis->labelsFont();
  f.setPointSizeF(std::max(6.0, f.pointSizeF() * 0.8));
  axis->setLabelsFont(f);
}

QGroupBox* group(const QString& title, QWidget* content) {
  auto* box = new QGroupBox(title);
  auto* l = new QVBoxLayout(box);
  l->setContentsMargins(4, 4, 4, 4);
  l->addWidget(content);
  return box;
}

}  // namespace

MetricsDock::MetricsDock(QWidget* parent) : QDockWidget(tr("Metrics"), parent) {
  setObjectName(QStringLiteral("metricsDock"));
  auto* content = new QWidget;
  auto* layout = new QVBoxLayout(content);
  layout->setContentsMargins(4, 4, 4, 4);
  m_header = new QLabel(tr("No model loaded"));
  m_header->setWordWrap(true);
  layout->addWidget(m_header);

  // Decode tokens/s over the answer: flat for a memory-bound decode, falling
  // slowly as the KV cache (read every step) grows.
  auto* decodeChart = new QChart;
  decodeChart->setTitle(tr("Decode tokens/s over the answer"));
  m_decodeSeries = new QLineSeries;
  m_decodeSeries->setPointsVisible(true);
  decodeChart->addSeries(m_decodeSeries);
  m_decodeX = new QValueAxis;
  m_decodeX->setTitleText(tr("token"));
  m_decodeX->setLabelFormat(QStringLiteral("%d"));
  m_decodeY = new QValueAxis;
  m_decodeY->setLabelFormat(QStringLiteral("%.0f"));
  for (QValueAxis* a : {m_decodeX, m_decodeY}) styleAxis(a);
  decodeChart->addAxis(m_decodeX, Qt::AlignBottom);
  decodeChart->addAxis(m_decodeY, Qt::AlignLeft);
  m_decodeSeries->attachAxis(m_decodeX);
  m_decodeSeries->attachAxis(m_decodeY);
  m_decodeX->setRange(0, 16);
  m_decodeY->setRange(0, 1);
  layout->addWidget(makeChartView(decodeChart));

  auto* ttftChart = new QChart;
  ttftChart->setTitle(tr("Time to first token per turn (ms)"));
  m_ttftSeries = new QLineSeries;
  m_ttftSeries->setPointsVisible(true);
  ttftChart->addSeries(m_ttftSeries);
  m_ttftX = new QValueAxis;
  m_ttftX->setLabelFormat(QStringLiteral("%d"));
  m_ttftX->setTitleText(tr("turn"));
  m_ttftY = new QValueAxis;
  m_ttftY->setLabelFormat(QStringLiteral("%.0f"));
  for (QValueAxis* a : {m_ttftX, m_ttftY}) styleAxis(a);
  ttftChart->addAxis(m_ttftX, Qt::AlignBottom);
  ttftChart->addAxis(m_ttftY, Qt::AlignLeft);
  m_ttftSeries->attachAxis(m_ttftX);
  m_ttftSeries->attachAxis(m_ttftY);
  m_ttftX->setRange(0, 5);
  m_ttftY->setRange(0, 1);
  layout->addWidget(makeChartView(ttftChart));

  auto* timelineChart = new QChart;
  timelineChart->setTitle(tr("Request timeline: prefill | decode (ms)"));
  m_timeline = new QHorizontalStackedBarSeries;
  m_prefillSet = new QBarSet(tr("prefill"));
  m_decodeSet = new QBarSet(tr("decode"));
  m_timeline->append(m_prefillSet);
  m_timeline->append(m_decodeSet);
  timelineChart->addSeries(m_timeline);
  m_timelineCategories = new QBarCategoryAxis;
  m_timelineX = new QValueAxis;
  m_timelineX->setLabelFormat(QStringLiteral("%.0f"));
  styleAxis(m_timelineCategories);
  styleAxis(m_timelineX);
  timelineChart->addAxis(m_timelineCategories, Qt::AlignLeft);
  timelineChart->addAxis(m_timelineX, Qt::AlignBottom);
  m_timeline->attachAxis(m_timelineCategories);
  m_timeline->attachAxis(m_timelineX);
  m_timelineX->setRange(0, 1);
  auto* timelineView = makeChartView(timelineChart);
  timelineChart->legend()->show();
  timelineChart->legend()->setLabelColor(QPalette().color(QPalette::Text));
  timelineChart->legend()->setAlignment(Qt::AlignBottom);
  layout->addWidget(timelineView);

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
  layout->addWidget(group(tr("KV cache (positions used / capacity)"), kvBox));

  m_phaseMeter = new PhaseMeter;
  layout->addWidget(group(tr("Phase meter"), m_phaseMeter));

  m_spec = new QLabel(tr("Speculative decoding is off (Settings, or the chat toolbar)."));
  m_spec->setObjectName(QStringLiteral("specLabel"));
  m_spec->setWordWrap(true);
  m_spec->setEnabled(false);
  layout->addWidget(group(tr("Speculative acceptance"), m_spec));
  layout->addStretch(1);

  auto* scroll = new QScrollArea;
  scroll->setWidgetResizable(true);
  scroll->setWidget(content);
  setWidget(scroll);
  setMinimumWidth(320);
}

void MetricsDock::setModel(const ModelInfo& info) {
  m_modelText = tr("%1 · %2 · %n thread(s) · context %3", "", info.threads).arg(info.name, info.backend).arg(info.contextSize);
  m_header->setText(m_modelText);
  // The fast CPU backend ("cpu-avx512-vnni", "cpu-avx2", ...) multiplies 8-bit
  // activations by the quantized weights in integers; the reference path
  // and the GPU work in floats.
  const bool int8 = info.backend.startsWith(QLatin1String("cpu")) && info.backend != QLatin1String("cpu-reference");
  m_phaseMeter->setModel(info.weightBytes, info.prefillOpsPerToken, int8);
}

void MetricsDock::setPeaks(const HardwarePeaks& peaks) { m_phaseMeter->setPeaks(peaks); }

void MetricsDock::startRequest(const LiveMetrics& m) {
  m_requestId = m.requestId;
  m_turn++;
  m_decodeSeries->clear();
  m_maxTps = 1;
  m_decodeX->setRange(0, 16);
  if (m_prefillSet->count() >= kTimelineRequests) {
    m_prefillSet->remove(0);
    m_decodeSet->remove(0);
    QStringList cats = m_timelineCategories->categories();
    cats.removeFirst();
    m_timelineCategories->setCategories(cats);
  }
  m_prefillSet->append(0);
  m_decodeSet->append(0);
  QStringList cats = m_timelineCategories->categories();
  cats.append(QStringLiteral("#%1").arg(m_turn));
  m_timelineCategories->setCategories(cats);
}

void MetricsDock::updateMetrics(const LiveMetrics& m) {
  if (m.requestId != m_requestId) startRequest(m);
  const int last = m_prefillSet->count() - 1;
  if (m.phase == QLatin1String("prefill")) {
    m_header->setText(m_modelText + tr(" — prefill of %1 tokens").arg(m.nPrompt - m.nReused));
  } else {
    const double tps = m.phase == QLatin1String("done") && m_decodeSeries->count() == 0 ? m.decodeTps : m.windowTps;
    if (m.nGenerated > 0 && tps > 0) {
      m_decodeSeries->append(m.nGenerated, tps);
      m_maxTps = std::max(m_maxTps, tps);
      m_decodeY->setRange(0, m_maxTps * 1.15);
      m_decodeX->setRange(0, std::max(16, m.nGenerated));
    }
    m_prefillSet->replace(last, m.ttftMs);
    m_decodeSet->replace(last, std::max(0.0, m.elapsedMs - m.ttftMs));
    m_maxTimeline = 0;
    for (int i = 0; i < m_prefillSet->count(); i++)
      m_maxTimeline = std::max(m_maxTimeline, m_prefillSet->at(i) + m_decodeSet->at(i));
    m_timelineX->setRange(0, std::max(1.0, m_maxTimeline * 1.05));
    const QString phase = m.phase == QLatin1String("done") ? tr("done") : tr("decoding");
    m_header->setText(m_modelText +
                      tr(" — %1, %2 tokens, %3 tok/s").arg(phase).arg(m.nGenerated).arg(m.decodeTps, 0, 'f', 1));
  }
  if (m.phase == QLatin1String("done")) {
    m_ttftSeries->append(m_turn, m.ttftMs);
    m_maxTtft = std::max(m_maxTtft, m.ttftMs);
    m_ttftY->setRange(0, m_maxTtft * 1.15);
    m_ttftX->setRange(0, std::max(5, m_turn + 1));
  }
  if (m.kvCapacity > 0) {
    m_kvBar->setRange(0, static_cast<int>(m.kvCapacity));
    m_kvBar->setValue(static_cast<int>(std::min(m.kvUsed, m.kvCapacity)));
    m_kvBar->setFormat(tr("%1 / %2 (%p%)").arg(m.kvUsed).arg(m.kvCapacity));
  }
  if (!m.speculative.isEmpty()) {
    m_spec->setEnabled(true);
    const double rate = m.specDrafted > 0 ? 100.0 * m.specAccepted / m.specDrafted : 0;
    m_spec->setText(tr("%1: %2 drafted, %3 accepted (%4%), %5 tokens per target pass. Verification checks all drafted "
                       "tokens in one pass, so accepted drafts are tokens that cost no pass of their own.")
                        .arg(m.speculative)
                        .arg(m.specDrafted)
                        .arg(m.specAccepted)
                        .arg(rate, 0, 'f', 0)
                        .arg(m.tokensPerPass, 0, 'f', 2));
  } else if (m.phase == QLatin1String("done")) {
    m_spec->setEnabled(false);
    m_spec->setText(tr("Speculative decoding is off (Settings, or the chat toolbar)."));
  }
  if (m.phase == QLatin1String("done") && m.kvBlocksTotal > 0)
    m_kvBlocks->setText(tr("%1 of %2 blocks in use, %3 cached for reuse, %4 shared; %5 prompt tokens reused")
                            .arg(m.kvBlocksUsed)
                            .arg(m.kvBlocksTotal)
                            .arg(m.kvBlocksCached)
                            .arg(m.kvBlocksShared)
                            .arg(m.nReused));
  m_phaseMeter->update(m);
}

QString MetricsDock::specText() const { return m_spec->text(); }

int MetricsDock::decodePointCount() const { return m_decodeSeries->count(); }
int MetricsDock::ttftPointCount() const { return m_ttftSeries->count(); }
int MetricsDock::timelineCount() const { return m_prefillSet->count(); }
QString MetricsDock::kvText() const { return m_kvBar->text(); }

}  // namespace phaselab::ui
