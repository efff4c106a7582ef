// The phase meter's explanations follow what really happens: without the KV
// cache decode is compute-bound; weights larger than the last-level cache
// never "fit in the caches" (above 100% then means the measured peak was
// low, and the meter offers to measure again); the probe's cache is discarded
// when the method changes. With speculative decoding the bandwidth is counted
// per target pass; a short prompt's prefill is memory-bound; the batch sweep
// and the meter divide by one figure (issue 31, items 1, 2 and 5).
#include <QApplication>
#include <QLabel>
#include <QProgressBar>
#include <QRegularExpression>
#include <QPushButton>
#include <QSettings>
#include <QSignalSpy>
#include <QTemporaryDir>
#include <QTest>
#include <cmath>

#include "batch_sweep_panel.h"
#include "compare_window.h"
#include "gui_test_util.h"
#include "metrics_dock.h"
#include "phase_meter.h"
#include "phaselab/machine.h"

using namespace phaselab::ui;

namespace {

constexpr quint64 kMiB = 1 << 20;

HardwarePeaks peaks(double gbps, quint64 llc = 32 * kMiB) {
  HardwarePeaks p;
  p.memoryBandwidth = gbps * 1e9;
  p.peakFlops = 100e9;
  p.peakInt8Ops = 200e9;
  p.threads = 2;
  p.llcBytes = llc;
  p.bufferBytes = 512 * kMiB;
  p.runs = 5;
  return p;
}

LiveMetrics decoding(double tps, bool kv = true) {
  LiveMetrics m;
  m.phase = Phase::decode;
  m.nPrompt = 100;
  m.nGenerated = 20;
  m.decodeTps = tps;
  m.windowTps = tps;
  m.prefillTps = 500;
  m.kvCache = kv;
  return m;
}

}  // namespace

class TestGuiPhaseMeter : public QObject {
  Q_OBJECT
  QTemporaryDir m_dir;

 private slots:
  void initTestCase() { testing::isolate(m_dir, "test_gui_phase_meter"); }

  void decode_with_the_kv_cache_is_memory_bound() {
    PhaseMeter m;
    m.setPeaks(peaks(20));
    m.setModel(235 * kMiB, 2 * 268e6, true);
    m.update(decoding(40));
    QVERIFY(!m.decodeComputeBound());
    QVERIFY2(m.decodeText().contains(QLatin1String("memory-bound")), qPrintable(m.decodeText()));
    QVERIFY(qAbs(m.decodeFraction() - 235.0 * kMiB * 40 / 20e9) < 1e-9);
  }

  // A mixture of experts: the meter divides by the active weights (what
  // the engine reports) and says that only the chosen experts are read; a
  // dense model after it is described as dense again.
  void a_mixture_of_experts_reads_its_chosen_experts() {
    PhaseMeter m;
    m.setPeaks(peaks(20));
    m.setModel(377 * kMiB, 2 * 684e6, true);
    m.setExperts(8, 128);
    m.update(decoding(40));
    QVERIFY2(m.decodeText().contains(QLatin1String("reads 377.0 MiB of weights once (the router picks 8 of 128 experts")),
             qPrintable(m.decodeText()));
    QVERIFY(qAbs(m.decodeFraction() - 377.0 * kMiB * 40 / 20e9) < 1e-9);
    m.setModel(235 * kMiB, 2 * 268e6, true);
    m.setExperts(0, 0);
    m.update(decoding(40));
    QVERIFY2(!m.decodeText().contains(QLatin1String("experts")), qPrintable(m.decodeText()));
  }

  // A model just loaded has measured nothing: no "0.0 GB/s", no 0%.
  void a_new_model_shows_no_figures_until_a_request() {
    PhaseMeter m;
    m.setPeaks(peaks(20));
    m.setModel(235 * kMiB, 2 * 268e6, true);
    QVERIFY2(!m.decodeText().contains(QRegularExpression(QStringLiteral("(^|[^0-9])0\\.0 GB/s"))), qPrintable(m.decodeText()));
    QVERIFY2(m.decodeText().contains(QLatin1String("20.0 GB/s")), qPrintable(m.decodeText()));  // the peak it will be held against
    QVERIFY2(m.decodeText().contains(QLatin1String("No request")), qPrintable(m.decodeText()));
    QVERIFY2(m.prefillText().contains(QLatin1String("No request")), qPrintable(m.prefillText()));
    auto* bar = m.findChildren<QProgressBar*>().first();
    QCOMPARE(bar->format(), QStringLiteral("—"));
    m.update(decoding(40));
    QVERIFY(!m.decodeText().contains(QLatin1String("No request")));
    QCOMPARE(bar->format(), QStringLiteral("%p%"));
  }

  void decode_without_the_kv_cache_is_compute_bound() {
    PhaseMeter m;
    m.setPeaks(peaks(20));
    m.setModel(235 * kMiB, 2 * 268e6, true);
    m.update(decoding(4, false));
    QVERIFY(m.decodeComputeBound());
    const QString t = m.decodeText();
    QVERIFY2(t.contains(QLatin1String("compute-bound")), qPrintable(t));
    QVERIFY2(!t.contains(QLatin1String("memory-bound")), qPrintable(t));
    QVERIFY2(t.contains(QLatin1String("all 120 positions")), qPrintable(t));  // 100 prompt + 20 generated
    // Against the int8 peak (the fast CPU backend): ops per token x positions x tokens/s.
    QVERIFY(qAbs(m.decodeFraction() - 2 * 268e6 * 120 * 4 / 200e9) < 1e-9);
  }

  // The case: 9.6 GB/s "of 6.8 GB/s" with 235 MiB of weights.
  void weights_larger_than_the_cache_never_fit_in_it() {
    for (quint64 llc : {32 * kMiB, quint64{0}}) {
      PhaseMeter m;
      m.setPeaks(peaks(6.8, llc));
      m.setModel(235 * kMiB, 2 * 268e6, true);
      m.update(decoding(9.6e9 / (235.0 * kMiB)));
      QVERIFY(m.decodeFraction() > 1);
      const QString t = m.decodeText();
      QVERIFY2(!t.contains(QLatin1String("fit in")), qPrintable(t));
      QVERIFY2(t.contains(QLatin1String("looks too low")) && t.contains(QLatin1String("Measure again")), qPrintable(t));
    }
  }

  void weights_within_the_cache_may_fit_in_it() {
    PhaseMeter m;
    m.setPeaks(peaks(20));
    m.setModel(1 * kMiB, 2e6, true);
    m.update(decoding(40000));  // 42 GB/s from a 1 MiB model: cache hits
    QVERIFY(m.decodeFraction() > 1);
    QVERIFY2(m.decodeText().contains(QLatin1String("fit in the 32 MiB last-level cache")), qPrintable(m.decodeText()));
  }

  void measure_again_asks_and_shows_the_measuring_state() {
    PhaseMeter m;
    m.setPeaks(peaks(20));
    auto* button = m.findChild<QPushButton*>(QStringLiteral("remeasureButton"));
    QVERIFY(button);
    QSignalSpy asked(&m, &PhaseMeter::remeasureRequested);
    button->click();
    QCOMPARE(asked.size(), 1);
    m.setMeasuring(true);
    QVERIFY(m.isMeasuring());
    QVERIFY(!button->isEnabled());
    QVERIFY(m.decodeText().startsWith(QLatin1String("Measuring")));
    m.setPeaks(peaks(25));  // the new figures end the measuring state
    QVERIFY(!m.isMeasuring());
    QVERIFY(button->isEnabled());
    QVERIFY(m.decodeText().contains(QLatin1String("25.0 GB/s")));
  }

  void tooltips_describe_the_method() {
    PhaseMeter m;
    m.setPeaks(peaks(20));
    const auto bars = m.findChildren<QProgressBar*>();
    QCOMPARE(bars.size(), 2);
    const QString tip = bars[0]->toolTip();
    QVERIFY2(tip.contains(QLatin1String("2 physical cores")) && tip.contains(QLatin1String("512 MiB")) &&
                 tip.contains(QLatin1String("best of 5")),
             qPrintable(tip));
  }

  void a_doubtful_measurement_says_why() {
    PhaseMeter m;
    HardwarePeaks p = peaks(20);
    p.plausible = false;
    p.note = QStringLiteral("the 5 passes disagree");
    m.setPeaks(p);
    m.setModel(235 * kMiB, 2 * 268e6, true);
    m.update(decoding(40));
    QVERIFY2(m.decodeText().contains(QLatin1String("the 5 passes disagree")), qPrintable(m.decodeText()));
  }

  // A doubtful peak is never divided by: no percentage, the reason, and how
  // to measure again (a cached, doubtful 6.2 GB/s had shown decode at 100%).
  void a_doubtful_peak_shows_no_percentage() {
    PhaseMeter m;
    HardwarePeaks p = peaks(6.2, 480 * kMiB);
    p.plausible = false;
    p.note = QStringLiteral("the 512 MiB buffer is mostly cache hits");
    m.setPeaks(p);
    m.setModel(241 * kMiB, 2 * 268e6, true);
    m.update(decoding(100));
    QCOMPARE(m.decodeFraction(), 0.0);
    QCOMPARE(m.prefillFraction(), 0.0);
    for (QProgressBar* b : m.findChildren<QProgressBar*>()) QCOMPARE(b->text(), QStringLiteral("—"));
    QVERIFY2(m.decodeText().contains(QLatin1String("no percentage")) && m.decodeText().contains(p.note) &&
                 m.decodeText().contains(QLatin1String("Measure again")),
             qPrintable(m.decodeText()));
    // A good measurement brings the bars back.
    m.setPeaks(peaks(20));
    QVERIFY(m.decodeFraction() > 0);
    QVERIFY(!m.decodeText().contains(QLatin1String("no percentage")));
    QVERIFY(!HardwarePeaks(p).usable());
    QVERIFY(peaks(20).usable());
  }

  // The meter divides by memory's figure and says so; where the weights fit
  // in the last-level cache it also holds decode against the cache's figure.
  void weights_in_the_cache_are_shown_against_the_cache_figure() {
    PhaseMeter m;
    HardwarePeaks p = peaks(20, 480 * kMiB);
    p.llcBandwidth = 80e9;
    m.setPeaks(p);
    m.setModel(241 * kMiB, 2 * 268e6, true);
    m.update(decoding(100));  // 25.3 GB/s
    QVERIFY2(m.decodeText().contains(QLatin1String("of 20.0 GB/s read from memory")), qPrintable(m.decodeText()));
    QVERIFY2(m.decodeText().contains(QLatin1String("fit in the 480 MiB last-level cache, which reads 80.0 GB/s")) &&
                 m.decodeText().contains(QLatin1String("32% of that")),
             qPrintable(m.decodeText()));
    QVERIFY(m.decodeFraction() > 1);
    // Larger than the cache: no cache figure.
    m.setModel(600 * kMiB, 2 * 268e6, true);
    m.update(decoding(30));
    QVERIFY2(!m.decodeText().contains(QLatin1String("which reads")), qPrintable(m.decodeText()));
  }

  // Issue 31, item 1: prompt lookup made 3.67 tokens per target pass and the
  // meter said "25.6 GB/s of 6.2 GB/s" with the last-level cache to blame.
  // The weights are read once per pass: the same tokens/s in passes of 3.67
  // tokens read 1/3.67 of the bytes.
  void speculative_decode_is_counted_per_target_pass() {
    PhaseMeter m;
    m.setPeaks(peaks(16.4, 480 * kMiB));
    m.setModel(241 * kMiB, 2 * 100e6, true, 64);
    LiveMetrics plain = decoding(106);
    m.update(plain);
    const double onePerPass = m.decodeFraction();
    QVERIFY(onePerPass > 1);  // 25.6 GB/s: what counting tokens would show
    LiveMetrics spec = decoding(106);
    spec.speculative = QStringLiteral("prompt lookup");
    spec.specDrafted = 300;
    spec.specAccepted = 260;
    spec.tokensPerPass = 3.67;
    m.update(spec);
    QVERIFY2(qAbs(m.decodeFraction() - onePerPass / 3.67) < 1e-9, qPrintable(QString::number(m.decodeFraction())));
    const QString t = m.decodeText();
    QVERIFY2(t.contains(QLatin1String("Per target pass: 3.67 tokens per pass (prompt lookup)")), qPrintable(t));
    QVERIFY2(t.contains(QLatin1String("7.3 GB/s of 16.4 GB/s")), qPrintable(t));
    QVERIFY2(t.contains(QLatin1String("28.9 times a second")), qPrintable(t));  // 106 / 3.67 passes/s
    // Below 100% once passes are counted: no cache is blamed.
    QVERIFY2(!t.contains(QLatin1String("Above 100%")), qPrintable(t));
    QVERIFY2(!t.contains(QLatin1String("fit in the 480 MiB last-level cache, which serves")), qPrintable(t));
  }

  // Issue 31, item 5: "Prefill: compute 1%" after an 11-token prompt. A pass
  // reads every weight once, so a prompt shorter than the machine balance is
  // held against the bandwidth, and the meter says from where on prompts are
  // compute-bound.
  void a_short_prompt_is_memory_bound() {
    PhaseMeter m;
    HardwarePeaks p = peaks(16.4);
    p.peakInt8Ops = 600e9;
    m.setPeaks(p);
    const double weights = 241.0 * kMiB, ops = 2 * 100e6;
    m.setModel(241 * kMiB, ops, true, 64);
    // Reading the weights takes as long as ~46 tokens of int8 work.
    const double balance = weights / 16.4e9 * 600e9 / ops;
    LiveMetrics shortPrompt = decoding(40);
    shortPrompt.phase = Phase::done;
    shortPrompt.nPrompt = 11;
    shortPrompt.prefillTps = 300;  // 37 ms
    m.update(shortPrompt);
    QVERIFY(!m.prefillComputeBound());
    // 300 / 11 passes/s x 241 MiB over 16.4 GB/s; against the int8 peak it would be 10%.
    QVERIFY(qAbs(m.prefillFraction() - weights * 300 / 11 / 16.4e9) < 1e-9);
    QVERIFY(m.prefillFraction() > 0.4);
    QString t = m.prefillText();
    QVERIFY2(t.contains(QLatin1String("The 11-token prompt is memory-bound here: it reads all 241.0 MiB of weights for 11 "
                                      "tokens (6.9 GB/s of 16.4 GB/s).")),
             qPrintable(t));
    QVERIFY2(t.contains(QStringLiteral("Prompts longer than ~%1 tokens are compute-bound.").arg(std::lround(balance))),
             qPrintable(t));
    QVERIFY2(!t.contains(QLatin1String("Prefill is compute-bound")), qPrintable(t));
    // 512 tokens in passes of 64: past the balance, compute-bound.
    LiveMetrics longPrompt = shortPrompt;
    longPrompt.nPrompt = 512;
    longPrompt.prefillTps = 2000;
    m.update(longPrompt);
    QVERIFY(m.prefillComputeBound());
    QVERIFY(qAbs(m.prefillFraction() - ops * 2000 / 600e9) < 1e-9);
    t = m.prefillText();
    QVERIFY2(t.contains(QLatin1String("Prefill is compute-bound here: each pass of ~64 tokens")), qPrintable(t));
    // Where the balance is past the longest pass, no prompt reaches the compute peak, and the text says so.
    p.peakInt8Ops = 2000e9;
    m.setPeaks(p);
    m.update(longPrompt);
    QVERIFY(!m.prefillComputeBound());
    QVERIFY2(m.prefillText().contains(QLatin1String("more than the 64 a pass takes here")), qPrintable(m.prefillText()));
  }

  // Issue 31, item 5: with the KV cache off, decode is divided by the compute
  // peak, and a note about the bandwidth measurement has no place beside it.
  void a_bandwidth_note_only_beside_the_bandwidth() {
    PhaseMeter m;
    HardwarePeaks p = peaks(20);
    p.pastCache = false;
    p.note = QStringLiteral("only 256 MiB of memory could be read: the bandwidth may include some cache hits");
    m.setPeaks(p);
    m.setModel(235 * kMiB, 2 * 268e6, true, 64);
    LiveMetrics m1 = decoding(4, false);
    m1.nPrompt = 512;
    m1.prefillTps = 2000;  // compute-bound
    m.update(m1);
    QVERIFY(m.decodeComputeBound() && m.prefillComputeBound());
    QVERIFY2(!m.decodeText().contains(p.note), qPrintable(m.decodeText()));
    QVERIFY2(!m.prefillText().contains(p.note), qPrintable(m.prefillText()));
    m.update(decoding(40));  // KV cache on: decode is divided by the bandwidth the note is about
    QVERIFY2(m.decodeText().contains(p.note), qPrintable(m.decodeText()));
  }

  // Issue 31, item 2: the meter divided by a cached (doubtful) 6.2 GB/s while
  // the batch sweep measured its own 16.4. Now the window has one figure: a
  // sweep with no usable window figure measures, and its figure becomes the
  // window's (stored, and the meter's); a later sweep uses the window's.
  void the_batch_sweep_and_the_meter_share_one_peak() {
    HardwarePeaks doubtful = peaks(6.2, 480 * kMiB);
    doubtful.threads = phaselab::physical_core_count();
    doubtful.plausible = false;
    doubtful.note = QStringLiteral("the 512 MiB buffer is mostly cache hits");
    HardwareProbe::store(doubtful);
    MainWindow w(testing::windowOptions(m_dir.filePath(QStringLiteral("share.sqlite"))));
    PhaseMeter* meter = w.metricsDock()->phaseMeter();
    QCOMPARE(meter->peaks().memoryBandwidth, 6.2e9);
    QCOMPARE(meter->decodeFraction(), 0.0);  // never divided by
    CompareWindow* cw = w.compareWindow();
    cw->addModel(testing::stories());
    cw->setThreads(0);  // one per physical core, as the window's probe
    cw->setBatchSweep(QStringLiteral("1"), 8, 4);
    auto sweep = [&] {
      QSignalSpy done(cw, &CompareWindow::batchSweepFinished);
      if (!cw->startBatchSweep()) return false;
      return done.wait(120000) && done.first().at(0).toBool();
    };
    QVERIFY2(sweep(), qPrintable(cw->batchSweep()->lastError()));
    const SweepSetup& measured = cw->batchSweep()->setup();
    QVERIFY(!measured.peaksFromWindow);  // a doubtful figure is not used: measured anew
    QVERIFY(measured.peaksForWindow);
    QVERIFY(measured.peaks.memoryBandwidth > 0 && measured.peaks.memoryBandwidth != 6.2e9);
    QCOMPARE(meter->peaks().memoryBandwidth, measured.peaks.memoryBandwidth);
    QCOMPARE(meter->peaks().peakInt8Ops, measured.peaks.peakInt8Ops);
    QCOMPARE(HardwareProbe::cached().memoryBandwidth, measured.peaks.memoryBandwidth);
    if (measured.peaks.usable()) QCOMPARE(measured.roof.read_bytes_per_s, measured.peaks.memoryBandwidth);

    // The window's usable figure (a probe's, or "Measure again") is the sweep's.
    HardwarePeaks known = peaks(23.4);
    known.threads = phaselab::physical_core_count();
    w.setMachinePeaks(known);
    QCOMPARE(meter->peaks().memoryBandwidth, 23.4e9);
    QVERIFY2(sweep(), qPrintable(cw->batchSweep()->lastError()));
    const SweepSetup& shared = cw->batchSweep()->setup();
    QVERIFY(shared.peaksFromWindow);
    QCOMPARE(shared.roof.read_bytes_per_s, 23.4e9);
    const QString summary = cw->batchSweep()->findChild<QLabel*>(QStringLiteral("batchSweepSummary"))->text();
    QVERIFY2(summary.contains(QLatin1String("read 23.4 GB/s")) && summary.contains(QLatin1String("phase meter")),
             qPrintable(summary));
    meter->setModel(241 * kMiB, 2 * 100e6, true, 64);
    meter->update(decoding(40));
    QVERIFY2(meter->decodeText().contains(QLatin1String("of 23.4 GB/s")), qPrintable(meter->decodeText()));
  }

  // Probes cached by the first method (no version key) are not trusted.
  void probes_of_an_older_method_are_measured_again() {
    {
      QSettings s;
      s.clear();
      s.setValue(QStringLiteral("probe/memoryBandwidth"), 6.8e9);
      s.setValue(QStringLiteral("probe/peakFlops"), 100e9);
    }
    QVERIFY(!HardwareProbe::cached().valid());
    HardwarePeaks p = peaks(28.5);
    p.note = QStringLiteral("n");
    p.plausible = false;
    HardwareProbe::store(p);
    const HardwarePeaks c = HardwareProbe::cached();
    QVERIFY(c.valid());
    QCOMPARE(c.memoryBandwidth, 28.5e9);
    QCOMPARE(c.llcBytes, 32 * kMiB);
    QCOMPARE(c.bufferBytes, 512 * kMiB);
    QCOMPARE(c.runs, 5);
    QCOMPARE(c.note, QStringLiteral("n"));
    QVERIFY(!c.plausible);
  }
};

QTEST_MAIN(TestGuiPhaseMeter)
#include "test_gui_phase_meter.moc"
