// The machine module: core and cache counts from sysfs, and the measured
// peaks (memory read bandwidth, FP32 and int8 compute) that decode and
// prefill are shown against. The peaks are timings, so the checks are ranges
// and agreement between runs, not exact values.
#include <QTest>
#include <thread>

#include "phaselab/machine.h"

using namespace phaselab;

class TestMachine : public QObject {
  Q_OBJECT
 private slots:
  void physical_cores_are_at_most_the_hardware_threads() {
    const int cores = physical_core_count();
    const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    QVERIFY2(cores >= 1 && cores <= hw, qPrintable(QStringLiteral("%1 cores, %2 threads").arg(cores).arg(hw)));
    QCOMPARE(default_thread_count(), cores);
  }

  void last_level_cache_is_a_cache_size_or_unknown() {
    const std::size_t llc = last_level_cache_bytes();
    if (llc == 0) QSKIP("no cache sizes in /sys/devices/system/cpu/cpu0/cache");
    QVERIFY2(llc >= (std::size_t{16} << 10) && llc <= (std::size_t{4} << 30), qPrintable(QString::number(llc)));
  }

  // The issue: one-shot probes of one machine gave 6.8 to 11.4 GB/s where a
  // plain read loop gives about 30. Best-of-several passes over 512 MiB with
  // every core must be sane and repeatable.
  void machine_peaks_are_plausible_and_repeatable() {
    const MachinePeaks a = measure_machine_peaks();
    QCOMPARE(a.threads, physical_core_count());
    QVERIFY2(a.plausible, a.note.c_str());
    QVERIFY2(a.read_bandwidth > 1e9 && a.read_bandwidth < 5e12, qPrintable(QString::number(a.read_bandwidth)));
    QVERIFY(a.fp32_flops > 1e8 && a.fp32_flops < 1e15);
    QVERIFY(a.int8_ops >= 0);
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx2")) QVERIFY(a.int8_ops > 1e8);
#endif
    QVERIFY(a.runs >= 5);
    QVERIFY(a.buffer_bytes >= (std::size_t{64} << 20));
    QCOMPARE(a.llc_bytes, last_level_cache_bytes());
    // A machine shared with other jobs can slow one whole measurement: one
    // more try before calling two runs inconsistent.
    auto within2 = [&](const MachinePeaks& b) {
      const double r = b.read_bandwidth / a.read_bandwidth;
      return r > 0.5 && r < 2.0;
    };
    MachinePeaks b = measure_machine_peaks();
    if (!within2(b)) b = measure_machine_peaks();
    QVERIFY2(within2(b), qPrintable(QStringLiteral("%1 GB/s then %2 GB/s")
                                        .arg(a.read_bandwidth / 1e9)
                                        .arg(b.read_bandwidth / 1e9)));
    qInfo("read %.1f / %.1f GB/s (%d threads, %zu MiB, %d and %d passes), FP32 %.0f GFLOP/s, int8 %.0f GOP/s",
          a.read_bandwidth / 1e9, b.read_bandwidth / 1e9, a.threads, a.buffer_bytes >> 20, a.runs, b.runs,
          a.fp32_flops / 1e9, a.int8_ops / 1e9);
  }

  void one_thread_measures_with_one_thread() {
    const MachinePeaks p = measure_machine_peaks(1);
    QCOMPARE(p.threads, 1);
    QVERIFY(p.read_bandwidth > 1e8);
    QVERIFY(p.fp32_flops > 0);
  }
};

QTEST_APPLESS_MAIN(TestMachine)
#include "test_machine.moc"
