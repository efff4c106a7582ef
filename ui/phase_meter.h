// PhaseMeter: how close each phase runs to the machine's limit. Decode reads
// every weight once per target pass (one token, or several with speculative
// decoding), so its limit is memory bandwidth; prefill reuses each weight row
// for all the tokens of a pass, so its limit is compute once a pass has more
// tokens than the machine balance, and bandwidth below it (a short prompt).
// Without the KV cache every decode step is a prefill of the whole sequence,
// so decode is then compute-bound too, and the meter says so. The engine
// divides (phaselab/metrics.h); the meter shows what it divided by.
#pragma once

#include <QWidget>

#include "engine_types.h"
#include "hardware_probe.h"
#include "phaselab/metrics.h"

class QLabel;
class QProgressBar;
class QPushButton;

namespace phaselab::ui {

class PhaseMeter : public QWidget {
  Q_OBJECT
 public:
  explicit PhaseMeter(QWidget* parent = nullptr);

  // Also ends the measuring state (setMeasuring(false)).
  void setPeaks(const HardwarePeaks& peaks);
  // prefillOpsPerToken: 2 x the multiply-adds of one prompt token.
  // int8Compute: the backend multiplies in 8-bit integers (the fast CPU
  // backend), so its compute limit is the integer peak, not the FP32 one.
  // maxPassTokens: the backend's tokens per pass at most (ModelInfo::maxBatch):
  // a longer prompt is prefilled in several passes; 0: one pass.
  void setModel(quint64 weightBytes, double prefillOpsPerToken, bool int8Compute, int maxPassTokens = 0);
  // A mixture of experts: each token reads `used` of `total` experts per
  // layer (weightBytes counts only theirs); 0, 0: a dense model.
  void setExperts(int used, int total) {
    m_expertsUsed = used;
    m_experts = total;
  }
  void update(const LiveMetrics& m);
  // A remote server answers: there are no device figures to hold against
  // this machine's peaks, and the meter says so instead of showing 0%.
  void setRemote(bool remote);
  bool isRemote() const { return m_remote; }
  static QString remoteNote();  // "Remote server: client-side figures only (...)"
  // While true the texts say the machine is being measured and the
  // "Measure again" button is disabled.
  void setMeasuring(bool measuring);
  bool isMeasuring() const { return m_measuring; }

  // Fractions of the peaks (may exceed 1: cache hits, or a peak measured too low).
  double decodeFraction() const { return m_decodeFraction; }
  double prefillFraction() const { return m_prefillFraction; }
  // True when decode is shown against the compute peak (the KV cache is off).
  bool decodeComputeBound() const { return !m_kvCache; }
  // True when the last prefill was shown against the compute peak; false
  // when its passes were too short to reach it (memory-bound, phaselab/metrics.h).
  bool prefillComputeBound() const { return m_prefillCompute; }
  // What the bars divide by: the window's current peaks.
  const HardwarePeaks& peaks() const { return m_peaks; }
  QString decodeText() const;
  QString prefillText() const;

 signals:
  // The user pressed "Measure again": measure the peaks (off the GUI thread),
  // then setPeaks().
  void remeasureRequested();

 private:
  void refresh();
  void refreshToolTips();
  QString decodeDescription(const PhaseLoad& decode) const;
  QString prefillDescription(const PhaseLoad& prefill) const;
  QString bandwidthNote() const;

  HardwarePeaks m_peaks;
  quint64 m_weightBytes = 0;
  int m_expertsUsed = 0, m_experts = 0;
  double m_prefillOpsPerToken = 0;
  bool m_int8 = false;
  bool m_kvCache = true;
  bool m_measuring = false;
  bool m_remote = false;
  double m_positions = 0;  // tokens each decode step recomputes without the KV cache
  double m_decodeTps = 0, m_prefillTps = 0;
  double m_tokensPerPass = 1;  // decode tokens per target pass (above 1 with speculative decoding)
  QString m_speculative;       // the draft source's name, empty when off
  int m_prefillTokens = 0;     // prompt tokens the last prefill computed (reuse excluded)
  int m_maxPassTokens = 0;
  double m_decodeFraction = 0, m_prefillFraction = 0;
  bool m_prefillCompute = true;
  QLabel* m_decodeTitle = nullptr;
  QLabel* m_prefillTitle = nullptr;
  QProgressBar* m_decodeBar = nullptr;
  QProgressBar* m_prefillBar = nullptr;
  QLabel* m_decodeText = nullptr;
  QLabel* m_prefillText = nullptr;
  QPushButton* m_remeasure = nullptr;
};

}  // namespace phaselab::ui
