#include "serving_timeline.h"

#include <QPaintEvent>
#include <QPainter>
#include <algorithm>
#include <map>

#include "chart_scale.h"

namespace phaselab::ui {

namespace {

constexpr int kLabelWidth = 64;   // lane names on the left
constexpr int kAxisHeight = 22;   // time labels below
constexpr int kLaneHeight = 16;
constexpr int kTopMargin = 4, kRightMargin = 12;

}  // namespace

TimelineModel timelineModel(const ServingRow& row) {
  TimelineModel m;
  std::map<int, TimelineLane> chat;  // by stream
  std::vector<TimelineLane> longs;
  for (const ServingRequestTrace& t : row.timeline) {
    m.endMs = std::max(m.endMs, t.arriveMs);
    if (!t.tokenMs.empty()) m.endMs = std::max(m.endMs, t.tokenMs.back());
    TimelineLane* lane;
    if (t.isLong) {
      longs.emplace_back();
      lane = &longs.back();
      lane->isLong = true;
      lane->label = QObject::tr("long %1").arg(longs.size());
      const double first = t.tokenMs.empty() ? t.firstTokenMs : t.tokenMs.front();
      lane->prefillMs.emplace_back(t.arriveMs, std::max(first, t.arriveMs));
    } else {
      lane = &chat[t.stream];
      lane->label = QObject::tr("chat %1").arg(t.stream + 1);
      for (size_t i = 1; i < t.tokenMs.size(); i++)
        if (t.tokenMs[i] - t.tokenMs[i - 1] > lane->stallToMs - lane->stallFromMs) {
          lane->stallFromMs = t.tokenMs[i - 1];
          lane->stallToMs = t.tokenMs[i];
        }
    }
    lane->requestStartsMs.push_back(t.arriveMs);
    lane->ticksMs.insert(lane->ticksMs.end(), t.tokenMs.begin(), t.tokenMs.end());
  }
  for (auto& [stream, lane] : chat) m.lanes.push_back(std::move(lane));
  for (TimelineLane& lane : longs) m.lanes.push_back(std::move(lane));
  return m;
}

std::vector<LaidOutLane> layoutTimeline(const TimelineModel& model, const QRectF& plot, double spanMs) {
  std::vector<LaidOutLane> out;
  if (model.lanes.empty() || plot.isEmpty()) return out;
  const double span = spanMs > 0 ? spanMs : std::max(model.endMs, 1.0);
  const double laneH = plot.height() / static_cast<double>(model.lanes.size());
  auto x = [&](double ms) { return plot.left() + std::clamp(ms / span, 0.0, 1.0) * plot.width(); };
  for (size_t i = 0; i < model.lanes.size(); i++) {
    const TimelineLane& lane = model.lanes[i];
    LaidOutLane l;
    l.rect = QRectF(plot.left(), plot.top() + laneH * static_cast<double>(i), plot.width(), laneH);
    l.tickX.reserve(lane.ticksMs.size());
    for (double t : lane.ticksMs) l.tickX.push_back(x(t));
    for (const auto& [from, to] : lane.prefillMs)
      l.bands.emplace_back(QPointF(x(from), l.rect.top() + laneH * 0.15), QPointF(x(to), l.rect.bottom() - laneH * 0.15));
    if (lane.stallToMs > lane.stallFromMs)
      l.stall = QRectF(QPointF(x(lane.stallFromMs), l.rect.top() + laneH * 0.35),
                       QPointF(x(lane.stallToMs), l.rect.bottom() - laneH * 0.35));
    out.push_back(std::move(l));
  }
  return out;
}

ServingTimelineWidget::ServingTimelineWidget(QWidget* parent) : QWidget(parent) {
  setAccessibleName(tr("Token timeline"));
  setSizePolicy(QSizePolicy::Expanding, QSizePolicy::Expanding);
}

void ServingTimelineWidget::setRow(const ServingRow& row, double spanMs) {
  m_model = timelineModel(row);
  m_spanMs = spanMs > 0 ? spanMs : m_model.endMs;
  updateGeometry();
  update();
}

void ServingTimelineWidget::clear() {
  m_model = {};
  m_spanMs = 0;
  updateGeometry();
  update();
}

QRectF ServingTimelineWidget::plotRect() const {
  return QRectF(kLabelWidth, kTopMargin, std::max(1, width() - kLabelWidth - kRightMargin),
                std::max(1, height() - kTopMargin - kAxisHeight));
}

QSize ServingTimelineWidget::minimumSizeHint() const {
  const int lanes = std::max<int>(1, static_cast<int>(m_model.lanes.size()));
  return {kLabelWidth + 200, kTopMargin + kAxisHeight + lanes * 10};
}

QSize ServingTimelineWidget::sizeHint() const {
  const int lanes = std::max<int>(1, static_cast<int>(m_model.lanes.size()));
  return {kLabelWidth + 700, kTopMargin + kAxisHeight + lanes * kLaneHeight};
}

void ServingTimelineWidget::paintEvent(QPaintEvent*) {
  QPainter p(this);
  const QPalette& pal = palette();
  p.fillRect(rect(), pal.base());
  const QRectF plot = plotRect();
  if (m_model.lanes.empty()) {
    p.setPen(pal.placeholderText().color());
    p.drawText(rect(), Qt::AlignCenter, tr("Run the benchmark or open a saved run to see its tokens."));
    return;
  }
  const std::vector<LaidOutLane> lanes = layoutTimeline(m_model, plot, m_spanMs);
  const QColor band(230, 140, 30);
  const QColor stall(200, 30, 50);
  // The long prefills, faintly across every lane: the chat gaps line up under them.
  for (const LaidOutLane& l : lanes)
    for (const QRectF& b : l.bands) p.fillRect(QRectF(b.left(), plot.top(), b.width(), plot.height()), QColor(230, 140, 30, 40));
  QColor tick = pal.text().color();
  for (size_t i = 0; i < lanes.size(); i++) {
    const LaidOutLane& l = lanes[i];
    const TimelineLane& lane = m_model.lanes[i];
    if (i % 2 == 1) p.fillRect(l.rect, QColor(128, 128, 128, 18));
    p.setPen(pal.text().color());
    p.drawText(QRectF(2, l.rect.top(), kLabelWidth - 6, l.rect.height()), Qt::AlignRight | Qt::AlignVCenter, lane.label);
    for (const QRectF& b : l.bands) p.fillRect(b, band);
    if (l.stall.width() > 0) p.fillRect(l.stall, stall);
    p.setPen(QPen(tick, 1));
    const double top = l.rect.top() + l.rect.height() * 0.2, bottom = l.rect.bottom() - l.rect.height() * 0.2;
    for (double x : l.tickX) p.drawLine(QPointF(x, top), QPointF(x, bottom));
  }
  // The time axis, in seconds on 1-2-5 steps.
  const double span = m_spanMs > 0 ? m_spanMs : m_model.endMs;
  const NiceScale s = niceScale(0, span / 1000.0, std::max(2, static_cast<int>(plot.width() / 70)));
  p.setPen(pal.text().color());
  p.drawLine(plot.bottomLeft(), plot.bottomRight());
  for (double v : tickValues(s)) {
    if (v * 1000.0 > span + 1e-6) break;
    const double x = plot.left() + v * 1000.0 / span * plot.width();
    p.drawLine(QPointF(x, plot.bottom()), QPointF(x, plot.bottom() + 4));
    const QString label = QString::number(v, 'f', s.decimals) + (v == 0 ? QStringLiteral(" s") : QString());
    p.drawText(QRectF(x - 40, plot.bottom() + 4, 80, kAxisHeight - 4), Qt::AlignHCenter | Qt::AlignTop, label);
  }
}

}  // namespace phaselab::ui
