// The machine module: core and cache counts from sysfs, and the measured
// peaks (memory read bandwidth, FP32 and int8 compute) that decode and
// prefill are shown against. The peaks are timings, so the checks are ranges
// and agreement between runs, not exact values.
#include <QTest>
#include <cstring>
#include <thread>
#include <vector>

#include "phaselab/machine.h"
#include "phaselab/memory.h"

using namespace phaselab;

namespace {
constexpr std::size_t kMiB = std::size_t{1} << 20;
}  // namespace

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

  // The buffer is sized from the cache it must read past: 4x the last-level
  // cache and at least 512 MiB, at most half the available memory.
  void the_buffer_is_four_times_the_cache() {
    const uint64_t GiB = uint64_t{1} << 30;
    BandwidthBuffer b = plan_bandwidth_buffer(32 * kMiB, 24 * GiB);
    QCOMPARE(b.bytes, 512 * kMiB);
    QVERIFY(b.past_cache());
    b = plan_bandwidth_buffer(480 * kMiB, 24 * GiB);  // the Xeon VM that failed
    QCOMPARE(b.bytes, 1920 * kMiB);
    QVERIFY(b.past_cache());
    b = plan_bandwidth_buffer(480 * kMiB, 2 * GiB);  // memory short: half of it, and it says so
    QCOMPARE(b.bytes, 1024 * kMiB);
    QCOMPARE(b.wanted, 1920 * kMiB);
    QVERIFY(!b.past_cache());
    b = plan_bandwidth_buffer(0, 0);  // nothing known
    QCOMPARE(b.bytes, 512 * kMiB);
    b = plan_bandwidth_buffer(std::size_t{1} << 30, 100 * kMiB);  // never under 64 MiB
    QCOMPARE(b.bytes, 64 * kMiB);
    b = plan_bandwidth_buffer(kMiB + 1, 0);  // whole MiB
    QCOMPARE(b.bytes % kMiB, std::size_t{0});
  }

  // The probe counts slice bytes a pass: its loops must read each of them
  // once, the four-stream loop's ways and tail included.
  void the_read_probe_reads_every_byte_once() {
#if defined(__x86_64__)
    if (!__builtin_cpu_supports("avx2")) qInfo("no AVX2 here: both reads are the portable loop");
#endif
    for (std::size_t n : {std::size_t{128}, std::size_t{384}, std::size_t{4096}, std::size_t{4096 * 3 + 640},
                          std::size_t{1} << 20}) {
      std::vector<uint64_t> words(n / 8 + 8);
      auto* p = reinterpret_cast<uint8_t*>(words.data());
      p += (64 - reinterpret_cast<uintptr_t>(p) % 64) % 64;  // 64-byte aligned, as the probe's pages
      uint64_t want = 0;
      for (std::size_t i = 0; i < n / 8; i++) {
        // splitmix64 of i: no skipped and doubled runs of words cancel out.
        uint64_t v = (i + 1) * 0x9E3779B97F4A7C15ull;
        v = (v ^ (v >> 30)) * 0xBF58476D1CE4E5B9ull;
        v = (v ^ (v >> 27)) * 0x94D049BB133111EBull;
        v ^= v >> 31;
        std::memcpy(p + 8 * i, &v, 8);
        want += v;
      }
      QCOMPARE(probe_read_sum(p, n, false), want);
      QCOMPARE(probe_read_sum(p, n, true), want);
    }
  }

  // The plausibility rules with injected cache sizes and timings.
  void judging_injected_timings() {
    auto judge = [](std::size_t llc, uint64_t avail, double best, double median, int runs, double llc_bw = 0) {
      MachinePeaks p;
      p.llc_bytes = llc;
      p.llc_read_bandwidth = llc_bw;
      p.fp32_flops = 100e9;
      const BandwidthBuffer plan = plan_bandwidth_buffer(llc, avail);
      BandwidthTiming t;
      t.best = best;
      t.median = median;
      t.runs = runs;
      t.bytes = runs > 0 ? plan.bytes : 0;
      judge_peaks(plan, t, &p);
      return p;
    };
    const uint64_t big = uint64_t{24} << 30;
    // A 480 MiB cache read past with 1920 MiB: plausible, nothing to say.
    MachinePeaks p = judge(480 * kMiB, big, 20e9, 19e9, 5);
    QVERIFY2(p.plausible && p.note.empty(), p.note.c_str());
    QVERIFY(p.past_cache);
    QCOMPARE(p.buffer_bytes, 1920 * kMiB);
    QCOMPARE(p.read_bandwidth, 20e9);
    // The old method's 512 MiB behind a 480 MiB cache (memory allowing no
    // more): mostly cache hits, doubtful, and it says how much it needed.
    p = judge(480 * kMiB, 1024 * kMiB, 20e9, 19e9, 5);
    QVERIFY(!p.plausible);
    QVERIFY2(p.note.find("mostly cache hits") != std::string::npos && p.note.find("1920 MiB") != std::string::npos,
             p.note.c_str());
    // 2.5x the cache: kept, with a note.
    p = judge(480 * kMiB, 2400 * kMiB, 20e9, 19e9, 5);
    QVERIFY2(p.plausible && p.note.find("may include some cache hits") != std::string::npos, p.note.c_str());
    QVERIFY(!p.past_cache);
    // Passes that disagree, a rate below 1 GB/s, no buffer at all.
    p = judge(32 * kMiB, big, 20e9, 8e9, 5);
    QVERIFY2(!p.plausible && p.note.find("disagree") != std::string::npos, p.note.c_str());
    p = judge(32 * kMiB, big, 0.5e9, 0.5e9, 5);
    QVERIFY2(!p.plausible && p.note.find("implausibly low") != std::string::npos, p.note.c_str());
    p = judge(32 * kMiB, big, 0, 0, 0);
    QVERIFY2(!p.plausible && p.note.find("could not allocate 512 MiB") != std::string::npos, p.note.c_str());
    // A cache that reads slower than memory is not a figure to show.
    p = judge(480 * kMiB, big, 20e9, 19e9, 5, 12e9);
    QVERIFY2(p.plausible && p.llc_read_bandwidth == 0 && p.note.find("not used") != std::string::npos, p.note.c_str());
    p = judge(32 * kMiB, big, 20e9, 19e9, 5, 90e9);
    QVERIFY2(p.plausible && p.note.empty(), p.note.c_str());
    QCOMPARE(p.llc_read_bandwidth, 90e9);
    // No compute figure.
    MachinePeaks q;
    BandwidthTiming t{20e9, 19e9, 5, 512 * kMiB};
    judge_peaks(plan_bandwidth_buffer(32 * kMiB, big), t, &q);
    QVERIFY(!q.plausible);
  }

  // A real measurement. Assumption, skipped with the reason where it does not
  // hold: the machine has the memory to read 4x its last-level cache. A busy
  // machine (passes that disagree twice) is a skip too; the rules above are
  // tested with injected timings.
  void machine_peaks_are_sane_and_repeatable() {
    const BandwidthBuffer plan = plan_bandwidth_buffer(last_level_cache_bytes(), available_memory_bytes());
    if (!plan.past_cache())
      QSKIP(qPrintable(QStringLiteral("needs %1 MiB of available memory to read past the last-level cache")
                           .arg(2 * plan.wanted / kMiB)));
    MachinePeaks a = measure_machine_peaks();
    if (!a.plausible) a = measure_machine_peaks();
    QCOMPARE(a.threads, physical_core_count());
    QCOMPARE(a.llc_bytes, last_level_cache_bytes());
    QVERIFY2(a.past_cache && a.buffer_bytes + kMiB > plan.wanted, qPrintable(QString::number(a.buffer_bytes)));
    QVERIFY2(a.note.find("cache hits") == std::string::npos, a.note.c_str());
    if (!a.plausible) QSKIP(qPrintable(QStringLiteral("the machine was too busy to measure: ") + a.note.c_str()));
    QVERIFY2(a.read_bandwidth > 1e9 && a.read_bandwidth < 5e12, qPrintable(QString::number(a.read_bandwidth)));
    QVERIFY(a.fp32_flops > 1e8 && a.fp32_flops < 1e15);
    QVERIFY(a.int8_ops >= 0);
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx2")) QVERIFY(a.int8_ops > 1e8);
#endif
    QVERIFY(a.runs >= 5);
    if (a.llc_read_bandwidth > 0) QCOMPARE(a.llc_buffer_bytes / kMiB, a.llc_bytes / 2 / kMiB);
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
    qInfo("%s", describe_machine_peaks(a).c_str());
    qInfo("again: read %.1f GB/s from memory, %.1f GB/s from the cache", b.read_bandwidth / 1e9,
          b.llc_read_bandwidth / 1e9);
  }

  // The Xeon VM whose sysfs reported a 480 MiB L3, simulated through the
  // probe's cache-size input: it reads 1920 MiB and says nothing of cache hits.
  void a_480_mib_cache_is_read_past() {
    MachineProbeOptions o;
    o.llc_bytes = 480 * kMiB;
    const BandwidthBuffer plan = plan_bandwidth_buffer(*o.llc_bytes, available_memory_bytes());
    if (!plan.past_cache())
      QSKIP(qPrintable(QStringLiteral("needs %1 MiB of available memory").arg(2 * plan.wanted / kMiB)));
    const MachinePeaks p = measure_machine_peaks(o);
    QCOMPARE(p.llc_bytes, 480 * kMiB);
    QVERIFY2(p.buffer_bytes + kMiB > 1920 * kMiB && p.past_cache, qPrintable(QString::number(p.buffer_bytes >> 20)));
    QVERIFY2(p.note.find("cache hits") == std::string::npos, p.note.c_str());
    QVERIFY(p.read_bandwidth > 0);
    qInfo("%s", describe_machine_peaks(p).c_str());
  }

  // Memory too short to read past the cache: said, never silently a cache
  // figure passed off as memory's.
  void short_memory_is_said() {
    MachineProbeOptions o;
    o.llc_bytes = 480 * kMiB;
    o.available_bytes = 1024 * kMiB;
    const MachinePeaks p = measure_machine_peaks(o);
    QCOMPARE(p.buffer_bytes >> 20, std::size_t{512});
    QVERIFY(!p.past_cache);
    QVERIFY(!p.plausible);
    QVERIFY2(p.note.find("mostly cache hits") != std::string::npos, p.note.c_str());
    QVERIFY(describe_machine_peaks(p).find("doubtful") != std::string::npos);
  }

  void one_thread_measures_with_one_thread() {
    const MachinePeaks p = measure_machine_peaks(1);
    QCOMPARE(p.threads, 1);
    QVERIFY(p.read_bandwidth > 1e8);
    QVERIFY(p.fp32_flops > 0);
  }

  // Bench's two probes as one: each figure the larger (a probe only
  // under-reads), a doubtful probe left out, the first's sizes kept.
  void two_probes_keep_the_better_of_each_figure() {
    MachinePeaks a, b;
    a.plausible = b.plausible = true;
    a.read_bandwidth = 45e9, b.read_bandwidth = 27e9;  // the second at a bad moment
    a.int8_ops = 466e9, b.int8_ops = 930e9;            // the first at a bad moment
    a.fp32_flops = 117e9, b.fp32_flops = 233e9;
    a.llc_read_bandwidth = 86e9, b.llc_read_bandwidth = 182e9;
    a.runs = b.runs = 5;
    a.buffer_bytes = 512 * kMiB, b.buffer_bytes = 64 * kMiB;
    const MachinePeaks p = better_peaks(a, b);
    QCOMPARE(p.read_bandwidth, 45e9);
    QCOMPARE(p.int8_ops, 930e9);
    QCOMPARE(p.fp32_flops, 233e9);
    QCOMPARE(p.llc_read_bandwidth, 182e9);
    QCOMPARE(p.runs, 10);
    QCOMPARE(p.buffer_bytes, 512 * kMiB);
    QVERIFY(p.plausible);
    QCOMPARE(better_peaks(b, a).int8_ops, 930e9);  // the order does not matter for the figures
    QCOMPARE(better_peaks(b, a).read_bandwidth, 45e9);

    MachinePeaks doubtful = b;
    doubtful.plausible = false;
    doubtful.read_bandwidth = 900e9;  // a doubtful figure is never taken
    QCOMPARE(better_peaks(a, doubtful).read_bandwidth, 45e9);
    QCOMPARE(better_peaks(doubtful, a).read_bandwidth, 45e9);
    QVERIFY(better_peaks(doubtful, a).plausible);
    MachinePeaks both = a;
    both.plausible = false;
    QVERIFY(!better_peaks(both, doubtful).plausible);

    // The cache figure stays only where it reads faster than the merged
    // memory figure (judge_peaks' rule), and the second probe's note is kept.
    MachinePeaks slow_cache = b;
    slow_cache.llc_read_bandwidth = 30e9;  // kept beside its own memory (27), under 0.8x the first (45)
    slow_cache.note = "a note";
    MachinePeaks no_cache = a;
    no_cache.llc_read_bandwidth = 0;
    const MachinePeaks m = better_peaks(no_cache, slow_cache);
    QCOMPARE(m.read_bandwidth, 45e9);
    QCOMPARE(m.llc_read_bandwidth, 0.0);
    QVERIFY2(m.note.find("a note") != std::string::npos, m.note.c_str());

    QVERIFY(peaks_differ(a, b, 0.1));
    QVERIFY(!peaks_differ(a, a, 0.1));
    MachinePeaks near = a;
    near.int8_ops *= 1.05;
    QVERIFY(!peaks_differ(a, near, 0.1));
    near.fp32_flops *= 1.2;
    QVERIFY(peaks_differ(a, near, 0.1));
  }

  // The placement of bench's two CPUs: the same or not, from two round trips.
  void a_placement_change_is_told_from_two_round_trips() {
    QCOMPARE(core_placement(30), CorePlacement::one_core);
    QCOMPARE(core_placement(66), CorePlacement::shared_cache);
    QCOMPARE(core_placement(250), CorePlacement::apart);
    QCOMPARE(core_placement(-1), CorePlacement::unknown);
    QCOMPARE(core_placement(44), CorePlacement::one_core);  // the thresholds, 45 and 150 ns
    QCOMPARE(core_placement(46), CorePlacement::shared_cache);
    QCOMPARE(core_placement(149), CorePlacement::shared_cache);
    QCOMPARE(core_placement(151), CorePlacement::apart);
    QVERIFY(!placement_changed(60, 65));    // one shared cache throughout
    QVERIFY(!placement_changed(300, 240));  // apart throughout
    QVERIFY(!placement_changed(29, 38));    // one core's two hardware threads throughout
    QVERIFY(placement_changed(64, 300));
    QVERIFY(placement_changed(259, 66));
    QVERIFY(placement_changed(38, 70));     // onto a core of its own
    QVERIFY(placement_changed(250, 35));
    QVERIFY(!placement_changed(-1, 300));  // not measured
    QVERIFY(!placement_changed(60, -1));
  }
};

QTEST_APPLESS_MAIN(TestMachine)
#include "test_machine.moc"
