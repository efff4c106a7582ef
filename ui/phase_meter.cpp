#include "phase_meter.h"

#include <QGridLayout>
#include <QLabel>
#include <QProgressBar>
#include <QPushButton>

#include <algorithm>
#include <cmath>

#include "phaselab/metrics.h"

namespace phaselab::ui {

namespace {
double mib(double bytes) { return bytes / (1 << 20); }
}  // namespace

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
  m_decodeText->setObjectName(QStringLiteral("decodeText"));
  m_prefillText->setObjectName(QStringLiteral("prefillText"));
  m_decodeText->setWordWrap(true);
  m_prefillText->setWordWrap(true);
  m_decodeTitle = new QLabel(tr("Decode: memory"));
  m_remeasure = new QPushButton(tr("Measure again"));
  m_remeasure->setObjectName(QStringLiteral("remeasureButton"));
  m_remeasure->setToolTip(tr("Measure this machine's memory bandwidth and compute peaks again (about a second; "
                             "best while no model is generating)."));
  connect(m_remeasure, &QPushButton::clicked, this, &PhaseMeter::remeasureRequested);
  grid->addWidget(m_decodeTitle, 0, 0);
  grid->addWidget(m_decodeBar, 0, 1);
  grid->addWidget(m_decodeText, 1, 0, 1, 2);
  m_prefillTitle = new QLabel(tr("Prefill: compute"));
  grid->addWidget(m_prefillTitle, 2, 0);
  grid->addWidget(m_prefillBar, 2, 1);
  grid->addWidget(m_prefillText, 3, 0, 1, 2);
  grid->addWidget(m_remeasure, 4, 1, Qt::AlignRight);
  refresh();
}

QString PhaseMeter::decodeText() const { return m_decodeText->text(); }
QString PhaseMeter::prefillText() const { return m_prefillText->text(); }

void PhaseMeter::setPeaks(const HardwarePeaks& peaks) {
  m_peaks = peaks;
  m_measuring = false;
  refresh();
}

void PhaseMeter::setMeasuring(bool measuring) {
  m_measuring = measuring;
  refresh();
}

QString PhaseMeter::remoteNote() {
  return tr("Remote server: client-side figures only (no prefill/KV/device data).");
}

void PhaseMeter::setRemote(bool remote) {
  m_remote = remote;
  m_decodeTps = m_prefillTps = 0;
  refresh();
}

void PhaseMeter::setModel(quint64 weightBytes, double prefillOpsPerToken, bool int8Compute, int maxPassTokens) {
  m_weightBytes = weightBytes;
  m_prefillOpsPerToken = prefillOpsPerToken;
  m_int8 = int8Compute;
  m_maxPassTokens = maxPassTokens;
  m_decodeTps = m_prefillTps = 0;
  m_tokensPerPass = 1;
  m_speculative.clear();
  m_prefillTokens = 0;
  m_kvCache = true;
  m_positions = 0;
  refresh();
}

void PhaseMeter::update(const LiveMetrics& m) {
  if (m.prefillTps > 0) {
    m_prefillTps = m.prefillTps;
    m_prefillTokens = std::max(0, m.nPrompt - m.nReused);  // the engine's rate counts these
  }
  const bool done = m.phase == Phase::done;
  const double tps = done ? m.decodeTps : (m.windowTps > 0 ? m.windowTps : m.decodeTps);
  if (tps > 0) m_decodeTps = tps;
  // The weights are read once per target pass: with speculative decoding a
  // pass yields several tokens (the engine counts them).
  m_tokensPerPass = std::max(1.0, m.tokensPerPass);
  m_speculative = m.speculative;
  m_kvCache = m.kvCache;
  // Without the cache each step recomputes the sequence (the engine counts them).
  m_positions = recomputed_positions(m.nPrompt, m.nGenerated, done);
  refresh();
}

void PhaseMeter::refreshToolTips() {
  // (No translations are loaded, so %n's "core(s)" would show as written.)
  const int threads = std::max(m_peaks.threads, 1);
  const QString cores = threads == 1 ? tr("1 physical core") : tr("%1 physical cores").arg(threads);
  const QString how = m_peaks.runs > 0
                          ? tr("%1, each reading its own slice of a %2 MiB buffer with SIMD loads, best of %3 passes%4")
                                .arg(cores)
                                .arg(mib(static_cast<double>(m_peaks.bufferBytes)), 0, 'f', 0)
                                .arg(m_peaks.runs)
                                .arg(m_peaks.pastCache && m_peaks.llcBytes > 0
                                         ? tr("; the buffer is at least 4x the %1 MiB last-level cache, so the "
                                              "figure is memory's, not the cache's")
                                               .arg(mib(static_cast<double>(m_peaks.llcBytes)), 0, 'f', 0)
                                         : QString())
                          : tr("all physical cores reading a large buffer with SIMD loads, best of several passes");
  const QString compute = tr("%1 running independent FMA chains, best of 5 short runs").arg(cores);
  if (m_kvCache)
    m_decodeBar->setToolTip(tr("Achieved bandwidth = weight bytes x target passes/s (decode tokens/s over the tokens "
                               "each pass yields: 1, or more with speculative decoding), over the measured memory "
                               "read bandwidth (%1).").arg(how));
  else
    m_decodeBar->setToolTip(tr("The KV cache is off: each token recomputes every position, so achieved compute = "
                               "2 x parameters ops per position x positions x tokens/s, over the measured compute "
                               "peak (%1).").arg(compute));
  m_prefillBar->setToolTip(
      tr("A prefill pass reads every weight once and computes all its tokens, so it takes at least the longer of "
         "weight bytes / read bandwidth and tokens x 2 x parameters ops / compute peak. Passes with fewer tokens "
         "than the machine balance are held against the read bandwidth (weight bytes x passes/s), longer ones "
         "against the compute peak: 8-bit integer multiply-adds where the backend multiplies in int8, else FP32 "
         "FMAs (%1; bandwidth: %2).").arg(compute, how));
}

// Shown only beside a figure divided by the read bandwidth.
QString PhaseMeter::bandwidthNote() const {
  return !m_peaks.pastCache && !m_peaks.note.isEmpty() ? tr(" (%1.)").arg(m_peaks.note) : QString();
}

void PhaseMeter::refresh() {
  // The engine divides (phaselab/metrics.h); the meter shows the results.
  const ComputePeak compute = int8_or_fp32_peak(m_int8, m_peaks.peakInt8Ops, m_peaks.peakFlops);
  const PhaseLoad decode =
      m_kvCache ? decode_load(static_cast<double>(m_weightBytes), m_decodeTps, m_tokensPerPass, m_peaks.memoryBandwidth)
                : recompute_load(m_prefillOpsPerToken, m_positions, m_decodeTps, compute);
  PrefillRun run;
  run.ops_per_token = m_prefillOpsPerToken;
  run.weight_bytes = static_cast<double>(m_weightBytes);
  run.n_tokens = m_prefillTokens;
  run.max_pass_tokens = m_maxPassTokens;
  run.tokens_per_s = m_prefillTps;
  const PhaseLoad prefill = prefill_load(run, compute, m_peaks.memoryBandwidth);
  m_decodeFraction = decode.fraction;
  m_prefillFraction = prefill.fraction;
  m_prefillCompute = prefill.compute;
  m_decodeBar->setValue(std::min(100, static_cast<int>(m_decodeFraction * 100 + 0.5)));
  m_prefillBar->setValue(std::min(100, static_cast<int>(m_prefillFraction * 100 + 0.5)));
  m_decodeTitle->setText(m_remote ? tr("Decode") : m_kvCache ? tr("Decode: memory") : tr("Decode: compute"));
  // Which bound applies is known once a prefill was measured.
  m_prefillTitle->setText(m_remote || m_prefillTps <= 0 ? tr("Prefill")
                          : prefill.compute         ? tr("Prefill: compute")
                                                    : tr("Prefill: memory"));
  m_remeasure->setEnabled(!m_measuring);
  refreshToolTips();
  m_decodeBar->setEnabled(!m_remote);
  m_prefillBar->setEnabled(!m_remote);
  if (m_remote) {
    // Bars at 0% would read as measured: empty bars with a dash instead.
    m_decodeFraction = m_prefillFraction = 0;
    for (QProgressBar* b : {m_decodeBar, m_prefillBar}) {
      b->setValue(0);
      b->setFormat(QStringLiteral("—"));
      b->setToolTip(remoteNote());
    }
    m_decodeText->setText(remoteNote() + QLatin1Char(' ') +
                          (m_decodeTps > 0 ? tr("Decode: %1 tokens/s as received here.").arg(m_decodeTps, 0, 'f', 1)
                                           : tr("Decode tokens/s are counted as the text arrives here (not measurable "
                                                "when the tokens arrive together).")));
    m_prefillText->setText(tr("The server's prefill is not visible from here: time to first token includes it and "
                              "the network."));
    return;
  }
  if (!m_measuring && m_peaks.valid() && !m_peaks.plausible) {
    // A doubtful peak is never divided by: a percentage of it would look
    // measured and be wrong (a cached 6.2 GB/s behind a 480 MiB cache once
    // showed decode at "100%").
    m_decodeFraction = m_prefillFraction = 0;
    for (QProgressBar* b : {m_decodeBar, m_prefillBar}) {
      b->setValue(0);
      b->setFormat(QStringLiteral("—"));
    }
    m_decodeText->setText(tr("The last measurement of this machine looked doubtful (%1), so no percentage is shown. "
                             "Press \"Measure again\" while no model is generating.")
                              .arg(m_peaks.note));
    m_prefillText->clear();
    return;
  }
  for (QProgressBar* b : {m_decodeBar, m_prefillBar}) b->setFormat(QStringLiteral("%p%"));
  if (m_measuring || !m_peaks.valid()) {
    m_decodeText->setText(m_measuring ? tr("Measuring this machine's memory bandwidth and compute peaks…")
                                      : tr("This machine's memory bandwidth and compute peaks are not measured yet."));
    m_prefillText->clear();
    return;
  }
  // A model just loaded has run nothing: "0.0 GB/s" and 0% would read as
  // measured. Each phase says so until a request has measured it.
  // The peak it will be held against is shown meanwhile.
  const QString waiting = tr("No request has run on this model yet: the figure comes with the first answer.");
  const ComputePeak peak = int8_or_fp32_peak(m_int8, m_peaks.peakInt8Ops, m_peaks.peakFlops);
  m_decodeBar->setFormat(m_decodeTps > 0 ? QStringLiteral("%p%") : QStringLiteral("—"));
  m_prefillBar->setFormat(m_prefillTps > 0 ? QStringLiteral("%p%") : QStringLiteral("—"));
  m_decodeText->setText(m_decodeTps > 0 ? decodeDescription(decode)
                                        : waiting + tr(" This machine reads %1 GB/s from memory.")
                                                        .arg(m_peaks.memoryBandwidth / 1e9, 0, 'f', 1));
  m_prefillText->setText(m_prefillTps > 0 ? prefillDescription(prefill)
                                          : waiting + tr(" Its compute peak: %1 %2.")
                                                          .arg(peak.ops_per_s / 1e9, 0, 'f', 0)
                                                          .arg(peak.int8 ? tr("GOP/s") : tr("GFLOP/s")));
}

QString PhaseMeter::decodeDescription(const PhaseLoad& decode) const {
  if (!m_kvCache) {
    const ComputePeak compute = int8_or_fp32_peak(m_int8, m_peaks.peakInt8Ops, m_peaks.peakFlops);
    // Divided by the compute peak: a note about the bandwidth test has no place here.
    return tr("Without the KV cache every token recomputes all %1 positions: decode is compute-bound. %2 %4 of %3 %4.")
        .arg(static_cast<int>(m_positions + 0.5))
        .arg(decode.achieved / 1e9, 0, 'f', 1)
        .arg(compute.ops_per_s / 1e9, 0, 'f', 0)
        .arg(compute.int8 ? tr("GOP/s") : tr("GFLOP/s"));
  }
  const double weightMiB = mib(static_cast<double>(m_weightBytes));
  const double llcMiB = mib(static_cast<double>(m_peaks.llcBytes));
  const bool fitsInCache = m_peaks.llcBytes > 0 && m_weightBytes <= m_peaks.llcBytes;
  // The meter divides by the memory (DRAM) figure: weights are read once
  // per target pass, and what a cache keeps of them between passes depends
  // on everything else the machine runs. The cache's figure is shown beside
  // it where the weights fit.
  QString dec = tr("%1 GB/s of %2 GB/s read from memory. ")
                    .arg(decode.achieved / 1e9, 0, 'f', 1)
                    .arg(m_peaks.memoryBandwidth / 1e9, 0, 'f', 1);
  if (decode.tokens_per_pass > 1.005)
    dec += tr("Per target pass: %1 tokens per pass (%2), so %3 tokens/s read the weights %4 times a second. Decode is "
              "memory-bound: every pass reads all %5 MiB of weights once, whatever it yields.")
               .arg(decode.tokens_per_pass, 0, 'f', 2)
               .arg(m_speculative.isEmpty() ? tr("speculative decoding") : m_speculative)
               .arg(m_decodeTps, 0, 'f', 1)
               .arg(target_passes_per_s(m_decodeTps, decode.tokens_per_pass), 0, 'f', 1)
               .arg(weightMiB, 0, 'f', 1);
  else if (m_experts > 0)
    dec += tr("Decode is memory-bound: every token reads %1 MiB of weights once (the router picks %2 of %3 experts in "
              "each layer: only theirs are read) and does only ~2 FLOPs per weight.")
               .arg(weightMiB, 0, 'f', 1)
               .arg(m_expertsUsed)
               .arg(m_experts);
  else
    dec += tr("Decode is memory-bound: every token reads all %1 MiB of weights once and does only ~2 FLOPs per weight.")
               .arg(weightMiB, 0, 'f', 1);
  if (fitsInCache && m_peaks.llcBandwidth > 0)
    dec += tr(" The weights fit in the %1 MiB last-level cache, which reads %2 GB/s: decode is %3% of that.")
               .arg(llcMiB, 0, 'f', 0)
               .arg(m_peaks.llcBandwidth / 1e9, 0, 'f', 1)
               .arg(100 * decode_load(static_cast<double>(m_weightBytes), m_decodeTps, m_tokensPerPass,
                                      m_peaks.llcBandwidth).fraction,
                    0, 'f', 0);
  if (decode.fraction > 1) {
    // Counted per target pass, more than the measured bandwidth is either
    // the cache serving weights that fit in it, or a peak measured low.
    if (fitsInCache)
      dec += tr(" Above 100%: the weights fit in the %1 MiB last-level cache, which serves part of them.").arg(llcMiB, 0, 'f', 0);
    else if (m_peaks.llcBytes > 0)
      dec += tr(" Above 100%, yet the %1 MiB of weights are larger than the %2 MiB last-level cache and are read "
                "from memory: the measured peak looks too low (the machine was probably busy while it was "
                "measured). Press \"Measure again\" while no model is generating.")
                 .arg(weightMiB, 0, 'f', 1)
                 .arg(llcMiB, 0, 'f', 0);
    else
      dec += tr(" Above 100%: the measured peak looks too low (the machine was probably busy while it was "
                "measured). Press \"Measure again\" while no model is generating.");
  }
  return dec + bandwidthNote();
}

QString PhaseMeter::prefillDescription(const PhaseLoad& prefill) const {
  if (m_prefillTps <= 0) return tr("No prompt has been prefilled yet.");
  const int n = m_prefillTokens;
  const long balance = std::lround(prefill.balance_tokens);
  const bool severalPasses = m_maxPassTokens > 0 && n > m_maxPassTokens;
  // Where the balance is past the longest pass, no prompt reaches the compute peak.
  const bool balanceReachable = m_maxPassTokens <= 0 || prefill.balance_tokens <= m_maxPassTokens;
  if (!prefill.compute) {
    QString pre = severalPasses
                      ? tr("The %1-token prompt is memory-bound here: it ran in passes of ~%2 tokens, each reading all "
                           "%3 MiB of weights (%4 GB/s of %5 GB/s).")
                            .arg(n)
                            .arg(prefill.tokens_per_pass, 0, 'f', 0)
                            .arg(mib(static_cast<double>(m_weightBytes)), 0, 'f', 1)
                      : tr("The %1-token prompt is memory-bound here: it reads all %2 MiB of weights for %1 tokens "
                           "(%3 GB/s of %4 GB/s).")
                            .arg(n)
                            .arg(mib(static_cast<double>(m_weightBytes)), 0, 'f', 1);
    pre = pre.arg(prefill.achieved / 1e9, 0, 'f', 1).arg(prefill.peak / 1e9, 0, 'f', 1);
    pre += balanceReachable ? tr(" Prompts longer than ~%1 tokens are compute-bound.").arg(balance)
                            : tr(" A pass turns compute-bound at ~%1 tokens, more than the %2 a pass takes here.")
                                  .arg(balance)
                                  .arg(m_maxPassTokens);
    return pre + bandwidthNote();
  }
  const ComputePeak compute = int8_or_fp32_peak(m_int8, m_peaks.peakInt8Ops, m_peaks.peakFlops);
  QString pre = compute.int8 ? tr("%1 GOP/s of %2 GOP/s (8-bit integer multiply-adds, 2 ops each). ")
                             : tr("%1 GFLOP/s of %2 GFLOP/s. ");
  pre = pre.arg(prefill.achieved / 1e9, 0, 'f', 1).arg(prefill.peak / 1e9, 0, 'f', 0);
  if (balance > 0)
    pre += tr("Prefill is compute-bound here: each pass of ~%1 tokens reuses every weight row it loads for all of "
              "them (passes under ~%2 tokens are memory-bound).")
               .arg(prefill.tokens_per_pass, 0, 'f', 0)
               .arg(balance);
  else
    pre += tr("Prefill is compute-bound: each weight row loaded serves a whole batch of prompt tokens.");
  if (prefill.fraction > 1) pre += tr(" (Above 100%: the kernels do more per instruction than this peak counts.)");
  return pre;
}

}  // namespace phaselab::ui
