// CPU kernels for 2-D NHWC convolutions, as XLA FFI custom calls (see jaxsprint/train/cpu/kernels.py):
//   JaxsprintConvFilterGradF32  the filter gradient (below);
//   JaxsprintConvF32            the forward convolution (further down), also used for stride-1 input gradients:
//                               a direct loop, or Winograd's F(2x2, 3x3) for 3x3 stride-1 kernels;
//   (BatchNorm's kernels are in bn_kernels.cc.)
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
#include "kernels_common.h"

namespace {

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

void WinogradFilterGrad(ffi::ThreadPool& pool, const Geometry& g, const float* x, const float* dy, float* dw,
                        int64_t threads);  // below

ffi::Error FilterGradImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> dy,
                          ffi::ResultBuffer<ffi::F32> dw, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph,
                          int64_t pw, int64_t winograd, int64_t threads) {
  auto xd = x.dimensions();
  auto dd = dy.dimensions();
  if (xd.size() != 4 || dd.size() != 4 || xd[0] != dd[0]) {
    return ffi::Error::InvalidArgument("conv filter grad: x and dy must be NHWC with the same batch");
  }
  Geometry g{xd[0], xd[1], xd[2], xd[3], dd[1], dd[2], dd[3], kh, kw, sh, sw, ph, pw};
  if (g.k % 16 != 0) return ffi::Error::InvalidArgument("conv filter grad: output channels % 16 != 0");
  float* out = dw->typed_data();
  if (winograd) {
    if (kh != 3 || kw != 3 || sh != 1 || sw != 1 || g.c % 16 != 0) {
      return ffi::Error::InvalidArgument(
          "conv filter grad: Winograd needs a stride-1 3x3 kernel and input channels % 16 == 0");
    }
    WinogradFilterGrad(pool, g, x.typed_data(), dy.typed_data(), out, threads);
    return ffi::Error::Success();
  }
  const int64_t out_size = kh * kw * g.c * g.k;
  const int64_t t = std::max<int64_t>(1, std::min<int64_t>(threads, g.n));
  // Chunk q sums examples [n q / t, n (q + 1) / t) into its own accumulator (chunk 0: the output).
  Scratch partial(std::max<int64_t>(1, (t - 1) * out_size));
  ParallelFor(pool, t, [&](int64_t q) {
    float* acc = q == 0 ? out : partial.get() + (q - 1) * out_size;
    std::fill(acc, acc + out_size, 0.0f);
    const int64_t n0 = g.n * q / t, n1 = g.n * (q + 1) / t;
    if (g.k % 64 == 0) Accumulate<4, 6>(g, x.typed_data(), dy.typed_data(), acc, n0, n1);
    else if (g.k % 32 == 0) Accumulate<2, 8>(g, x.typed_data(), dy.typed_data(), acc, n0, n1);
    else Accumulate<1, 16>(g, x.typed_data(), dy.typed_data(), acc, n0, n1);
  });
  for (int64_t q = 1; q < t; ++q) {
    const float* p = partial.get() + (q - 1) * out_size;
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

// ---------------------------------------------------------------------------------------------------
// Winograd F(2x2, 3x3) for stride-1 3x3 convolutions with C % 16 == 0 (Lavin & Gray, "Fast Algorithms for
// Convolutional Neural Networks", CVPR 2016): every 2x2 block of output pixels ("tile") comes from a 4x4 input
// patch d as Y = A^T [U (.) V] A, with V = B^T d B per input channel and U = G g G^T per (input, output)
// channel pair, so the 16 products per tile and channel pair replace 36 multiply-adds (2.25x fewer). The 16
// element-wise products summed over input channels are 16 small matrix products [tiles x C] x [C x K], run
// with a block of RB tiles x 16*KV output channels in registers. Tiles are processed in blocks of kTiles
// whose transformed inputs and products stay in the core's L2 cache. Rounding differs from the direct sum
// (a few float32 ulps of the largest term; the transforms only add, subtract and halve).

constexpr int64_t kTiles = 24;      // tiles per block of the forward (a multiple of every RB below)
constexpr int64_t kGradTiles = 48;  // tiles per block of the filter gradient
// (measured best of 24 / 48 / 96 on ResNet-20's layers at batch 16, one thread)

// U[p][c][k] = (G g G^T)[p] for the 3x3 filter g = w[:, :, c, k]; K % 16 == 0.
void WinogradFilter(const float* w, int64_t c_n, int64_t k_n, float* u) {
  const v16 half = v16{} + 0.5f;
  for (int64_t c = 0; c < c_n; ++c) {
    for (int64_t k0 = 0; k0 < k_n; k0 += 16) {
      v16 g[3][3], t[4][3];
      for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 3; ++j) std::memcpy(&g[i][j], w + ((i * 3 + j) * c_n + c) * k_n + k0, 64);
      for (int j = 0; j < 3; ++j) {  // t = G g
        t[0][j] = g[0][j];
        t[1][j] = half * (g[0][j] + g[1][j] + g[2][j]);
        t[2][j] = half * (g[0][j] - g[1][j] + g[2][j]);
        t[3][j] = g[2][j];
      }
      for (int i = 0; i < 4; ++i) {  // (G g) G^T
        const v16 r[4] = {t[i][0], half * (t[i][0] + t[i][1] + t[i][2]), half * (t[i][0] - t[i][1] + t[i][2]),
                          t[i][2]};
        for (int j = 0; j < 4; ++j) std::memcpy(u + ((i * 4 + j) * c_n + c) * k_n + k0, &r[j], 64);
      }
    }
  }
}

// V[p][b][c] = (B^T d B)[p] for tiles t0 .. t0 + count - 1 (b = t - t0); rows b >= count are zeroed up to `rows`.
void WinogradInput(const Geometry& g, const float* x, int64_t t0, int64_t count, int64_t rows, int64_t th,
                   int64_t tw, float* v) {
  const int64_t stride_p = rows * g.c;
  for (int64_t b = count; b < rows; ++b)
    for (int p = 0; p < 16; ++p) std::fill(v + p * stride_p + b * g.c, v + p * stride_p + (b + 1) * g.c, 0.0f);
  // Tiles of one tile row share input rows, and neighbouring tiles two input columns: B^T d is computed once
  // per input column (cols[e] below, a sliding window of four) and each tile combines its four columns.
  for (int64_t b = 0; b < count;) {
    const int64_t t = t0 + b, n = t / (th * tw), ti = (t / tw) % th, tj = t % tw;
    const int64_t run = std::min(count - b, tw - tj);
    const int64_t r0 = 2 * ti - g.ph, s_first = 2 * tj - g.pw;
    const float* rowp[4];
    bool row_ok[4];
    for (int a = 0; a < 4; ++a) {
      row_ok[a] = r0 + a >= 0 && r0 + a < g.h;
      rowp[a] = x + (n * g.h + (row_ok[a] ? r0 + a : 0)) * g.w * g.c;
    }
    for (int64_t c0 = 0; c0 < g.c; c0 += 16) {
      auto column = [&](int64_t s, v16* out) {  // out[a] = (B^T d)[a] for input column s
        v16 d[4];
        const bool col_ok = s >= 0 && s < g.w;
        for (int a = 0; a < 4; ++a) {
          if (col_ok && row_ok[a]) std::memcpy(&d[a], rowp[a] + s * g.c + c0, 64);
          else d[a] = v16{};
        }
        out[0] = d[0] - d[2];
        out[1] = d[1] + d[2];
        out[2] = d[2] - d[1];
        out[3] = d[1] - d[3];
      };
      v16 cols[4][4];
      column(s_first, cols[0]);
      column(s_first + 1, cols[1]);
      for (int64_t j = 0; j < run; ++j) {
        const int64_t s0 = s_first + 2 * j;
        column(s0 + 2, cols[2]);
        column(s0 + 3, cols[3]);
        float* vb = v + (b + j) * g.c + c0;
        for (int a = 0; a < 4; ++a) {  // (B^T d) B
          const v16 r[4] = {cols[0][a] - cols[2][a], cols[1][a] + cols[2][a], cols[2][a] - cols[1][a],
                            cols[1][a] - cols[3][a]};
          for (int e = 0; e < 4; ++e) std::memcpy(vb + (a * 4 + e) * stride_p, &r[e], 64);
        }
        for (int a = 0; a < 4; ++a) {
          cols[0][a] = cols[2][a];
          cols[1][a] = cols[3][a];
        }
      }
    }
    b += run;
  }
}

// M[p][b][k0 .. k0 + 16 KV) = sum_c V[p][b][c] U[p][c][k0 ..], for RB rows b0 .. b0 + RB - 1.
template <int KV, int RB>
inline void WinogradProduct(const float* v, const float* u, float* m, int64_t c_n, int64_t k_n, int64_t b0,
                            int64_t k0) {
  v16 acc[RB][KV];
  for (int b = 0; b < RB; ++b)
    for (int q = 0; q < KV; ++q) acc[b][q] = v16{};
  const float* vb = v + b0 * c_n;
  for (int64_t c = 0; c < c_n; ++c) {
    v16 uv[KV];
    for (int q = 0; q < KV; ++q) {
      uv[q] = Load16(u + c * k_n + k0 + 16 * q);
      KeepInRegister(uv[q]);
    }
    for (int b = 0; b < RB; ++b) {
      const float xv = vb[b * c_n + c];
      for (int q = 0; q < KV; ++q) acc[b][q] += xv * uv[q];
    }
  }
  for (int b = 0; b < RB; ++b)
    for (int q = 0; q < KV; ++q) Store16(m + (b0 + b) * k_n + k0 + 16 * q, acc[b][q]);
}

// y for tiles t0 .. t0 + count - 1 from M[p][b][k]: Y = A^T M A, written where inside the output.
void WinogradOutput(const Geometry& g, const float* m, int64_t t0, int64_t count, int64_t rows, int64_t th,
                    int64_t tw, float* y) {
  const int64_t stride_p = rows * g.k;
  for (int64_t b = 0; b < count; ++b) {
    const int64_t t = t0 + b, n = t / (th * tw), ti = (t / tw) % th, tj = t % tw;
    const int64_t ho = 2 * ti, wo = 2 * tj;
    for (int64_t k0 = 0; k0 < g.k; k0 += 16) {
      v16 s[2][4];
      for (int e = 0; e < 4; ++e) {
        v16 q[4];
        for (int a = 0; a < 4; ++a) std::memcpy(&q[a], m + (a * 4 + e) * stride_p + b * g.k + k0, 64);
        s[0][e] = q[0] + q[1] + q[2];
        s[1][e] = q[1] - q[2] - q[3];
      }
      for (int a = 0; a < 2; ++a) {
        if (ho + a >= g.ho) break;
        const v16 o[2] = {s[a][0] + s[a][1] + s[a][2], s[a][1] - s[a][2] - s[a][3]};
        for (int e = 0; e < 2; ++e) {
          if (wo + e >= g.wo) break;
          std::memcpy(y + ((n * g.ho + ho + a) * g.wo + wo + e) * g.k + k0, &o[e], 64);
        }
      }
    }
  }
}

template <int KV, int RB>
void WinogradBlocks(const Geometry& g, const float* x, const float* u, float* y, int64_t blk0, int64_t blk1,
                    int64_t th, int64_t tw) {
  const int64_t tiles = g.n * th * tw;
  Scratch v(16 * kTiles * g.c), m(16 * kTiles * g.k);
  for (int64_t blk = blk0; blk < blk1; ++blk) {
    const int64_t t0 = blk * kTiles, count = std::min(kTiles, tiles - t0);
    const int64_t rows = (count + RB - 1) / RB * RB;
    WinogradInput(g, x, t0, count, rows, th, tw, v.get());
    for (int p = 0; p < 16; ++p) {
      const float* vp = v.get() + p * rows * g.c;
      const float* up = u + p * g.c * g.k;
      float* mp = m.get() + p * rows * g.k;
      for (int64_t k0 = 0; k0 < g.k; k0 += 16 * KV)
        for (int64_t b0 = 0; b0 < rows; b0 += RB) WinogradProduct<KV, RB>(vp, up, mp, g.c, g.k, b0, k0);
    }
    WinogradOutput(g, m.get(), t0, count, rows, th, tw, y);
  }
}

void Winograd(ffi::ThreadPool& pool, const Geometry& g, const float* x, const float* w, float* y, int64_t threads) {
  Scratch u(16 * g.c * g.k);
  WinogradFilter(w, g.c, g.k, u.get());
  const int64_t th = (g.ho + 1) / 2, tw = (g.wo + 1) / 2;
  const int64_t blocks = (g.n * th * tw + kTiles - 1) / kTiles;
  const int64_t t = std::max<int64_t>(1, std::min<int64_t>(threads, blocks));
  ParallelFor(pool, t, [&](int64_t q) {
    const int64_t b0 = blocks * q / t, b1 = blocks * (q + 1) / t;
    if (g.k % 64 == 0) WinogradBlocks<4, 6>(g, x, u.get(), y, b0, b1, th, tw);
    else if (g.k % 32 == 0) WinogradBlocks<2, 8>(g, x, u.get(), y, b0, b1, th, tw);
    else WinogradBlocks<1, 12>(g, x, u.get(), y, b0, b1, th, tw);
  });
}

// ---------------------------------------------------------------------------------------------------
// The filter gradient of a stride-1 3x3 convolution by the same F(2x2, 3x3) algorithm. Differentiating
// Y = A^T [(G g G^T) (.) V] A for one tile gives dL/dg = G^T [V (.) (A dY A^T)] G, so with Z = A dY A^T per
// tile and output channel, dW[., ., c, k] = G^T M[c, k] G where M[p][c][k] = sum_tiles V[p][t][c] Z[p][t][k]:
// 16 matrix products [C x tiles] x [tiles x K] reducing over the tiles, with 2.25x fewer multiplications
// than the direct sum over the 9 taps. Output positions past the output's edge (odd sizes) read dY = 0.

// Z[p][b][k] = (A dY A^T)[p] for tiles t0 .. t0 + count - 1.
void WinogradOutputGrad(const Geometry& g, const float* dy, int64_t t0, int64_t count, int64_t th, int64_t tw,
                        float* z) {
  const int64_t stride_p = count * g.k;
  for (int64_t b = 0; b < count; ++b) {
    const int64_t t = t0 + b, n = t / (th * tw), ti = (t / tw) % th, tj = t % tw;
    const int64_t ho = 2 * ti, wo = 2 * tj;
    for (int64_t k0 = 0; k0 < g.k; k0 += 16) {
      v16 d[2][2];
      for (int a = 0; a < 2; ++a)
        for (int e = 0; e < 2; ++e) {
          if (ho + a < g.ho && wo + e < g.wo) {
            std::memcpy(&d[a][e], dy + ((n * g.ho + ho + a) * g.wo + wo + e) * g.k + k0, 64);
          } else {
            d[a][e] = v16{};
          }
        }
      const v16 r[4][2] = {{d[0][0], d[0][1]}, {d[0][0] + d[1][0], d[0][1] + d[1][1]},
                           {d[0][0] - d[1][0], d[0][1] - d[1][1]}, {-d[1][0], -d[1][1]}};
      for (int a = 0; a < 4; ++a) {
        const v16 o[4] = {r[a][0], r[a][0] + r[a][1], r[a][0] - r[a][1], -r[a][1]};
        for (int e = 0; e < 4; ++e) std::memcpy(z + (a * 4 + e) * stride_p + b * g.k + k0, &o[e], 64);
      }
    }
  }
}

// acc[c0 .. c0 + RB)[k0 .. k0 + 16 KV) += sum_{b < count} V[b][c] Z[b][k] for one position p.
template <int KV, int RB>
inline void WinogradGradProduct(const float* v, const float* z, float* acc, int64_t c_n, int64_t k_n,
                                int64_t count, int64_t c0, int64_t k0) {
  v16 a[RB][KV];
  for (int r = 0; r < RB; ++r)
    for (int q = 0; q < KV; ++q) a[r][q] = Load16(acc + (c0 + r) * k_n + k0 + 16 * q);
  for (int64_t b = 0; b < count; ++b) {
    v16 zv[KV];
    for (int q = 0; q < KV; ++q) {
      zv[q] = Load16(z + b * k_n + k0 + 16 * q);
      KeepInRegister(zv[q]);
    }
    const float* vb = v + b * c_n + c0;
    for (int r = 0; r < RB; ++r) {
      const float xv = vb[r];
      for (int q = 0; q < KV; ++q) a[r][q] += xv * zv[q];
    }
  }
  for (int r = 0; r < RB; ++r)
    for (int q = 0; q < KV; ++q) Store16(acc + (c0 + r) * k_n + k0 + 16 * q, a[r][q]);
}

// acc[p][c][k] += M over tile blocks blk0 .. blk1 - 1.
template <int KV, int RB>
void WinogradGradBlocks(const Geometry& g, const float* x, const float* dy, float* acc, int64_t blk0,
                        int64_t blk1, int64_t th, int64_t tw) {
  const int64_t tiles = g.n * th * tw;
  Scratch v(16 * kGradTiles * g.c), z(16 * kGradTiles * g.k);
  for (int64_t blk = blk0; blk < blk1; ++blk) {
    const int64_t t0 = blk * kGradTiles, count = std::min(kGradTiles, tiles - t0);
    WinogradInput(g, x, t0, count, count, th, tw, v.get());
    WinogradOutputGrad(g, dy, t0, count, th, tw, z.get());
    for (int p = 0; p < 16; ++p) {
      const float* vp = v.get() + p * count * g.c;
      const float* zp = z.get() + p * count * g.k;
      float* ap = acc + p * g.c * g.k;
      for (int64_t k0 = 0; k0 < g.k; k0 += 16 * KV)
        for (int64_t c0 = 0; c0 < g.c; c0 += RB) WinogradGradProduct<KV, RB>(vp, zp, ap, g.c, g.k, count, c0, k0);
    }
  }
}

// dw[i][j][c][k] = (G^T M[c][k] G)[i][j].
void WinogradGradFilter(const float* m, int64_t c_n, int64_t k_n, float* dw) {
  const v16 half = v16{} + 0.5f;
  for (int64_t c = 0; c < c_n; ++c) {
    for (int64_t k0 = 0; k0 < k_n; k0 += 16) {
      v16 q[4][4], t[3][4];
      for (int a = 0; a < 4; ++a)
        for (int e = 0; e < 4; ++e) std::memcpy(&q[a][e], m + ((a * 4 + e) * c_n + c) * k_n + k0, 64);
      for (int e = 0; e < 4; ++e) {  // G^T M
        t[0][e] = q[0][e] + half * (q[1][e] + q[2][e]);
        t[1][e] = half * (q[1][e] - q[2][e]);
        t[2][e] = half * (q[1][e] + q[2][e]) + q[3][e];
      }
      for (int a = 0; a < 3; ++a) {  // (G^T M) G
        const v16 o[3] = {t[a][0] + half * (t[a][1] + t[a][2]), half * (t[a][1] - t[a][2]),
                          half * (t[a][1] + t[a][2]) + t[a][3]};
        for (int j = 0; j < 3; ++j) std::memcpy(dw + ((a * 3 + j) * c_n + c) * k_n + k0, &o[j], 64);
      }
    }
  }
}

void WinogradFilterGrad(ffi::ThreadPool& pool, const Geometry& g, const float* x, const float* dy, float* dw,
                        int64_t threads) {
  const int64_t th = (g.ho + 1) / 2, tw = (g.wo + 1) / 2;
  const int64_t blocks = (g.n * th * tw + kGradTiles - 1) / kGradTiles;
  const int64_t t = std::max<int64_t>(1, std::min<int64_t>(threads, blocks));
  const int64_t m_size = 16 * g.c * g.k;
  Scratch m(t * m_size);  // one accumulator per chunk, summed below
  std::fill(m.get(), m.get() + t * m_size, 0.0f);
  ParallelFor(pool, t, [&](int64_t q) {
    const int64_t b0 = blocks * q / t, b1 = blocks * (q + 1) / t;
    float* acc = m.get() + q * m_size;
    if (g.k % 64 == 0) WinogradGradBlocks<4, 4>(g, x, dy, acc, b0, b1, th, tw);
    else if (g.k % 32 == 0) WinogradGradBlocks<2, 8>(g, x, dy, acc, b0, b1, th, tw);
    else WinogradGradBlocks<1, 16>(g, x, dy, acc, b0, b1, th, tw);
  });
  for (int64_t q = 1; q < t; ++q) {
    const float* p = m.get() + q * m_size;
    for (int64_t e = 0; e < m_size; ++e) m.get()[e] += p[e];
  }
  WinogradGradFilter(m.get(), g.c, g.k, dw);
}

ffi::Error ConvImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> w,
                    ffi::ResultBuffer<ffi::F32> y, int64_t sh, int64_t sw, int64_t ph, int64_t pw,
                    int64_t winograd, int64_t threads) {
  auto xd = x.dimensions();
  auto wd = w.dimensions();
  auto yd = y->dimensions();
  if (xd.size() != 4 || wd.size() != 4 || yd.size() != 4 || xd[0] != yd[0] || wd[2] != xd[3] ||
      wd[3] != yd[3]) {
    return ffi::Error::InvalidArgument("conv: x NHWC, w HWIO and y NHWC shapes do not match");
  }
  Geometry g{xd[0], xd[1], xd[2], xd[3], yd[1], yd[2], yd[3], wd[0], wd[1], sh, sw, ph, pw};
  if (g.k % 16 != 0) return ffi::Error::InvalidArgument("conv: output channels % 16 != 0");
  if (winograd) {
    if (g.kh != 3 || g.kw != 3 || g.sh != 1 || g.sw != 1 || g.c % 16 != 0) {
      return ffi::Error::InvalidArgument("conv: Winograd needs a stride-1 3x3 kernel and input channels % 16 == 0");
    }
    Winograd(pool, g, x.typed_data(), w.typed_data(), y->typed_data(), threads);
    return ffi::Error::Success();
  }
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
                                  .Attr<int64_t>("winograd")
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
                                  .Attr<int64_t>("winograd")
                                  .Attr<int64_t>("threads"));
