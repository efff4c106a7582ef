// Axis ranges a person can read: ticks on 1-2-5 steps (0, 20, 40, 60, not
// 0, 1408, 2816, 4224) and labels with just the decimals those steps need.
// Pure functions, so the tick arithmetic is tested without a chart.
#pragma once

#include <QList>
#include <QString>

class QValueAxis;

namespace phaselab::ui {

struct NiceScale {
  double min = 0, max = 1;
  double step = 0.2;  // 1, 2 or 5 x a power of ten
  int ticks = 6;      // min, min + step, ..., max
  int decimals = 1;   // digits after the point that show every tick exactly
};

// The smallest range on 1-2-5 steps that holds [lo, hi] in at most maxTicks
// ticks (at least 2). integer: steps of at least 1, for counts (turns,
// tokens). An empty span widens to lo..lo + max(|lo|, 1).
NiceScale niceScale(double lo, double hi, int maxTicks, bool integer = false);

// The tick values, each rounded to the scale's decimals (no 0.30000000000000004).
QList<double> tickValues(const NiceScale& s);

// "%.1f", "%.0f": the label format of the scale's ticks. Not "%d" for
// integer scales: Qt truncates a tick computed as 2.9999999 to "2" there.
QString labelFormat(const NiceScale& s);

// Range, fixed tick count and label format, so that the axis draws exactly
// tickValues(s).
void applyScale(QValueAxis* axis, const NiceScale& s);

}  // namespace phaselab::ui
