#include "compare_charts.h"

#include <QBarCategoryAxis>
#include <QBarSeries>
#include <QBarSet>
#include <QChart>
#include <QChartView>
#include <QLegendMarker>
#include <QScatterSeries>
#include <QValueAxis>
#include <algorithm>

#include "chart_scale.h"

namespace phaselab::ui {

namespace {

// The ticks of s on an axis whose range reaches pad x the span beyond them:
// dynamic ticks anchored at s.min, so that the padding gets no tick label.
void applyPaddedScale(QValueAxis* axis, const NiceScale& s, double pad) {
  const double extra = (s.max - s.min) * pad;
  axis->setMinorTickCount(0);
  axis->setTickType(QValueAxis::TicksDynamic);
  axis->setTickAnchor(s.min);
  axis->setTickInterval(s.step);
  axis->setLabelFormat(labelFormat(s));
  axis->setRange(s.min - extra, s.max + extra);
}

}  // namespace

QChartView* compareChartView(QChart* chart, const QString& title) {
  chart->setTitle(title);
  chart->legend()->setAlignment(Qt::AlignBottom);
  chart->setMargins(QMargins(4, 4, 4, 4));
  auto* view = new QChartView(chart);
  view->setRenderHint(QPainter::Antialiasing);
  view->setAccessibleName(title);
  view->setMinimumHeight(150);  // with the window's other parts, it fits a 800x600 screen
  return view;
}

void clearChart(QChart* chart) {
  chart->removeAllSeries();
  for (QAbstractAxis* a : chart->axes()) {
    chart->removeAxis(a);
    delete a;
  }
}

void fillBars(QChart* chart, const QStringList& categories, const QList<QPair<QString, QList<double>>>& sets,
              const QString& unit) {
  clearChart(chart);
  auto* series = new QBarSeries;
  double max = 0;
  for (const auto& [name, values] : sets) {
    auto* set = new QBarSet(name);
    for (double v : values) {
      *set << v;
      max = std::max(max, v);
    }
    series->append(set);
  }
  series->setLabelsVisible(true);
  series->setLabelsFormat(QStringLiteral("@value"));
  series->setLabelsPrecision(4);
  chart->addSeries(series);
  auto* x = new QBarCategoryAxis;
  x->append(categories);
  auto* y = new QValueAxis;
  y->setTitleText(unit);
  applyScale(y, niceScale(0, max > 0 ? max * 1.15 : 1, 6));
  chart->addAxis(x, Qt::AlignBottom);
  chart->addAxis(y, Qt::AlignLeft);
  series->attachAxis(x);
  series->attachAxis(y);
  chart->legend()->setVisible(sets.size() > 1);
}

void fillSpeedQuality(QChart* chart, const std::vector<CompareRow>& rows) {
  // One series per variant, so each point can have its own size (peak
  // memory) and a legend entry with its name.
  clearChart(chart);
  auto* x = new QValueAxis;
  x->setTitleText(QObject::tr("KL divergence from the reference (nats)"));
  auto* y = new QValueAxis;
  y->setTitleText(QObject::tr("decode tokens/s"));
  chart->addAxis(x, Qt::AlignBottom);
  chart->addAxis(y, Qt::AlignLeft);
  double maxK = 0, maxT = 0, maxR = 1;
  for (const CompareRow& r : rows) {
    maxK = std::max(maxK, r.kld);
    maxT = std::max(maxT, r.tg);
    maxR = std::max(maxR, r.peak_rss_mib);
  }
  for (const CompareRow& r : rows) {
    auto* s = new QScatterSeries;
    s->setName(QString::fromStdString(r.name));
    s->setMarkerSize(10 + 20 * r.peak_rss_mib / maxR);
    s->append(r.kld, r.tg);
    chart->addSeries(s);
    s->attachAxis(x);
    s->attachAxis(y);
  }
  applyPaddedScale(x, niceScale(0, maxK > 0 ? maxK * 1.05 : 0.01, 6), kScatterPadding);
  applyPaddedScale(y, niceScale(0, maxT > 0 ? maxT * 1.05 : 1, 6), kScatterPadding);
  chart->legend()->setVisible(true);
}

void fillAcceptance(QChart* chart, const std::vector<CompareRow>& rows) {
  clearChart(chart);
  auto* x = new QValueAxis;
  x->setTitleText(QObject::tr("KL divergence from the first variant (nats)"));
  auto* y = new QValueAxis;
  y->setTitleText(QObject::tr("accepted %"));
  chart->addAxis(x, Qt::AlignBottom);
  chart->addAxis(y, Qt::AlignLeft);
  double maxK = 0;
  for (size_t i = 1; i < rows.size(); i++) maxK = std::max(maxK, rows[i].kld);
  // A row's marks: the first series names it in the legend, the others
  // take its colour and stay out of the legend.
  for (size_t i = 1; i < rows.size(); i++) {
    const CompareRow& r = rows[i];
    QColor colour;
    auto add = [&](QScatterSeries::MarkerShape shape, double percent, bool inLegend) {
      auto* s = new QScatterSeries;
      s->setName(QString::fromStdString(r.name));
      s->setMarkerShape(shape);
      // The circle larger, under the square: greedy and sampled acceptance
      // are often close, and both stay visible.
      s->setMarkerSize(shape == QScatterSeries::MarkerShapeStar ? 18 : shape == QScatterSeries::MarkerShapeCircle ? 17 : 9);
      s->append(r.kld, percent);
      chart->addSeries(s);
      s->attachAxis(x);
      s->attachAxis(y);
      if (!colour.isValid()) colour = s->color();
      s->setColor(colour);
      s->setBorderColor(colour.darker(130));
      if (!inLegend)
        for (QLegendMarker* m : chart->legend()->markers(s)) m->setVisible(false);
    };
    add(QScatterSeries::MarkerShapeCircle, 100 * r.top1_agree, true);
    if (r.accept_sampled >= 0) add(QScatterSeries::MarkerShapeRectangle, 100 * r.accept_sampled, false);
    if (r.draft) add(QScatterSeries::MarkerShapeStar, 100 * r.draft_acceptance, false);
  }
  applyPaddedScale(x, niceScale(0, maxK > 0 ? maxK * 1.05 : 0.01, 6), kScatterPadding);
  applyPaddedScale(y, niceScale(0, 100, 6), kScatterPadding);
  chart->legend()->setVisible(rows.size() > 1);
}

}  // namespace phaselab::ui
