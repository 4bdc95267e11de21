// Shared by the native CPU kernels (conv_kernels.cc, bn_kernels.cc): vector types, aligned scratch,
// the convolution geometry and the work splitter over XLA's intra-op thread pool. Everything has internal
// linkage (an anonymous namespace), so each translation unit gets its own copy.
#ifndef JAXSPRINT_CPU_KERNELS_COMMON_H_
#define JAXSPRINT_CPU_KERNELS_COMMON_H_

#include <algorithm>
#include <atomic>
#include <memory>
#include <cstdint>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <new>
#include <thread>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;


namespace {

typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4), may_alias));  // unaligned access to 16 floats

inline v16 Load16(const float* p) { return *reinterpret_cast<const v16u*>(p); }
inline void Store16(float* p, v16 v) { *reinterpret_cast<v16u*>(p) = v; }
// Keeps a loaded vector in a register: without it GCC folds the load into every FMA that uses it (KV loads
// of a whole vector per broadcast instead of KV in all), and the products become load-bound.
// Only where a 16-float vector fits one register (AVX-512): on a narrower machine (AVX2 alone, seen on an AMD
// EPYC) GCC splits it over two registers and the constraint is impossible, so there it is left to the compiler.
#if defined(__AVX512F__)
inline void KeepInRegister(v16& v) { asm("" : "+v"(v)); }
#else
inline void KeepInRegister(v16&) {}
#endif

// Uninitialised scratch memory (every element read is written first), aligned to a cache line: the
// kernels access it in 64-byte vectors at multiples of 16 floats, and malloc's 16-byte alignment made
// every such access straddle two lines (a process-wide slowdown of 30-40 % in some runs, depending on
// where the heap happened to place the blocks).
struct Scratch {
  explicit Scratch(int64_t n) : data(static_cast<float*>(std::aligned_alloc(64, ((n * 4 + 63) / 64) * 64))) {
    if (data == nullptr) throw std::bad_alloc();
  }
  ~Scratch() { std::free(data); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  float* get() const { return data; }
  float* data;
};

struct Geometry {
  int64_t n, h, w, c, ho, wo, k, kh, kw, sh, sw, ph, pw;
};

// Runs work(0), ..., work(chunks - 1) on the calling thread and XLA's intra-op thread pool. Every
// participant claims chunks from a shared counter, so the caller never waits for a chunk that has not
// started: a task the pool starts late finds nothing left and returns (no deadlock when every pool
// thread is itself inside such a call). Pool threads are created once by XLA, so a call costs no thread
// creation (a new thread touches its whole static TLS: about 900 page faults in a jaxlib process).
template <typename F>
void ParallelFor(ffi::ThreadPool& pool, int64_t chunks, F&& work) {
  if (chunks <= 1) {
    if (chunks == 1) work(0);
    return;
  }
  struct State {
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
  };
  auto st = std::make_shared<State>();
  auto drain = [st, chunks, &work] {
    for (int64_t i = st->next.fetch_add(1); i < chunks; i = st->next.fetch_add(1)) {
      work(i);
      st->done.fetch_add(1, std::memory_order_release);
    }
  };
  for (int64_t q = 1; q < chunks; ++q) {
    auto task = drain;
    pool.Schedule(std::move(task));
  }
  drain();
  while (st->done.load(std::memory_order_acquire) < chunks) std::this_thread::yield();
}

// Accumulates rows [c0, c0 + CB) x lanes [k0, k0 + 16 * KV) of tap (i, j) over output rows [r0, r1)
// (r = n * Ho + ho), the accumulators held in registers throughout.

}  // namespace

#endif  // JAXSPRINT_CPU_KERNELS_COMMON_H_
