// The Compare window's chart look, shared by its model comparison and its
// batch sweep, so that both tabs read alike.
#pragma once

class QChart;
class QChartView;
class QString;

namespace phaselab::ui {

// A view of chart with its title, the legend below and small margins.
QChartView* compareChartView(QChart* chart, const QString& title);

// Removes the series and axes, before the chart is filled again.
void clearChart(QChart* chart);

}  // namespace phaselab::ui
