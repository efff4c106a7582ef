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
    for (double t : lane.requestStartsMs) l.arrivalX.push_back(x(t));
    for (const auto& [from, to] : lane.prefillMs)
      l.bands.emplace_back(QPointF(x(from), l.rect.top() + laneH * 0.15), QPointF(x(to), l.rect.bottom() - laneH * 0.15));
    if (lane.stallToMs > lane.stallFromMs)
      l.stall = QRectF(QPointF(x(lane.stallFromMs), l.rect.top() + laneH * 0.42),
                       QPointF(x(lane.stallToMs), l.rect.bottom() - laneH * 0.42));
    out.push_back(std::move(l));
  }
  return out;
}

ServingTimelineWidget::ServingTimelineWidget(QWidget* parent) : QWidget(parent) {
  setAccessibleName(tr("Token timeline"));
  setSizePolicy(QSizePolicy::Expanding, QSizePolicy::Expanding);
}

void ServingTimelineWidget::setRow(const ServingRow& row, double spanMs) { setRows({{QString(), &row}}, spanMs); }

void ServingTimelineWidget::setRows(const std::vector<std::pair<QString, const ServingRow*>>& rows, double spanMs) {
  m_groups.clear();
  double end = 0;
  for (const auto& [title, row] : rows) {
    m_groups.push_back({title, timelineModel(*row)});
    end = std::max(end, m_groups.back().model.endMs);
  }
  m_spanMs = spanMs > 0 ? spanMs : end;
  updateGeometry();
  update();
}

void ServingTimelineWidget::clear() {
  m_groups.clear();
  m_spanMs = 0;
  updateGeometry();
  update();
}

const TimelineModel& ServingTimelineWidget::model() const {
  static const TimelineModel empty;
  return m_groups.empty() ? empty : m_groups.front().model;
}

int ServingTimelineWidget::laneCount() const {
  int n = 0;
  for (const TimelineGroup& g : m_groups) n += static_cast<int>(g.model.lanes.size());
  return std::max(1, n);
}

int ServingTimelineWidget::titledGroups() const {
  return static_cast<int>(std::count_if(m_groups.begin(), m_groups.end(), [](const TimelineGroup& g) { return !g.title.isEmpty(); }));
}

QRectF ServingTimelineWidget::plotRect() const {
  return QRectF(kLabelWidth, kTopMargin, std::max(1, width() - kLabelWidth - kRightMargin),
                std::max(1, height() - kTopMargin - kAxisHeight));
}

QRectF ServingTimelineWidget::groupRect(int i) const {
  const QRectF plot = plotRect();
  const double titleH = fontMetrics().height() + 2;
  const double laneH = std::max(1.0, (plot.height() - titleH * titledGroups()) / laneCount());
  double y = plot.top();
  for (int g = 0; g < static_cast<int>(m_groups.size()); g++) {
    if (!m_groups[static_cast<size_t>(g)].title.isEmpty()) y += titleH;
    const double h = laneH * static_cast<double>(m_groups[static_cast<size_t>(g)].model.lanes.size());
    if (g == i) return QRectF(plot.left(), y, plot.width(), h);
    y += h;
  }
  return {};
}

QSize ServingTimelineWidget::minimumSizeHint() const {
  return {kLabelWidth + 200, kTopMargin + kAxisHeight + titledGroups() * (fontMetrics().height() + 2) + laneCount() * 6};
}

QSize ServingTimelineWidget::sizeHint() const {
  return {kLabelWidth + 700, kTopMargin + kAxisHeight + titledGroups() * (fontMetrics().height() + 2) + laneCount() * kLaneHeight};
}

void ServingTimelineWidget::drawGroupLabels(QPainter& p, const TimelineModel& m, const std::vector<LaidOutLane>& lanes) const {
  QRectF chat, longs;
  int nChat = 0, nLong = 0;
  for (size_t i = 0; i < lanes.size(); i++) {
    (m.lanes[i].isLong ? longs : chat) |= lanes[i].rect;
    (m.lanes[i].isLong ? nLong : nChat)++;
  }
  p.setPen(palette().text().color());
  auto label = [&](const QRectF& r, const QString& text) {
    if (r.isEmpty()) return;
    const QRectF box(2, r.center().y() - fontMetrics().height() / 2.0, kLabelWidth - 6, fontMetrics().height());
    p.drawText(box, Qt::AlignRight | Qt::AlignVCenter, text);
  };
  label(chat, nChat > 1 ? tr("chat 1–%1").arg(nChat) : tr("chat"));
  label(longs, nLong > 1 ? tr("long 1–%1").arg(nLong) : tr("long"));
}

void ServingTimelineWidget::paintEvent(QPaintEvent*) {
  QPainter p(this);
  const QPalette& pal = palette();
  p.fillRect(rect(), pal.base());
  const QRectF plot = plotRect();
  if (m_groups.empty()) {
    p.setPen(pal.placeholderText().color());
    p.drawText(rect(), Qt::AlignCenter, tr("Run the benchmark or open a saved run to see its tokens."));
    return;
  }
  const QColor band(230, 140, 30);
  const QColor stall(200, 30, 50);
  const QColor arrival(40, 110, 220);
  const QColor tick = pal.text().color();
  for (int g = 0; g < static_cast<int>(m_groups.size()); g++) {
    const TimelineGroup& group = m_groups[static_cast<size_t>(g)];
    const QRectF area = groupRect(g);
    if (!group.title.isEmpty()) {
      QFont bold = font();
      bold.setBold(true);
      p.setFont(bold);
      p.setPen(pal.text().color());
      p.drawText(QRectF(4, area.top() - fontMetrics().height() - 2, width() - 8, fontMetrics().height() + 2),
                 Qt::AlignLeft | Qt::AlignVCenter, group.title);
      p.setFont(font());
    }
    const std::vector<LaidOutLane> lanes = layoutTimeline(group.model, area, m_spanMs);
    // The long prefills, faintly across the run's lanes: the chat gaps line up under them.
    for (const LaidOutLane& l : lanes)
      for (const QRectF& b : l.bands) p.fillRect(QRectF(b.left(), area.top(), b.width(), area.height()), QColor(230, 140, 30, 40));
    // Lanes lower than a line of text: one label for the chat lanes, one for the long ones.
    const bool labelsFit = lanes.empty() || lanes.front().rect.height() >= fontMetrics().height() - 1;
    if (!labelsFit) drawGroupLabels(p, group.model, lanes);
    for (size_t i = 0; i < lanes.size(); i++) {
      const LaidOutLane& l = lanes[i];
      const TimelineLane& lane = group.model.lanes[i];
      if (i % 2 == 1) p.fillRect(l.rect, QColor(128, 128, 128, 18));
      p.setPen(pal.text().color());
      if (labelsFit) p.drawText(QRectF(2, l.rect.top(), kLabelWidth - 6, l.rect.height()), Qt::AlignRight | Qt::AlignVCenter, lane.label);
      for (const QRectF& b : l.bands) p.fillRect(b, band);
      if (l.stall.width() > 0) p.fillRect(l.stall, stall);
      p.setPen(QPen(tick, 1));
      const double top = l.rect.top() + l.rect.height() * 0.2, bottom = l.rect.bottom() - l.rect.height() * 0.2;
      for (double x : l.tickX) p.drawLine(QPointF(x, top), QPointF(x, bottom));
      // A request's arrival: a small blue mark below its lane's ticks (the
      // space to its first token is that request's TTFT, not a stall).
      p.setPen(QPen(arrival, 2));
      for (double x : l.arrivalX) p.drawLine(QPointF(x, bottom), QPointF(x, l.rect.bottom()));
    }
  }
  // The time axis, in seconds on 1-2-5 steps.
  const double span = std::max(m_spanMs, 1.0);
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
