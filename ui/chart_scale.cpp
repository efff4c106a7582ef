#include "chart_scale.h"

#include <QSignalBlocker>
#include <QValueAxis>
#include <algorithm>
#include <cmath>

namespace phaselab::ui {

namespace {

// mantissa x 10^exponent, computed so that decimal steps stay exact to the
// last digit (0.1 x 3 is 0.3, not 0.30000000000000004).
double scaled(double mantissa, int exponent) {
  return exponent >= 0 ? mantissa * std::pow(10.0, exponent) : mantissa / std::pow(10.0, -exponent);
}

}  // namespace

NiceScale niceScale(double lo, double hi, int maxTicks, bool integer) {
  if (!std::isfinite(lo)) lo = 0;
  if (!std::isfinite(hi)) hi = lo;
  if (hi < lo) std::swap(lo, hi);
  maxTicks = std::max(2, maxTicks);
  if (hi - lo <= 0) hi = lo + std::max(std::abs(lo), 1.0);  // nothing to show yet: 0..1, 5..10
  // Start one decade below the step that would fill maxTicks, and walk up
  // the 1-2-5 ladder to the first step that fits.
  const double raw = (hi - lo) / (maxTicks - 1);
  int exponent = static_cast<int>(std::floor(std::log10(raw))) - 1;
  if (integer) exponent = std::max(exponent, 0);
  static constexpr double kMantissas[] = {1, 2, 5};
  NiceScale s;
  for (int guard = 0; guard < 64; guard++, exponent++) {
    for (double m : kMantissas) {
      const double step = scaled(m, exponent);
      // A little slack so that hi = 3 x 0.1 in floating point still lands on
      // the tick 0.3 instead of adding a fourth.
      const double eps = 1e-9;
      const double kLo = std::floor(lo / step + eps);
      double kHi = std::ceil(hi / step - eps);
      const int ticks = static_cast<int>(kHi - kLo) + 1;
      if (ticks > maxTicks) continue;
      s.step = step;
      s.min = scaled(m * kLo, exponent);
      s.max = scaled(m * kHi, exponent);
      s.ticks = ticks;
      s.decimals = std::max(0, -exponent);
      return s;
    }
  }
  return s;
}

QList<double> tickValues(const NiceScale& s) {
  QList<double> out;
  const double unit = std::pow(10.0, s.decimals);
  for (int i = 0; i < s.ticks; i++) out << std::round((s.min + i * s.step) * unit) / unit;
  return out;
}

QString labelFormat(const NiceScale& s) {
  return s.decimals == 0 ? QStringLiteral("%.0f") : QStringLiteral("%.%1f").arg(s.decimals);
}

void applyScale(QValueAxis* axis, const NiceScale& s) {
  axis->setTickType(QValueAxis::TicksFixed);
  axis->setMinorTickCount(0);
  // The axis lays its labels out when its range changes. Tick count and
  // format go in first, silently, so that this layout already uses them: in
  // the other order a streaming chart showed a frame of the new range in the
  // old tick count ("0 27 53 80").
  const bool rangeChanges = axis->min() != s.min || axis->max() != s.max;
  {
    const QSignalBlocker quiet(rangeChanges ? axis : nullptr);
    axis->setTickCount(s.ticks);
    axis->setLabelFormat(labelFormat(s));
  }
  axis->setRange(s.min, s.max);
}

}  // namespace phaselab::ui
