#include "serving_charts.h"

#include <QChart>
#include <QLineSeries>
#include <QLogValueAxis>
#include <QValueAxis>
#include <algorithm>
#include <cmath>

#include "chart_scale.h"
#include "compare_charts.h"

namespace phaselab::ui {

std::vector<double> chatGapsMs(const ServingRow& row) {
  std::vector<double> out;
  for (const ServingRequestTrace& t : row.timeline)
    if (!t.isLong)
      for (size_t i = 1; i < t.tokenMs.size(); i++) out.push_back(t.tokenMs[i] - t.tokenMs[i - 1]);
  return out;
}

std::vector<double> ttftsMs(const ServingRow& row) {
  std::vector<double> out;
  for (const ServingRequestTrace& t : row.timeline)
    if (t.ok && (!t.tokenMs.empty() || t.firstTokenMs > 0)) {
      const double first = t.tokenMs.empty() ? t.firstTokenMs : t.tokenMs.front();
      out.push_back(std::max(0.0, first - t.arriveMs));
    }
  return out;
}

QList<QPointF> cdfPoints(std::vector<double> values, int maxPoints) {
  QList<QPointF> out;
  if (values.empty()) return out;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  const size_t step = std::max<size_t>(1, n / static_cast<size_t>(std::max(2, maxPoints / 2)));
  double below = 0;  // the fraction before this value
  for (size_t i = 0; i < n; i += step) {
    const size_t last = std::min(n, i + step) - 1;
    out << QPointF(values[i], below) << QPointF(values[last], static_cast<double>(last + 1) / static_cast<double>(n));
    below = static_cast<double>(last + 1) / static_cast<double>(n);
  }
  return out;
}

void fillCdf(QChart* chart, const QList<QPair<QString, std::vector<double>>>& series, const QString& axisTitle) {
  clearChart(chart);
  double lo = INFINITY, hi = 0;
  for (const auto& [name, values] : series)
    for (double v : values) {
      if (v > 0) lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  if (!(hi > 0)) return;
  const bool log = lo > 0 && hi / lo > 10;
  QAbstractAxis* x;
  if (log) {
    auto* lx = new QLogValueAxis;
    lx->setBase(10);
    lx->setLabelFormat(QStringLiteral("%g"));
    lx->setMinorTickCount(-1);
    lx->setRange(std::pow(10, std::floor(std::log10(lo))), std::pow(10, std::ceil(std::log10(hi))));
    x = lx;
  } else {
    auto* vx = new QValueAxis;
    applyScale(vx, niceScale(0, hi, 6));
    x = vx;
  }
  x->setTitleText(axisTitle + (log ? QObject::tr(" (log)") : QString()));
  auto* y = new QValueAxis;
  applyScale(y, niceScale(0, 1, 6));
  y->setTitleText(QObject::tr("fraction ≤ x"));
  chart->addAxis(x, Qt::AlignBottom);
  chart->addAxis(y, Qt::AlignLeft);
  for (const auto& [name, values] : series) {
    auto* s = new QLineSeries;
    s->setName(name);
    QList<QPointF> pts = cdfPoints(values);
    if (log)
      for (QPointF& p : pts) p.setX(std::max(p.x(), lo));  // a 0 has no place on a log axis
    s->replace(pts);
    chart->addSeries(s);
    s->attachAxis(x);
    s->attachAxis(y);
  }
}

}  // namespace phaselab::ui
