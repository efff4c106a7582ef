// The Serving lab's distributions: the CDF of each policy's TTFT and ITL
// (the values of the run's timelines), one line per policy, on a log time
// axis when the values span more than a decade (a 2 s stall beside 30 ms
// gaps), else a linear one.
#pragma once

#include <QList>
#include <QPair>
#include <QPointF>
#include <QString>
#include <vector>

#include "serving_result.h"

class QChart;

namespace phaselab::ui {

// Every gap between two consecutive tokens of every chat request (ms).
std::vector<double> chatGapsMs(const ServingRow& row);
// Every request's time to first token (first token - arrival, ms); chat and long.
std::vector<double> ttftsMs(const ServingRow& row);

// The points of an empirical CDF: (value, fraction <= value) as steps, at
// most maxPoints of them (evenly spaced ranks beyond that).
QList<QPointF> cdfPoints(std::vector<double> values, int maxPoints = 600);

// One CDF line per named series; unit names the x axis ("ms").
void fillCdf(QChart* chart, const QList<QPair<QString, std::vector<double>>>& series, const QString& axisTitle);

}  // namespace phaselab::ui
