#pragma once
// A fixed team of threads for data-parallel kernels. run() hands the same function to every
// thread (the caller is thread 0) and returns when all have finished. Workers spin briefly between
// calls (a decode step issues a few hundred short parallel regions) and then sleep on a futex.

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace tokenfab::kernels {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);  // n_threads >= 1, the caller included
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  // fn(thread_index, n_threads); not re-entrant, one caller at a time.
  void run(const std::function<void(int, int)>& fn);

  // Splits [0, n) into n_threads contiguous parts, rounded to multiples of `grain`.
  static void split(int64_t n, int64_t grain, int index, int n_threads, int64_t& begin, int64_t& end);

 private:
  void worker_loop(int index);

  int n_threads_;
  std::vector<std::thread> workers_;
  const std::function<void(int, int)>* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace tokenfab::kernels
