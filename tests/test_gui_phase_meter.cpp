// The phase meter's explanations follow what really happens: without the KV
// cache decode is compute-bound; weights larger than the last-level cache
// never "fit in the caches" (above 100% then means the measured peak was
// low, and the meter offers to measure again); the probe's cache is discarded
// when the method changes.
#include <QApplication>
#include <QProgressBar>
#include <QPushButton>
#include <QSettings>
#include <QSignalSpy>
#include <QTemporaryDir>
#include <QTest>

#include "gui_test_util.h"
#include "phase_meter.h"

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
