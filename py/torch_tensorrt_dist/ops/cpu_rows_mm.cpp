// Products of a few token rows with a row-major weight, on the CPU: y = x @ w^T.
//
// tensorrt_dist_gemm::rows_mm(x, w) -> y
//   x [M, K] float32 (contiguous)  the step's token rows
//   w [N, K] float32 (contiguous)  a linear layer's weight, row-major [out, in]
//   -> y [M, N] float32 (contiguous)
//
// A step of one token row is bound by reading the weights; one of 5 to 8 rows (a speculative
// verify call, a decode step of a batch) by its fused multiply-adds, one a cycle on a core of
// Zen 4 (AMD EPYC): each weight vector is loaded once into a register and used for a block of
// up to 8 rows, each row's vector loaded once for the block's outputs, each (row, output) pair
// its own 16-lane accumulator (a block of rows x outputs: 8 to 16 independent chains of fused
// multiply-adds in registers). Past 8 rows, each block of rows reads the same 24 weight rows,
// which stay in the L1 or L2 cache for the next block of rows, so each weight is read from
// memory once a call. Each output is the dot product of the two rows in a fixed order (16 lane
// sums along K, then added as a tree): a row's result does not depend on the other rows, on
// how the rows were blocked or on the threads; it is ``mm``'s to float32 rounding.
// Built at first use by ``cpu_rows_mm.py`` (torch's C++ extension loader, -march=native; the
// vector type is split by the compiler where the CPU has no 512-bit registers).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>

namespace {

typedef float v16f __attribute__((vector_size(64)));
typedef float v8f __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));

constexpr int64_t kLanes = 16;
constexpr int64_t kAhead = 2048;  // floats

inline v16f load16(const float* p) {
  v16f v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// the first n (< 16) floats of p, zeros after
inline v16f load_tail(const float* p, int64_t n) {
  v16f v = {};
  std::memcpy(&v, p, sizeof(float) * n);
  return v;
}

inline float sum16(v16f v) {
  const v8f half = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                   __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const v4f quarter = __builtin_shufflevector(half, half, 0, 1, 2, 3) +
                      __builtin_shufflevector(half, half, 4, 5, 6, 7);
  return (quarter[0] + quarter[2]) + (quarter[1] + quarter[3]);
}

// Two vectors' lanes added pairwise, a's then b's: the levels of a tree that adds up 16
// vectors at once, lane j of the last level the sum of vector j. Each vector's lanes are added
// in the order of ``sum16`` (lane i + lane i + 8, then i + 4, i + 2, i + 1), whichever vectors
// share the tree.
inline v16f level1(v16f a, v16f b) {
  return __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
         __builtin_shufflevector(a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30,
                                 31);
}
inline v16f level2(v16f a, v16f b) {
  return __builtin_shufflevector(a, b, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
         __builtin_shufflevector(a, b, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
}
inline v16f level3(v16f a, v16f b) {
  return __builtin_shufflevector(a, b, 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
         __builtin_shufflevector(a, b, 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
}
inline v16f level4(v16f a, v16f b) {
  return __builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
         __builtin_shufflevector(a, b, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}

// the sums of C (<= 16) vectors: out[j] = sum16(v[j])
template <int C>
inline void sums(const v16f* v, float* out) {
  v16f a[16];
  for (int j = 0; j < 16; ++j) a[j] = j < C ? v[j] : v16f{};
  v16f b[8], c[4], d[2];
  for (int j = 0; j < 8; ++j) b[j] = level1(a[2 * j], a[2 * j + 1]);
  for (int j = 0; j < 4; ++j) c[j] = level2(b[2 * j], b[2 * j + 1]);
  for (int j = 0; j < 2; ++j) d[j] = level3(c[2 * j], c[2 * j + 1]);
  const v16f e = level4(d[0], d[1]);
  for (int j = 0; j < C; ++j) out[j] = e[j];
}

// out[j] = sum16(v[j]) for C vectors, 16 a tree
template <int C>
inline void all_sums(const v16f* v, float* out) {
  if constexpr (C > 16) {
    sums<16>(v, out);
    all_sums<C - 16>(v + 16, out + 16);
  } else {
    sums<C>(v, out);
  }
}

// v held in a register: GCC otherwise folds the loads of a vector used by several products
// into each of them (5 rows x 3 outputs: 18 vector loads for 15 products, where a core of
// Zen 4 loads one 64-byte vector a cycle), and the loads, not the products, bound the loop
inline void in_register(v16f& v) {
#if defined(__AVX512F__)
  asm("" : "+v"(v));
#else
  (void)v;
#endif
}

// y[m, n0 + j] for the MB rows at x (row stride K) and the NB weight rows at w (n0's)
template <int MB, int NB>
inline void block(const float* __restrict x, const float* __restrict w, float* __restrict y,
                  int64_t K, int64_t N) {
  v16f acc[MB][NB];  // zeroed in registers (``= {}`` was a memset call of the array)
  for (int m = 0; m < MB; ++m)
    for (int j = 0; j < NB; ++j) acc[m][j] = v16f{};
  const int64_t full = K - K % kLanes;
  for (int64_t k = 0; k < full; k += kLanes) {
    v16f wv[NB];
    for (int j = 0; j < NB; ++j) {
      wv[j] = load16(w + j * K + k);
      in_register(wv[j]);
    }
    // the weights 8 KiB ahead, from the outer caches: a step of several rows computes while
    // they come (without, 8 rows cost 1.5x one row; with, 1.2x: the demo model's shapes on
    // the Xeon of the first form)
    for (int j = 0; j < NB; ++j) __builtin_prefetch(w + j * K + k + kAhead, 0, 3);
    for (int m = 0; m < MB; ++m) {
      v16f xv = load16(x + m * K + k);
      in_register(xv);
      for (int j = 0; j < NB; ++j) acc[m][j] += xv * wv[j];
    }
  }
  if (full < K) {
    const int64_t rest = K - full;
    v16f wv[NB];
    for (int j = 0; j < NB; ++j) wv[j] = load_tail(w + j * K + full, rest);
    for (int m = 0; m < MB; ++m) {
      const v16f xv = load_tail(x + m * K + full, rest);
      for (int j = 0; j < NB; ++j) acc[m][j] += xv * wv[j];
    }
  }
  float out[MB * NB];
  all_sums<MB * NB>(&acc[0][0], out);
  for (int m = 0; m < MB; ++m)
    for (int j = 0; j < NB; ++j) y[m * N + j] = out[m * NB + j];
}

// outputs [n, n1) of the MB rows at x: NB at a time, then the last ones in one smaller block
template <int MB, int NB>
void row_block(const float* x, const float* w, float* y, int64_t K, int64_t N, int64_t n,
               int64_t n1) {
  for (; n + NB <= n1; n += NB) block<MB, NB>(x, w + n * K, y + n, K, N);
  if constexpr (NB > 1)
    if (n < n1) row_block<MB, NB - 1>(x, w, y, K, N, n, n1);
}

// outputs [n0, n1) of every row, in blocks of rows x NB outputs: 8 rows at a time, then the
// rest; past 8 rows, 24 outputs at a time, their weights read from memory once for all the
// rows. Each row count's NB is the fastest measured (one thread of an AMD EPYC, Zen 4, the
// demo model's 29 products, in-cache weights): 2 or 3 weight rows a block from 3 rows on;
// blocks of 4 to 6 weight rows (more accumulators) cost up to 15% more there
void products(const float* x, const float* w, float* y, int64_t M, int64_t K, int64_t N,
              int64_t n0, int64_t n1) {
  const int64_t chunk = M > 8 ? 24 : n1 - n0;
  for (int64_t n = n0; n < n1; n += chunk) {
    const int64_t end = std::min(n1, n + chunk);
    int64_t m = 0;
    for (; m + 8 <= M; m += 8) row_block<8, 2>(x + m * K, w, y + m * N, K, N, n, end);
    const float* xm = x + m * K;
    float* ym = y + m * N;
    switch (M - m) {
      case 7: row_block<7, 2>(xm, w, ym, K, N, n, end); break;
      case 6: row_block<6, 2>(xm, w, ym, K, N, n, end); break;
      case 5: row_block<5, 3>(xm, w, ym, K, N, n, end); break;
      case 4: row_block<4, 3>(xm, w, ym, K, N, n, end); break;
      case 3: row_block<3, 3>(xm, w, ym, K, N, n, end); break;
      case 2: row_block<2, 4>(xm, w, ym, K, N, n, end); break;
      case 1: row_block<1, 8>(xm, w, ym, K, N, n, end); break;
      default: break;
    }
  }
}

at::Tensor rows_mm(const at::Tensor& x, const at::Tensor& w) {
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), "rows_mm: CPU tensors only");
  TORCH_CHECK(x.scalar_type() == at::kFloat && w.scalar_type() == at::kFloat,
              "rows_mm: float32 only");
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "rows_mm: x ", x.sizes(),
              " and w ", w.sizes(), " are not [M, K] and [N, K]");
  const auto xc = x.contiguous(), wc = w.contiguous();
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  auto y = at::empty({M, N}, x.options());
  if (M == 0 || N == 0) return y;
  if (K == 0) return y.zero_();
  const float* xd = xc.data_ptr<float>();
  const float* wd = wc.data_ptr<float>();
  float* yd = y.data_ptr<float>();
  // a thread's share: whole blocks of 8 outputs, at least 64 outputs x 256 inputs of work
  const int64_t grain = std::max<int64_t>(8, ((16384 / std::max<int64_t>(K, 1)) + 7) / 8 * 8);
  at::parallel_for(0, (N + 7) / 8, grain / 8, [&](int64_t b0, int64_t b1) {
    products(xd, wd, yd, M, K, N, b0 * 8, std::min(N, b1 * 8));
  });
  return y;
}

}  // namespace

TORCH_LIBRARY(tensorrt_dist_gemm, m) { m.def("rows_mm(Tensor x, Tensor w) -> Tensor"); }

TORCH_LIBRARY_IMPL(tensorrt_dist_gemm, CPU, m) { m.impl("rows_mm", rows_mm); }
