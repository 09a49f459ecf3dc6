// The helper threads behind parallel.h.
//
// One job at a time. `state` packs the job's generation (high 40 bits) and the next unclaimed chunk
// (low 24 bits): a thread claims chunk i of generation g by a compare-and-swap from (g, i) to
// (g, i + 1), so a helper that comes late to a job that is over (or read the fields of the next one
// half written) fails its swap and claims nothing. The caller posts job g + 1 only after every chunk of
// g is claimed and done, so a claimed chunk's body and context are alive while it runs.
//
// Helpers spin for a short while after a job (the next split of a step comes within microseconds),
// then sleep on a condition variable; the caller takes the lock only when one sleeps.
#include "parallel.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define TOKENSWIFT_PAUSE() _mm_pause()
#else
#define TOKENSWIFT_PAUSE() std::this_thread::yield()
#endif

namespace parallel {
namespace {

// One chunk each: a helper that is late leaves its chunk to the caller, one that came has just been
// scheduled and is rarely preempted in it. More, smaller chunks measured slower both on an idle machine
// (the last chunk's wait) and on a busy one (benchmarks/threads_busy.py).
constexpr int kChunksPerThread = 1;
constexpr int kIndexBits = 24;
constexpr uint64_t kIndexMask = (uint64_t{1} << kIndexBits) - 1;
constexpr int kHelperPauses = 128;  // between yields of the core
constexpr auto kHelperSpin = std::chrono::microseconds(500);  // then sleep
constexpr int kCallerSpins = 2000;  // pauses before the caller yields its core to a helper mid-chunk

inline uint64_t generation(uint64_t state) { return state >> kIndexBits; }
inline int64_t index(uint64_t state) { return static_cast<int64_t>(state & kIndexMask); }

thread_local bool inside = false;  // this thread runs a chunk (nested calls run inline)

struct Inside {  // marks this thread inside a split until the scope ends, however it ends
  bool was = inside;
  Inside() { inside = true; }
  ~Inside() { inside = was; }
};

void run_here(int64_t begin, int64_t end, Body body, const void* context) {
  Inside here;
  body(context, begin, end);
}

class Pool {
 public:
  void run(int64_t begin, int64_t end, int64_t grain, Body body, const void* context, int threads) {
    std::unique_lock<std::mutex> caller(caller_, std::try_to_lock);
    const int64_t size = end - begin;
    const int64_t chunks = std::min<int64_t>({(size + grain - 1) / grain, int64_t{threads} * kChunksPerThread,
                                              static_cast<int64_t>(kIndexMask)});
    if (!caller.owns_lock() || chunks < 2) return run_here(begin, end, body, context);
    grow(threads - 1);
    body_.store(body, std::memory_order_relaxed);
    context_.store(context, std::memory_order_relaxed);
    begin_.store(begin, std::memory_order_relaxed);
    size_.store(size, std::memory_order_relaxed);
    chunks_.store(chunks, std::memory_order_relaxed);
    helpers_.store(threads - 1, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    failed_.store(false, std::memory_order_relaxed);
    const uint64_t job = generation(state_.load(std::memory_order_relaxed)) + 1;
    state_.store(job << kIndexBits, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> lock(sleep_);
      wake_.notify_all();
    }
    {
      Inside here;
      claim(job);
    }
    for (int spins = 0; done_.load(std::memory_order_acquire) < chunks; ++spins) {
      if (spins < kCallerSpins)
        TOKENSWIFT_PAUSE();
      else
        std::this_thread::yield();  // a helper was preempted in its chunk: let it run
    }
    if (error_) {
      std::exception_ptr error = error_;
      error_ = nullptr;
      std::rethrow_exception(error);
    }
  }

 private:
  void grow(int helpers) {
    while (static_cast<int>(threads_.size()) < helpers) {
      const int number = static_cast<int>(threads_.size());
      threads_.emplace_back([this, number] { help(number); });
      threads_.back().detach();
    }
  }

  // Claims and runs chunks of generation `job` until none is left.
  void claim(uint64_t job) {
    for (;;) {
      uint64_t state = state_.load(std::memory_order_acquire);
      if (generation(state) != job) return;
      const int64_t chunk = index(state), chunks = chunks_.load(std::memory_order_relaxed);
      if (chunk >= chunks) return;
      const Body body = body_.load(std::memory_order_relaxed);
      const void* context = context_.load(std::memory_order_relaxed);
      const int64_t begin = begin_.load(std::memory_order_relaxed), size = size_.load(std::memory_order_relaxed);
      if (!state_.compare_exchange_weak(state, state + 1, std::memory_order_acq_rel)) continue;
      // The swap succeeded: the fields read above are generation `job`'s, and it lasts until this chunk is done.
      if (!failed_.load(std::memory_order_relaxed)) {
        try {
          body(context, begin + size * chunk / chunks, begin + size * (chunk + 1) / chunks);
        } catch (...) {
          std::lock_guard<std::mutex> lock(error_lock_);
          if (!error_) error_ = std::current_exception();
          failed_.store(true, std::memory_order_relaxed);
        }
      }
      done_.fetch_add(1, std::memory_order_release);
    }
  }

  void help(int number) {
    inside = true;
    uint64_t seen = generation(state_.load(std::memory_order_acquire));
    for (;;) {
      uint64_t job = wait_past(seen);
      if (number < helpers_.load(std::memory_order_relaxed)) claim(job);
      seen = job;
    }
  }

  // The generation of the next job after `seen`: spin a while, then sleep.
  uint64_t wait_past(uint64_t seen) {
    const auto until = std::chrono::steady_clock::now() + kHelperSpin;
    for (int spins = 0;; ++spins) {
      const uint64_t job = generation(state_.load(std::memory_order_acquire));
      if (job != seen) return job;
      if (spins % kHelperPauses != kHelperPauses - 1) {
        TOKENSWIFT_PAUSE();
        continue;
      }
      // Now and then give the core away: on an idle one the yield returns at once; on a busy one
      // the other process runs, and this thread, having run little, is scheduled promptly when the
      // next job comes and is rarely preempted in a chunk.
      std::this_thread::yield();
      if (std::chrono::steady_clock::now() > until) break;
    }
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    std::unique_lock<std::mutex> lock(sleep_);
    wake_.wait(lock, [&] { return generation(state_.load(std::memory_order_seq_cst)) != seen; });
    sleepers_.fetch_sub(1, std::memory_order_relaxed);
    return generation(state_.load(std::memory_order_acquire));
  }

  std::mutex caller_;  // one caller at a time
  std::vector<std::thread> threads_;
  // The job's fields, read by every claim, on their own cache line; the two counters each on theirs.
  alignas(64) std::atomic<Body> body_{nullptr};
  std::atomic<const void*> context_{nullptr};
  std::atomic<int64_t> begin_{0}, size_{0}, chunks_{0};
  std::atomic<int> helpers_{0};
  alignas(64) std::atomic<uint64_t> state_{0};
  alignas(64) std::atomic<int64_t> done_{0};
  std::atomic<bool> failed_{false};
  std::mutex error_lock_;
  std::exception_ptr error_;
  alignas(64) std::atomic<int> sleepers_{0};
  std::mutex sleep_;
  std::condition_variable wake_;
};

Pool* pool = nullptr;  // never destroyed: helpers may sleep in it while the process exits

Pool& the_pool() {
  static std::once_flag made;
  std::call_once(made, [] {
    pool = new Pool();
    pthread_atfork(nullptr, nullptr, [] { pool = new Pool(); });  // the child's own, without threads
  });
  return *pool;
}

}  // namespace

void split_range(int64_t begin, int64_t end, int64_t grain, Body body, const void* context) {
  if (begin >= end) return;
  const int threads = inside ? 1 : at::get_num_threads();
  if (threads < 2) return run_here(begin, end, body, context);
  the_pool().run(begin, end, std::max<int64_t>(grain, 1), body, context, threads);
}

}  // namespace parallel

// For the tests: how many times each index of [0, size) was visited by split(0, size, grain, ...), with
// a nested split inside every chunk (which runs inline) and, if fail_at >= 0, the chunk holding it throwing.
at::Tensor split_counts(int64_t size, int64_t grain, int64_t fail_at) {
  std::vector<std::atomic<int64_t>> counts(static_cast<size_t>(size));
  parallel::split(0, size, grain, [&](int64_t begin, int64_t end) {
    if (begin <= fail_at && fail_at < end) throw std::runtime_error("a chunk failed");
    parallel::split(begin, end, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) counts[static_cast<size_t>(i)].fetch_add(1, std::memory_order_relaxed);
    });
  });
  at::Tensor out = at::empty({size}, at::kLong);
  for (int64_t i = 0; i < size; ++i) out[i] = counts[static_cast<size_t>(i)].load();
  return out;
}
