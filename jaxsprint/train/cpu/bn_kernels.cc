// CPU kernels for BatchNorm's training pass, as XLA FFI custom calls (see jaxsprint/train/cpu/kernels.py and
// jaxsprint/train/cpu/fused.py):
//   JaxsprintChannelMomentsF32  per-channel sum and second central moment (BatchNorm's statistics) and
//   JaxsprintChannelProductsF32 per-channel sums of a and a * b (the gradient of its affine map), and
//   JaxsprintAffine(Add)ActF32  its output x * a + b (+ r), through ReLU or not, at the end.
//
#include "kernels_common.h"

namespace {

// ---------------------------------------------------------------------------------------------------
// Per-channel statistics over the rows of a [rows, C] array (BatchNorm's, and the sums of its gradient):
//   JaxsprintChannelMomentsF32:  out[0, c] = sum_r a[r, c],  out[1, c] = sum_r (a[r, c] - mean_c)^2
//   JaxsprintChannelProductsF32: out[0, c] = sum_r a[r, c],  out[1, c] = sum_r a[r, c] * b[r, c]
// each in one pass over the operands (XLA:CPU reads them once per sum, and materializes a - mean for the
// second moment). Rows are split over the threads in blocks of kSumRows rows. A block is summed in float
// vectors (four independent accumulators); for the moments, about the block's first row (a sample of the
// data, so the block's second moment suffers no cancellation), and blocks are merged in double with Chan et
// al.'s pairwise update, so the result matches a two-pass computation however far the mean is from zero.
// The products' blocks are added in double.
constexpr int64_t kSumRows = 64;

// The sums over rows [rb, re) of channels [c0, c0 + 16): s1 = sum (a - shift), s2 = sum (a - shift)^2 (Moments),
// or s1 = sum a, s2 = sum a * b (products; shift unused).
template <bool Moments>
inline void BlockSums(const float* a, const float* b, int64_t c_n, int64_t c0, int64_t rb, int64_t re, v16 shift,
                      v16& t1, v16& t2) {
  v16 s1[4] = {}, s2[4] = {};
  int64_t r = rb;
  for (; r + 4 <= re; r += 4) {
    for (int u = 0; u < 4; ++u) {
      const v16 av = Load16(a + (r + u) * c_n + c0);
      if (Moments) {
        const v16 d = av - shift;
        s1[u] += d;
        s2[u] += d * d;
      } else {
        s1[u] += av;
        s2[u] += av * Load16(b + (r + u) * c_n + c0);
      }
    }
  }
  for (; r < re; ++r) {
    const v16 av = Load16(a + r * c_n + c0);
    if (Moments) {
      const v16 d = av - shift;
      s1[0] += d;
      s2[0] += d * d;
    } else {
      s1[0] += av;
      s2[0] += av * Load16(b + r * c_n + c0);
    }
  }
  t1 = (s1[0] + s1[1]) + (s1[2] + s1[3]);
  t2 = (s2[0] + s2[1]) + (s2[2] + s2[3]);
}

// Thread part: rows [r0, r1) into acc (double [3, C]): moments: count, mean, M2; products: -, sum a, sum a b.
template <bool Moments>
void ChannelStatsRows(const float* a, const float* b, int64_t c_n, int64_t r0, int64_t r1, double* acc) {
  for (int64_t rb = r0; rb < r1; rb += kSumRows) {
    const int64_t re = std::min(r1, rb + kSumRows);
    const double nb = static_cast<double>(re - rb);
    for (int64_t c0 = 0; c0 < c_n; c0 += 16) {
      const v16 shift = Moments ? Load16(a + rb * c_n + c0) : v16{};
      v16 t1, t2;
      BlockSums<Moments>(a, b, c_n, c0, rb, re, shift, t1, t2);
      for (int l = 0; l < 16; ++l) {
        const int64_t c = c0 + l;
        if (Moments) {  // merge the block (nb, mean_b, m2_b) into (n, mean, M2)
          const double mean_b = shift[l] + t1[l] / nb;
          const double m2_b = std::max(0.0, static_cast<double>(t2[l]) - static_cast<double>(t1[l]) * t1[l] / nb);
          const double n = acc[c], delta = mean_b - acc[c_n + c], tot = n + nb;
          acc[c] = tot;
          acc[c_n + c] += delta * nb / tot;
          acc[2 * c_n + c] += m2_b + delta * delta * n * nb / tot;
        } else {
          acc[c_n + c] += t1[l];
          acc[2 * c_n + c] += t2[l];
        }
      }
    }
  }
}

template <bool Moments>
ffi::Error ChannelStats(ffi::ThreadPool& pool, const float* a, const float* b, int64_t rows, int64_t c_n,
                        float* out, int64_t threads) {
  if (c_n % 16 != 0) return ffi::Error::InvalidArgument("channel statistics: channels % 16 != 0");
  const int64_t blocks = (rows + kSumRows - 1) / kSumRows;
  const int64_t t = std::max<int64_t>(1, std::min<int64_t>(threads, blocks));
  std::unique_ptr<double[]> acc(new double[t * 3 * c_n]());
  ParallelFor(pool, t, [&](int64_t q) {
    const int64_t r0 = std::min(rows, blocks * q / t * kSumRows);
    const int64_t r1 = std::min(rows, blocks * (q + 1) / t * kSumRows);
    ChannelStatsRows<Moments>(a, b, c_n, r0, r1, acc.get() + q * 3 * c_n);
  });
  for (int64_t c = 0; c < c_n; ++c) {
    double n = 0.0, mean = 0.0, m2 = 0.0, s1 = 0.0, s2 = 0.0;
    for (int64_t q = 0; q < t; ++q) {
      const double* p = acc.get() + q * 3 * c_n;
      if (Moments) {
        if (p[c] == 0.0) continue;
        const double tot = n + p[c], delta = p[c_n + c] - mean;
        mean += delta * p[c] / tot;
        m2 += p[2 * c_n + c] + delta * delta * n * p[c] / tot;
        n = tot;
      } else {
        s1 += p[c_n + c];
        s2 += p[2 * c_n + c];
      }
    }
    out[c] = static_cast<float>(Moments ? n * mean : s1);
    out[c_n + c] = static_cast<float>(Moments ? m2 : s2);
  }
  return ffi::Error::Success();
}

bool StatsShapes(ffi::Span<const int64_t> ad, ffi::Span<const int64_t> od) {
  return ad.size() >= 1 && od.size() == 2 && od[0] == 2 && od[1] == ad[ad.size() - 1];
}

ffi::Error ChannelMomentsImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> a, ffi::ResultBuffer<ffi::F32> out,
                              int64_t threads) {
  if (!StatsShapes(a.dimensions(), out->dimensions())) {
    return ffi::Error::InvalidArgument("channel_moments: out must be [2, C] for a of shape [..., C]");
  }
  const int64_t c_n = out->dimensions()[1];
  return ChannelStats<true>(pool, a.typed_data(), nullptr, c_n ? a.element_count() / c_n : 0, c_n,
                            out->typed_data(), threads);
}

ffi::Error ChannelProductsImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> a, ffi::Buffer<ffi::F32> b,
                               ffi::ResultBuffer<ffi::F32> out, int64_t threads) {
  if (!StatsShapes(a.dimensions(), out->dimensions()) || b.element_count() != a.element_count()) {
    return ffi::Error::InvalidArgument("channel_products: a and b of one shape [..., C], out [2, C]");
  }
  const int64_t c_n = out->dimensions()[1];
  return ChannelStats<false>(pool, a.typed_data(), b.typed_data(), c_n ? a.element_count() / c_n : 0, c_n,
                             out->typed_data(), threads);
}


// ---------------------------------------------------------------------------------------------------
// BatchNorm's output in training: y = x * a + b (+ r) per channel, then max(y, 0) if relu; one pass.
// XLA would fuse the same loop, but then also re-fuse (duplicate) it into every consumer of y: the backward
// pass's ReLU masks recomputed each residual block's output from the stage's first convolution onwards.
// As a custom call's result, y is computed once and read back.
template <bool Residual, bool Relu>
void AffineActRows(const float* x, const float* a, const float* b, const float* r, float* y, int64_t c_n,
                   int64_t r0, int64_t r1) {
  for (int64_t row = r0; row < r1; ++row) {
    const int64_t o = row * c_n;
    for (int64_t c0 = 0; c0 < c_n; c0 += 16) {
      v16 v = Load16(x + o + c0) * Load16(a + c0) + Load16(b + c0);
      if (Residual) v += Load16(r + o + c0);
      if (Relu) v = v > 0.0f ? v : v16{};
      Store16(y + o + c0, v);
    }
  }
}

ffi::Error AffineAct(ffi::ThreadPool& pool, const float* x, const float* a, const float* b, const float* r,
                     float* y, int64_t rows, int64_t c_n, int64_t relu, int64_t threads) {
  if (c_n % 16 != 0) return ffi::Error::InvalidArgument("affine_act: channels % 16 != 0");
  const int64_t t = std::max<int64_t>(1, std::min<int64_t>(threads, rows / 256));
  ParallelFor(pool, t, [&](int64_t q) {
    const int64_t r0 = rows * q / t, r1 = rows * (q + 1) / t;
    if (r != nullptr) {
      if (relu) AffineActRows<true, true>(x, a, b, r, y, c_n, r0, r1);
      else AffineActRows<true, false>(x, a, b, r, y, c_n, r0, r1);
    } else {
      if (relu) AffineActRows<false, true>(x, a, b, r, y, c_n, r0, r1);
      else AffineActRows<false, false>(x, a, b, r, y, c_n, r0, r1);
    }
  });
  return ffi::Error::Success();
}

bool AffineShapes(ffi::Span<const int64_t> xd, ffi::Span<const int64_t> ad, ffi::Span<const int64_t> bd) {
  return xd.size() >= 1 && ad.size() == 1 && bd.size() == 1 && ad[0] == xd[xd.size() - 1] && bd[0] == ad[0];
}

ffi::Error AffineActImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> a,
                         ffi::Buffer<ffi::F32> b, ffi::ResultBuffer<ffi::F32> y, int64_t relu, int64_t threads) {
  if (!AffineShapes(x.dimensions(), a.dimensions(), b.dimensions()) || y->element_count() != x.element_count()) {
    return ffi::Error::InvalidArgument("affine_act: x [..., C], a [C], b [C], y of x's shape");
  }
  const int64_t c_n = a.dimensions()[0];
  return AffineAct(pool, x.typed_data(), a.typed_data(), b.typed_data(), nullptr, y->typed_data(),
                   c_n ? x.element_count() / c_n : 0, c_n, relu, threads);
}

ffi::Error AffineAddActImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> a,
                            ffi::Buffer<ffi::F32> b, ffi::Buffer<ffi::F32> r, ffi::ResultBuffer<ffi::F32> y,
                            int64_t relu, int64_t threads) {
  if (!AffineShapes(x.dimensions(), a.dimensions(), b.dimensions()) || y->element_count() != x.element_count() ||
      r.element_count() != x.element_count()) {
    return ffi::Error::InvalidArgument("affine_act: x [..., C], a [C], b [C], r and y of x's shape");
  }
  const int64_t c_n = a.dimensions()[0];
  return AffineAct(pool, x.typed_data(), a.typed_data(), b.typed_data(), r.typed_data(), y->typed_data(),
                   c_n ? x.element_count() / c_n : 0, c_n, relu, threads);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxsprintChannelMomentsF32, ChannelMomentsImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("threads"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxsprintChannelProductsF32, ChannelProductsImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("threads"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxsprintAffineActF32, AffineActImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("relu")
                                  .Attr<int64_t>("threads"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxsprintAffineAddActF32, AffineAddActImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("relu")
                                  .Attr<int64_t>("threads"));
