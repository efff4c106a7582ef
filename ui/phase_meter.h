// PhaseMeter: how close each phase runs to the machine's limit. Decode reads
// every weight once per token, so its limit is memory bandwidth; prefill
// reuses each weight row for a whole batch of tokens, so its limit is compute.
#pragma once

#include <QWidget>

#include "engine_types.h"
#include "hardware_probe.h"

class QLabel;
class QProgressBar;

namespace phaselab::ui {

class PhaseMeter : public QWidget {
  Q_OBJECT
 public:
  explicit PhaseMeter(QWidget* parent = nullptr);

  void setPeaks(const HardwarePeaks& peaks);
  // prefillOpsPerToken: 2 x the multiply-adds of one prompt token.
  // int8Compute: the backend multiplies in 8-bit integers (the fast CPU
  // backend), so its compute limit is the integer peak, not the FP32 one.
  void setModel(quint64 weightBytes, double prefillOpsPerToken, bool int8Compute);
  void update(const LiveMetrics& m);

  // Fractions of the peaks (may exceed 1 when the weights fit in cache).
  double decodeFraction() const { return m_decodeFraction; }
  double prefillFraction() const { return m_prefillFraction; }

 private:
  void refresh();

  HardwarePeaks m_peaks;
  quint64 m_weightBytes = 0;
  double m_prefillOpsPerToken = 0;
  bool m_int8 = false;
  double m_decodeTps = 0, m_prefillTps = 0;
  double m_decodeFraction = 0, m_prefillFraction = 0;
  QProgressBar* m_decodeBar = nullptr;
  QProgressBar* m_prefillBar = nullptr;
  QLabel* m_decodeText = nullptr;
  QLabel* m_prefillText = nullptr;
};

}  // namespace phaselab::ui
