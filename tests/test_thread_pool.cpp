// The engine's thread pool: every chunk runs once, on one thread, before the
// call returns, however fast the calls follow each other; round_trip_ns()
// measures between two of its threads, and gives up rather than waits for
// itself; core_round_trip_ns() (bench's line on where the threads are).
#include <QTest>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "phaselab/machine.h"
#include "phaselab/thread_pool.h"

using namespace phaselab;

class TestThreadPool : public QObject {
  Q_OBJECT
 private slots:
  // Many short jobs back to back, of both kinds: a thread that looks at
  // the state late must take nothing of a finished job or of the next one.
  void every_chunk_runs_once_per_call() {
    for (int threads : {1, 2, 3, 4}) {
      ThreadPool pool(threads);
      for (int call = 0; call < 2000; call++) {
        const int n = call % 7 == 0 ? 1 : 1 + call % 23;
        std::vector<std::atomic<int>> hits(static_cast<size_t>(std::max(n, threads)));
        std::atomic<int> bad{0};  // (Qt Test's checks belong on the test's thread)
        if (call % 2 == 0) {
          pool.for_chunks(n, [&](int c, int thread) {
            if (thread < 0 || thread >= threads) bad.fetch_add(1);
            hits[static_cast<size_t>(c)].fetch_add(1);
          });
          for (int c = 0; c < n; c++) QCOMPARE(hits[static_cast<size_t>(c)].load(), 1);
        } else {
          pool.run([&](int i, int n_slots) {
            if (n_slots != threads) bad.fetch_add(1);
            hits[static_cast<size_t>(i)].fetch_add(1);
          });
          for (int i = 0; i < threads; i++) QCOMPARE(hits[static_cast<size_t>(i)].load(), 1);
        }
        QCOMPARE(bad.load(), 0);
      }
    }
  }

  // A worker asleep (past its spinning) is woken, or the caller does its
  // share: the call returns with every slot run.
  void a_sleeping_worker_holds_nothing_up() {
    ThreadPool pool(2);
    pool.run([](int, int) {});
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // past the spin: the worker sleeps
    std::atomic<int> done{0};
    pool.run([&](int, int) { done.fetch_add(1); });
    QCOMPARE(done.load(), 2);
  }

  void round_trip_is_measured_or_refused() {
    ThreadPool one(1);
    QVERIFY(one.round_trip_ns() < 0);
    ThreadPool pool(2);
    // A second thread that never comes in time (another process on its
    // CPU: -1) must not hang the call; a figure comes at least once in 50
    // where there are two CPUs.
    int measured = 0;
    for (int i = 0; i < 50; i++) {
      const double ns = pool.round_trip_ns(8);
      QVERIFY2(ns == -1 || (ns > 0 && ns < 1e9), qPrintable(QString::number(ns)));
      measured += ns > 0;
    }
    if (std::thread::hardware_concurrency() >= 2) QVERIFY(measured > 0);
    // Pinned to two CPUs: a figure, or -1 when the second CPU was busy
    // with another process for 20 ms at each of five tries; never a hang,
    // zero or NaN. One CPU: -1.
    const double ns = core_round_trip_ns();
    if (allowed_cpus().size() >= 2) QVERIFY2(ns > 0 || ns == -1, qPrintable(QString::number(ns)));
    else QCOMPARE(ns, -1.0);
  }
};

QTEST_GUILESS_MAIN(TestThreadPool)
#include "test_thread_pool.moc"
