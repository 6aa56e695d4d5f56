#include "kernels/cpu/thread_pool.h"

#include <algorithm>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TOKENFAB_PAUSE() _mm_pause()
#else
#define TOKENFAB_PAUSE() ((void)0)
#endif

namespace tokenfab::kernels {

// Waiting is pure spinning for ~kSpinIterations pauses (tens of microseconds: the gaps inside a
// decode step), then spinning with sched_yield (so that a descheduled thread of ours, or another
// process, gets the core when there are more runnable threads than cores), and for a worker,
// finally sleeping on a futex once the engine has been idle for ~kYieldIterations yields.
static constexpr int kSpinIterations = 2000;
static constexpr int kYieldIterations = 2000;

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run(const std::function<void(int, int)>& fn) {
  if (n_threads_ == 1) {
    fn(0, 1);
    return;
  }
  job_ = &fn;
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  fn(0, n_threads_);
  // Spin while the workers finish; if one of them was descheduled (more runnable threads than
  // cores), give the core away instead of burning the time slice it needs.
  for (int spins = 0; pending_.load(std::memory_order_acquire) != 0; ++spins) {
    if (spins < kSpinIterations) {
      TOKENFAB_PAUSE();
    } else {
      std::this_thread::yield();
    }
  }
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    int spins = 0;
    uint64_t current;
    while ((current = generation_.load(std::memory_order_acquire)) == seen) {
      ++spins;
      if (spins < kSpinIterations) {
        TOKENFAB_PAUSE();
      } else if (spins < kSpinIterations + kYieldIterations) {
        std::this_thread::yield();
      } else {
        generation_.wait(seen, std::memory_order_acquire);
      }
    }
    seen = current;
    if (stop_.load(std::memory_order_acquire)) return;
    (*job_)(index, n_threads_);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::split(int64_t n, int64_t grain, int index, int n_threads, int64_t& begin,
                       int64_t& end) {
  const int64_t units = (n + grain - 1) / grain;
  const int64_t per = units / n_threads, extra = units % n_threads;
  const int64_t ub = index * per + std::min<int64_t>(index, extra);
  const int64_t ue = ub + per + (index < extra ? 1 : 0);
  begin = std::min(n, ub * grain);
  end = std::min(n, ue * grain);
}

}  // namespace tokenfab::kernels
