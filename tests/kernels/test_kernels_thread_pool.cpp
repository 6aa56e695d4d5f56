// ThreadPool: every index runs once per run() with the right count, split() tiles [0, n) in
// grain multiples, and thousands of back-to-back runs, or runs after the workers went to sleep,
// all complete.

#include <QtTest>
#include <atomic>
#include <chrono>
#include <set>
#include <thread>

#include "kernels/cpu/thread_pool.h"
#include "tests/kernels/kernel_test.h"

using tokenfab::kernels::ThreadPool;

namespace {

// What one run() saw: per thread index, how often fn ran, the n it got and on which thread.
// Plain (non-atomic) slots: that the caller reads them correctly after run() returns is part of
// what is tested (run() must publish the workers' writes).
struct RunLog {
  explicit RunLog(int n) : calls(n, 0), n_seen(n, 0), ids(n) {}
  std::vector<int> calls, n_seen;
  std::vector<std::thread::id> ids;
};

// Runs once and returns "" or what went wrong.
QString run_and_check(ThreadPool& pool, int n_threads) {
  RunLog log(n_threads);
  std::atomic<int> out_of_range{0};
  pool.run([&](int index, int n) {
    if (index < 0 || index >= n_threads) {
      out_of_range.fetch_add(1);
      return;
    }
    ++log.calls[index];
    log.n_seen[index] = n;
    log.ids[index] = std::this_thread::get_id();
  });
  if (out_of_range.load() != 0) return "fn got an index outside [0, n_threads)";
  std::set<std::thread::id> distinct;
  for (int i = 0; i < n_threads; ++i) {
    if (log.calls[i] != 1) return QString("index %1 ran %2 times").arg(i).arg(log.calls[i]);
    if (log.n_seen[i] != n_threads) return QString("index %1 got n = %2").arg(i).arg(log.n_seen[i]);
    distinct.insert(log.ids[i]);
  }
  if (log.ids[0] != std::this_thread::get_id()) return "index 0 did not run on the caller";
  if (static_cast<int>(distinct.size()) != n_threads) return "two indices shared a thread";
  return {};
}

}  // namespace

void KernelTest::thread_pool_runs_each_index_once() {
  for (int n_threads = 1; n_threads <= 4; ++n_threads) {
    ThreadPool pool(n_threads);
    QCOMPARE(pool.size(), n_threads);
    for (int run = 0; run < 3; ++run) {
      const QString err = run_and_check(pool, n_threads);
      QVERIFY2(err.isEmpty(),
               qPrintable(QString("%1 threads, run %2: ").arg(n_threads).arg(run) + err));
    }
  }
}

// The parts are contiguous, in index order, cover [0, n) exactly, start on a grain multiple,
// end on one or at n, and hold whole grains that differ by at most one between threads.
void KernelTest::thread_pool_split_covers_range() {
  std::vector<int64_t> sizes;
  for (int64_t n = 0; n <= 300; ++n) sizes.push_back(n);
  sizes.insert(sizes.end(), {4095, 4096, 4097, 49152, 1000000007});
  for (int64_t n : sizes) {
    for (int64_t grain : {1, 2, 3, 8, 32, 1000}) {
      for (int n_threads = 1; n_threads <= 9; ++n_threads) {
        int64_t expect_begin = 0, min_units = INT64_MAX, max_units = 0;
        for (int i = 0; i < n_threads; ++i) {
          int64_t begin = -1, end = -1;
          ThreadPool::split(n, grain, i, n_threads, begin, end);
          const bool ok = begin == expect_begin && begin <= end && end <= n &&
                          (begin % grain == 0 || begin == n) && (end % grain == 0 || end == n);
          if (!ok) {
            QFAIL(qPrintable(QString("split(n=%1, grain=%2, index=%3, threads=%4) = [%5, %6)")
                                 .arg(n)
                                 .arg(grain)
                                 .arg(i)
                                 .arg(n_threads)
                                 .arg(begin)
                                 .arg(end)));
          }
          const int64_t units = (end - begin + grain - 1) / grain;
          min_units = std::min(min_units, units);
          max_units = std::max(max_units, units);
          expect_begin = end;
        }
        QVERIFY2(expect_begin == n, qPrintable(QString("n=%1 grain=%2 threads=%3: covers [0, %4)")
                                                   .arg(n)
                                                   .arg(grain)
                                                   .arg(n_threads)
                                                   .arg(expect_begin)));
        QVERIFY2(
            max_units - min_units <= 1,
            qPrintable(
                QString("n=%1 grain=%2 threads=%3: unbalanced").arg(n).arg(grain).arg(n_threads)));
      }
    }
  }
}

void KernelTest::thread_pool_survives_many_runs_data() {
  QTest::addColumn<int>("threads");
  QTest::newRow("2 threads") << 2;
  QTest::newRow("3 threads (more than this machine may have cores)") << 3;
}

// 10000 back-to-back runs: each must run every index once and return only after all of them
// finished (the caller checks every index's last run number right after run() returns). A
// deadlock would hang here; ctest's timeout for this suite turns that into a failure.
void KernelTest::thread_pool_survives_many_runs() {
  QFETCH(int, threads);
  constexpr int kRuns = 10000;
  ThreadPool pool(threads);
  std::vector<int> calls(threads, 0), last_run(threads, -1);
  for (int run = 0; run < kRuns; ++run) {
    pool.run([&](int index, int) {
      ++calls[index];
      last_run[index] = run;
    });
    for (int i = 0; i < threads; ++i) {
      if (last_run[i] != run)
        QFAIL(qPrintable(QString("run %1 returned before index %2 ran").arg(run).arg(i)));
    }
  }
  for (int i = 0; i < threads; ++i) QCOMPARE(calls[i], kRuns);
}

// After a pause the workers have stopped spinning and sleep on the futex; run() must wake them.
// Destroying a pool whose workers sleep, or that never ran, must not hang either.
void KernelTest::thread_pool_wakes_after_sleeping() {
  {
    ThreadPool pool(3);
    for (int round = 0; round < 3; ++round) {
      const QString err = run_and_check(pool, 3);
      QVERIFY2(err.isEmpty(), qPrintable(QString("round %1: ").arg(round) + err));
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
    }
  }
  { ThreadPool never_ran(3); }
}
