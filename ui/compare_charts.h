// The Compare window's chart look, shared by its model comparison and its
// batch sweep, so that both tabs read alike, and the comparison's charts.
#pragma once

#include <QList>
#include <QPair>
#include <QStringList>
#include <vector>

#include "phaselab/compare.h"

class QChart;
class QChartView;
class QString;
class QValueAxis;

namespace phaselab::ui {

// A view of chart with its title, the legend below and small margins.
QChartView* compareChartView(QChart* chart, const QString& title);

// Removes the series and axes, before the chart is filled again.
void clearChart(QChart* chart);

// Bars of one or more value sets per category on a 1-2-5 value axis of this
// chart's own (prefill and decode each get a chart: decode's tens of tokens/s
// were a few pixels tall under prefill's thousands).
void fillBars(QChart* chart, const QStringList& categories, const QList<QPair<QString, QList<double>>>& sets,
              const QString& unit);

// Decode tokens/s against KL divergence, a point per row sized by its peak
// memory. Both axes reach a little past their first and last ticks, so that
// a point on an edge (the reference at KL 0) is drawn whole.
void fillSpeedQuality(QChart* chart, const std::vector<CompareRow>& rows);

// Acceptance as a speculative draft of the first row (percent) against KL
// divergence from it, for every other row: greedy (top-1 agreement, a
// circle) and sampled (sum of min(p, q), a square) on the evaluation text,
// and measured while decoding (a star) for the rows run as drafts. A row's
// marks share its colour and one legend entry.
void fillAcceptance(QChart* chart, const std::vector<CompareRow>& rows);

// The fraction of an axis's span added beyond its ticks on each side.
inline constexpr double kScatterPadding = 0.08;

}  // namespace phaselab::ui
