#include "phase_meter.h"

#include <QGridLayout>
#include <QLabel>
#include <QProgressBar>

namespace phaselab::ui {

PhaseMeter::PhaseMeter(QWidget* parent) : QWidget(parent) {
  auto* grid = new QGridLayout(this);
  grid->setContentsMargins(0, 0, 0, 0);
  auto makeBar = [] {
    auto* b = new QProgressBar;
    b->setRange(0, 100);
    b->setValue(0);
    b->setFormat(QStringLiteral("%p%"));
    return b;
  };
  m_decodeBar = makeBar();
  m_prefillBar = makeBar();
  m_decodeText = new QLabel;
  m_prefillText = new QLabel;
  m_decodeText->setWordWrap(true);
  m_prefillText->setWordWrap(true);
  grid->addWidget(new QLabel(tr("Decode: memory")), 0, 0);
  grid->addWidget(m_decodeBar, 0, 1);
  grid->addWidget(m_decodeText, 1, 0, 1, 2);
  grid->addWidget(new QLabel(tr("Prefill: compute")), 2, 0);
  grid->addWidget(m_prefillBar, 2, 1);
  grid->addWidget(m_prefillText, 3, 0, 1, 2);
  m_decodeBar->setToolTip(tr("Achieved bandwidth = weight bytes per token x decode tokens/s, over the measured "
                             "memory bandwidth (all cores summing a 256 MiB buffer)."));
  m_prefillBar->setToolTip(tr("Achieved compute = 2 x parameters FLOPs per token x prefill tokens/s, over the "
                              "measured FP32 FMA peak (all cores). The engine's int8 dot products can run above "
                              "the FP32 figure."));
  refresh();
}

void PhaseMeter::setPeaks(const HardwarePeaks& peaks) {
  m_peaks = peaks;
  refresh();
}

void PhaseMeter::setModel(quint64 weightBytes, double prefillOpsPerToken, bool int8Compute) {
  m_weightBytes = weightBytes;
  m_prefillOpsPerToken = prefillOpsPerToken;
  m_int8 = int8Compute;
  m_decodeTps = m_prefillTps = 0;
  refresh();
}

void PhaseMeter::update(const LiveMetrics& m) {
  if (m.prefillTps > 0) m_prefillTps = m.prefillTps;
  const double tps = m.phase == QLatin1String("done") ? m.decodeTps : (m.windowTps > 0 ? m.windowTps : m.decodeTps);
  if (tps > 0) m_decodeTps = tps;
  refresh();
}

void PhaseMeter::refresh() {
  const double bw = static_cast<double>(m_weightBytes) * m_decodeTps;  // bytes/s
  const double flops = m_prefillOpsPerToken * m_prefillTps;
  // The integer peak where the backend multiplies in 8 bits and it was
  // measured (older cached probes lack it), else the FP32 peak.
  const bool int8 = m_int8 && m_peaks.peakInt8Ops > 0;
  const double peak = int8 ? m_peaks.peakInt8Ops : m_peaks.peakFlops;
  m_decodeFraction = m_peaks.memoryBandwidth > 0 ? bw / m_peaks.memoryBandwidth : 0;
  m_prefillFraction = peak > 0 ? flops / peak : 0;
  m_decodeBar->setValue(std::min(100, static_cast<int>(m_decodeFraction * 100 + 0.5)));
  m_prefillBar->setValue(std::min(100, static_cast<int>(m_prefillFraction * 100 + 0.5)));
  if (!m_peaks.valid()) {
    m_decodeText->setText(tr("Measuring this machine's memory bandwidth and compute peak…"));
    m_prefillText->clear();
    return;
  }
  QString dec = tr("%1 GB/s of %2 GB/s. Decode is memory-bound: every token reads all %3 MiB of weights "
                   "once and does only ~2 FLOPs per weight.")
                    .arg(bw / 1e9, 0, 'f', 1)
                    .arg(m_peaks.memoryBandwidth / 1e9, 0, 'f', 1)
                    .arg(static_cast<double>(m_weightBytes) / (1 << 20), 0, 'f', 1);
  if (m_decodeFraction > 1) dec += tr(" (Above 100%: the weights fit in the CPU caches.)");
  m_decodeText->setText(dec);
  QString pre = int8 ? tr("%1 GOP/s of %2 GOP/s (8-bit integer multiply-adds, 2 ops each). ")
                     : tr("%1 GFLOP/s of %2 GFLOP/s. ");
  pre = pre.arg(flops / 1e9, 0, 'f', 1).arg(peak / 1e9, 0, 'f', 0);
  pre += tr("Prefill is compute-bound: each weight row loaded serves a whole batch of prompt tokens.");
  if (m_prefillFraction > 1) pre += tr(" (Above 100%: the kernels do more per instruction than this peak counts.)");
  m_prefillText->setText(pre);
}

}  // namespace phaselab::ui
