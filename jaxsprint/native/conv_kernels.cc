// CPU kernels for 2-D NHWC convolutions, as XLA FFI custom calls (see jaxsprint/native/__init__.py):
//   JaxsprintConvFilterGradF32  the filter gradient (below);
//   JaxsprintConvF32            the forward convolution (further down), also used for stride-1 input gradients.
//
// The filter gradient:
//
//   dw[i, j, c, k] = sum_{n, ho, wo} x[n, sh*ho + i - ph, sw*wo + j - pw, c] * dy[n, ho, wo, k]
//
// (x zero outside [0, H) x [0, W)). float32 in, float32 out. K must be a multiple of 16.
//
// Why by hand: XLA:CPU runs this as a convolution whose "image" is the whole batch and whose
// "kernel" is dy (a 32x32 window over 128 features for ResNet-20's first stage); its Eigen and
// YNNPACK kernels reach about half the speed of the forward convolution there. This loop keeps a
// block of the output in vector registers (16 accumulators of 16 lanes), broadcasts one input value
// per output row and streams dy once per (row, kernel tap); the batch is split over XLA's intra-op
// threads, each part with its own accumulator, summed at the end. GCC vector extensions compile it to AVX-512, AVX2 or
// SSE, whatever -march=native offers.
#include <algorithm>
#include <atomic>
#include <memory>
#include <cstdint>
#include <climits>
#include <cstring>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

typedef float v16 __attribute__((vector_size(64)));

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
template <int KV, int CB>
inline void Block(const Geometry& g, const float* x, const float* dy, float* acc_ij, int64_t i, int64_t j,
                  int64_t c0, int64_t k0, int64_t r0, int64_t r1, int64_t wo_lo, int64_t wo_hi) {
  v16 a[CB][KV];
  for (int cc = 0; cc < CB; ++cc)
    for (int v = 0; v < KV; ++v) std::memcpy(&a[cc][v], acc_ij + (c0 + cc) * g.k + k0 + 16 * v, 64);
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t n = r / g.ho, ho = r % g.ho;
    const int64_t h = g.sh * ho + i - g.ph;
    if (h < 0 || h >= g.h) continue;
    const float* xrow = x + ((n * g.h + h) * g.w) * g.c + (j - g.pw) * g.c + c0;
    const float* dyrow = dy + r * g.wo * g.k + k0;
    for (int64_t wo = wo_lo; wo < wo_hi; ++wo) {
      const float* xp = xrow + g.sw * wo * g.c;
      const float* dp = dyrow + wo * g.k;
      v16 d[KV];
      for (int v = 0; v < KV; ++v) std::memcpy(&d[v], dp + 16 * v, 64);
      for (int cc = 0; cc < CB; ++cc) {
        const float xv = xp[cc];
        for (int v = 0; v < KV; ++v) a[cc][v] += xv * d[v];
      }
    }
  }
  for (int cc = 0; cc < CB; ++cc)
    for (int v = 0; v < KV; ++v) std::memcpy(acc_ij + (c0 + cc) * g.k + k0 + 16 * v, &a[cc][v], 64);
}

template <int KV, int CB>
void Accumulate(const Geometry& g, const float* x, const float* dy, float* acc, int64_t n0, int64_t n1) {
  // Tiles of output rows small enough that their x and dy rows stay in cache across the taps.
  const int64_t tile = std::max<int64_t>(1, 256 / g.wo);
  for (int64_t r0 = n0 * g.ho; r0 < n1 * g.ho; r0 += tile) {
    const int64_t r1 = std::min(r0 + tile, n1 * g.ho);
    for (int64_t i = 0; i < g.kh; ++i) {
      for (int64_t j = 0; j < g.kw; ++j) {
        // Output columns whose input column sw*wo + j - pw lies inside [0, W).
        int64_t lo = g.pw - j > 0 ? (g.pw - j + g.sw - 1) / g.sw : 0;
        int64_t hi = g.w - 1 + g.pw - j >= 0 ? (g.w - 1 + g.pw - j) / g.sw + 1 : 0;
        hi = std::min(hi, g.wo);
        if (lo >= hi) continue;
        float* acc_ij = acc + (i * g.kw + j) * g.c * g.k;
        for (int64_t k0 = 0; k0 < g.k; k0 += 16 * KV) {
          int64_t c0 = 0;
          for (; c0 + CB <= g.c; c0 += CB) Block<KV, CB>(g, x, dy, acc_ij, i, j, c0, k0, r0, r1, lo, hi);
          for (; c0 + 4 <= g.c; c0 += 4) Block<KV, 4>(g, x, dy, acc_ij, i, j, c0, k0, r0, r1, lo, hi);
          for (; c0 < g.c; ++c0) Block<KV, 1>(g, x, dy, acc_ij, i, j, c0, k0, r0, r1, lo, hi);
        }
      }
    }
  }
}

ffi::Error FilterGradImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> dy,
                          ffi::ResultBuffer<ffi::F32> dw, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph,
                          int64_t pw, int64_t threads) {
  auto xd = x.dimensions();
  auto dd = dy.dimensions();
  if (xd.size() != 4 || dd.size() != 4 || xd[0] != dd[0]) {
    return ffi::Error::InvalidArgument("conv filter grad: x and dy must be NHWC with the same batch");
  }
  Geometry g{xd[0], xd[1], xd[2], xd[3], dd[1], dd[2], dd[3], kh, kw, sh, sw, ph, pw};
  if (g.k % 16 != 0) return ffi::Error::InvalidArgument("conv filter grad: output channels % 16 != 0");
  const int64_t out_size = kh * kw * g.c * g.k;
  float* out = dw->typed_data();
  const int64_t t = std::max<int64_t>(1, std::min<int64_t>(threads, g.n));
  // Chunk q sums examples [n q / t, n (q + 1) / t) into its own accumulator (chunk 0: the output).
  std::vector<float> partial((t - 1) * out_size);
  ParallelFor(pool, t, [&](int64_t q) {
    float* acc = q == 0 ? out : partial.data() + (q - 1) * out_size;
    std::fill(acc, acc + out_size, 0.0f);
    const int64_t n0 = g.n * q / t, n1 = g.n * (q + 1) / t;
    if (g.k % 64 == 0) Accumulate<4, 6>(g, x.typed_data(), dy.typed_data(), acc, n0, n1);
    else if (g.k % 32 == 0) Accumulate<2, 8>(g, x.typed_data(), dy.typed_data(), acc, n0, n1);
    else Accumulate<1, 16>(g, x.typed_data(), dy.typed_data(), acc, n0, n1);
  });
  for (int64_t q = 1; q < t; ++q) {
    const float* p = partial.data() + (q - 1) * out_size;
    for (int64_t e = 0; e < out_size; ++e) out[e] += p[e];
  }
  return ffi::Error::Success();
}

// ---------------------------------------------------------------------------------------------------
// Forward convolution, the same layouts: y[n, ho, wo, k] = sum_{i, j, c} x[n, sh*ho + i - ph, sw*wo + j - pw, c]
// * w[i, j, c, k]. A block of WB output columns x 16*KV output channels is kept in registers; each (i, j, c)
// loads one weight row and broadcasts WB input values. A row is covered by blocks of WB columns, the last
// one shifted left to end at the row's end (it recomputes a few columns rather than running a tail loop).
// Taps whose columns cross the left or right border read zero there.

template <int KV, int WB>
inline void ConvBlock(const Geometry& g, const float* x, const float* w, float* y, int64_t n, int64_t ho,
                      int64_t wo0, int64_t k0) {
  v16 a[WB][KV];
  for (int b = 0; b < WB; ++b)
    for (int v = 0; v < KV; ++v) a[b][v] = v16{};
  for (int64_t i = 0; i < g.kh; ++i) {
    const int64_t h = g.sh * ho + i - g.ph;
    if (h < 0 || h >= g.h) continue;
    const float* xrow = x + ((n * g.h + h) * g.w) * g.c;
    for (int64_t j = 0; j < g.kw; ++j) {
      const float* wrow = w + ((i * g.kw + j) * g.c) * g.k + k0;
      const int64_t col0 = g.sw * wo0 + j - g.pw;
      if (col0 >= 0 && col0 + (WB - 1) * g.sw < g.w) {  // every column of the block inside the row
        const float* xp = xrow + col0 * g.c;
        for (int64_t c = 0; c < g.c; ++c) {
          v16 wv[KV];
          for (int v = 0; v < KV; ++v) std::memcpy(&wv[v], wrow + c * g.k + 16 * v, 64);
          for (int b = 0; b < WB; ++b) {
            const float xv = xp[b * g.sw * g.c + c];
            for (int v = 0; v < KV; ++v) a[b][v] += xv * wv[v];
          }
        }
      } else {  // a border: columns outside [0, W) read zero
        for (int64_t c = 0; c < g.c; ++c) {
          v16 wv[KV];
          for (int v = 0; v < KV; ++v) std::memcpy(&wv[v], wrow + c * g.k + 16 * v, 64);
          for (int b = 0; b < WB; ++b) {
            const int64_t col = col0 + b * g.sw;
            const float xv = (col >= 0 && col < g.w) ? xrow[col * g.c + c] : 0.0f;
            for (int v = 0; v < KV; ++v) a[b][v] += xv * wv[v];
          }
        }
      }
    }
  }
  float* yp = y + ((n * g.ho + ho) * g.wo + wo0) * g.k + k0;
  for (int b = 0; b < WB; ++b)
    for (int v = 0; v < KV; ++v) std::memcpy(yp + b * g.k + 16 * v, &a[b][v], 64);
}

template <int KV, int WB>
void ConvRows(const Geometry& g, const float* x, const float* w, float* y, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t n = r / g.ho, ho = r % g.ho;
    for (int64_t k0 = 0; k0 < g.k; k0 += 16 * KV) {
      for (int64_t start = 0; start < g.wo; start += WB) {
        ConvBlock<KV, WB>(g, x, w, y, n, ho, std::min(start, g.wo - WB), k0);
      }
    }
  }
}

// The block width with the least work for a row of `wo` columns (ties: the wider), among `options`.
template <int KV, int W0, int W1, int W2>
void ConvRowsBest(const Geometry& g, const float* x, const float* w, float* y, int64_t r0, int64_t r1) {
  auto work = [&](int64_t wb) { return wb > g.wo ? INT64_MAX : (g.wo + wb - 1) / wb * wb; };
  if (W0 <= g.wo && work(W0) <= work(W1) && work(W0) <= work(W2)) ConvRows<KV, W0>(g, x, w, y, r0, r1);
  else if (W1 <= g.wo && work(W1) <= work(W2)) ConvRows<KV, W1>(g, x, w, y, r0, r1);
  else if (W2 <= g.wo) ConvRows<KV, W2>(g, x, w, y, r0, r1);
  else ConvRows<KV, 1>(g, x, w, y, r0, r1);
}

ffi::Error ConvImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                    ffi::ResultBuffer<ffi::F32> y, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t threads) {
  auto xd = x.dimensions();
  auto wd = w.dimensions();
  auto yd = y->dimensions();
  if (xd.size() != 4 || wd.size() != 4 || yd.size() != 4 || xd[0] != yd[0] || wd[2] != xd[3] ||
      wd[3] != yd[3]) {
    return ffi::Error::InvalidArgument("conv: x NHWC, w HWIO and y NHWC shapes do not match");
  }
  Geometry g{xd[0], xd[1], xd[2], xd[3], yd[1], yd[2], yd[3], wd[0], wd[1], sh, sw, ph, pw};
  if (g.k % 16 != 0) return ffi::Error::InvalidArgument("conv: output channels % 16 != 0");
  const int64_t rows = g.n * g.ho;
  const int64_t t = std::max<int64_t>(1, std::min<int64_t>(threads, rows));
  ParallelFor(pool, t, [&](int64_t q) {
    const int64_t r0 = rows * q / t, r1 = rows * (q + 1) / t;
    if (g.k % 64 == 0) ConvRowsBest<4, 6, 4, 2>(g, x.typed_data(), w.typed_data(), y->typed_data(), r0, r1);
    else if (g.k % 32 == 0) ConvRowsBest<2, 12, 8, 4>(g, x.typed_data(), w.typed_data(), y->typed_data(), r0, r1);
    else ConvRowsBest<1, 16, 8, 4>(g, x.typed_data(), w.typed_data(), y->typed_data(), r0, r1);
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxsprintConvF32, ConvImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("sh")
                                  .Attr<int64_t>("sw")
                                  .Attr<int64_t>("ph")
                                  .Attr<int64_t>("pw")
                                  .Attr<int64_t>("threads"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxsprintConvFilterGradF32, FilterGradImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("kh")
                                  .Attr<int64_t>("kw")
                                  .Attr<int64_t>("sh")
                                  .Attr<int64_t>("sw")
                                  .Attr<int64_t>("ph")
                                  .Attr<int64_t>("pw")
                                  .Attr<int64_t>("threads"));
