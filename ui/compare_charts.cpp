#include "compare_charts.h"

#include <QChart>
#include <QChartView>

namespace phaselab::ui {

QChartView* compareChartView(QChart* chart, const QString& title) {
  chart->setTitle(title);
  chart->legend()->setAlignment(Qt::AlignBottom);
  chart->setMargins(QMargins(4, 4, 4, 4));
  auto* view = new QChartView(chart);
  view->setRenderHint(QPainter::Antialiasing);
  view->setAccessibleName(title);
  view->setMinimumHeight(200);
  return view;
}

void clearChart(QChart* chart) {
  chart->removeAllSeries();
  for (QAbstractAxis* a : chart->axes()) {
    chart->removeAxis(a);
    delete a;
  }
}

}  // namespace phaselab::ui
