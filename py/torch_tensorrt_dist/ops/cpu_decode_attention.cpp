// Attention of a few query tokens a row over the paged KV cache, on the CPU: a decode step
// (one token a row) or a speculative verify call (k + 1 tokens a row), read straight from the
// block pools (no gathered copy of the past, no concatenated keys).
//
// tensorrt_dist_cpu::decode_attention(q, k_pool, v_pool, past, k_own, v_own, mask, scale)
//   q      [R, Hq, S, D]     the step's queries (S tokens a row)
//   k_pool [N, bs, Hkv, D]   a layer's block pools (contiguous)
//   v_pool [N, bs, Hkv, D]
//   past   [R, NB] int64     each row's past blocks, padded with the null block
//   k_own  [R, Hkv, S, D]    the step's own keys and values (written to the pools later)
//   v_own  [R, Hkv, S, D]
//   mask   [R, 1, S, NB * bs + S] bool: each query's view of the past's NB * bs positions,
//                            then of the own tokens (causal: query s sees own tokens <= s)
//   -> [R, Hq, S, D]
//
// The same computation as ``scaled_dot_product_attention`` of the queries (grouped-query
// heads: query head i reads KV head i / (Hq / Hkv)) over the gathered past then the own tokens
// under ``mask`` (``models/paged.py``: ``paged_attention``); softmax in float32 whatever the
// dtype. Each (row, KV head) is computed whole by one thread, in a fixed order, each query
// over the keys its mask row lets it see, in order: a query's result does not depend on the
// other rows of the step, on the number of threads, or on the tokens after it (a verify
// call's first query is the decode step's). The dot
// products keep 16 partial sums, added as a tree (vectorized without letting the compiler
// reassociate: the order is the source's).
// Built at first use by ``cpu_attention.py`` (torch's C++ extension loader).

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace {

constexpr int64_t kLanes = 16;

// exp(x) for x <= 0 (a score minus the row's largest): Cephes' single-precision polynomial
// (about 1 ulp), written with operations the compiler vectorizes (libm's expf is a call a key).
inline float exp_nonpositive(float x) {
  x = x < -87.0f ? -87.0f : x;  // below: 0 within float (e^-87 is 1.6e-38)
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  x -= n * 0.693359375f;
  x -= n * -2.12194440e-4f;
  const float z = x * x;
  float y = 1.9875691500e-4f;
  y = y * x + 1.3981999507e-3f;
  y = y * x + 8.3334519073e-3f;
  y = y * x + 4.1665795894e-2f;
  y = y * x + 1.6666665459e-1f;
  y = y * x + 5.0000001201e-1f;
  y = y * z + x + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;  // 2^n
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return y * scale;
}

// q . k over D elements: 16 partial sums, then added as a tree (4 dependent adds; vectorized
// without letting the compiler reassociate: the order is the source's)
template <typename T, int64_t DC>
inline float dot(const float* __restrict q, const T* __restrict k, int64_t d_runtime) {
  const int64_t D = DC > 0 ? DC : d_runtime;
  float part[kLanes] = {0.f};
  int64_t d = 0;
  for (; d + kLanes <= D; d += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) part[l] += q[d + l] * static_cast<float>(k[d + l]);
  for (int64_t l = 0; d + l < D; ++l) part[l] += q[d + l] * static_cast<float>(k[d + l]);
  float half[kLanes / 2];
  for (int64_t l = 0; l < kLanes / 2; ++l) half[l] = part[l] + part[l + kLanes / 2];
  float quarter[kLanes / 4];
  for (int64_t l = 0; l < kLanes / 4; ++l) quarter[l] = half[l] + half[l + kLanes / 4];
  return (quarter[0] + quarter[2]) + (quarter[1] + quarter[3]);
}

// a[0:D] += sum over t of w[t] * v[t][0:D], in the order of t (a zeroed by the caller)
template <typename T, int64_t DC>
inline void weighted_sum(float* __restrict a, const float* __restrict w, const T* const* v,
                         int64_t n, int64_t d_runtime) {
  const int64_t D = DC > 0 ? DC : d_runtime;
  for (int64_t t = 0; t < n; ++t) {
    const T* __restrict vt = v[t];
    for (int64_t d = 0; d < D; ++d) a[d] += w[t] * static_cast<float>(vt[d]);
  }
}

// pi[t] = q . k[t] for the n keys, each as ``dot`` (the vector forms below: 16 keys at a time)
template <typename T, int64_t DC>
inline void scores(float* __restrict pi, const float* __restrict q, const T* const* k, int64_t n,
                   int64_t d_runtime) {
  for (int64_t t = 0; t < n; ++t) pi[t] = dot<T, DC>(q, k[t], d_runtime);
}

// float32 or bfloat16 with D a multiple of 16: the same sums in GCC/Clang vector types (16
// lanes; the compiler maps them on the CPU's registers), kept in registers and added as the
// same tree. A bfloat16 is a float32's upper half: each key's lanes are widened in registers
// (exact); the generic form's element-wise conversions were not vectorized (a verify call's
// attention at 8 rows cost 1.2 ms a layer, 2026-12-07, the demo model in bfloat16).
typedef float v16f __attribute__((vector_size(64)));
typedef float v8f __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));
typedef uint16_t v16u16 __attribute__((vector_size(32)));
typedef uint32_t v16u32 __attribute__((vector_size(64)));

inline v16f load16(const float* p) {
  v16f v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline v16f load16(const c10::BFloat16* p) {
  v16u16 h;
  std::memcpy(&h, p, sizeof(h));
  const v16u32 w = __builtin_convertvector(h, v16u32) << 16;
  v16f v;
  std::memcpy(&v, &w, sizeof(v));
  return v;
}

// the 16 lane sums of q . k
template <typename T, int64_t D>
inline v16f lanes16(const float* __restrict q, const T* __restrict k) {
  v16f part = load16(q) * load16(k);
  for (int64_t d = 16; d < D; d += 16) part += load16(q + d) * load16(k + d);
  return part;
}

template <typename T, int64_t D>
inline float dot16(const float* __restrict q, const T* __restrict k) {
  const v16f part = lanes16<T, D>(q, k);
  const v8f half = __builtin_shufflevector(part, part, 0, 1, 2, 3, 4, 5, 6, 7) +
                   __builtin_shufflevector(part, part, 8, 9, 10, 11, 12, 13, 14, 15);
  const v4f quarter = __builtin_shufflevector(half, half, 0, 1, 2, 3) +
                      __builtin_shufflevector(half, half, 4, 5, 6, 7);
  return (quarter[0] + quarter[2]) + (quarter[1] + quarter[3]);
}

// 16 keys' lane sums p[0..15] added as dot16's tree, each key's adds the same (the same
// operands, so the same bits), four steps over all 16 at once instead of 16 trees: lane j of
// the result is key j's dot product
inline v16f tree16(const v16f* p) {
  v16f x[8], y[4], z[2];
  for (int j = 0; j < 8; ++j)  // lanes 0-7: key 2j's half, 8-15: key 2j + 1's
    x[j] = __builtin_shufflevector(p[2 * j], p[2 * j + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18,
                                   19, 20, 21, 22, 23) +
           __builtin_shufflevector(p[2 * j], p[2 * j + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25,
                                   26, 27, 28, 29, 30, 31);
  for (int j = 0; j < 4; ++j)  // lanes 4m..4m+3: key 4j + m's quarter
    y[j] = __builtin_shufflevector(x[2 * j], x[2 * j + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18,
                                   19, 24, 25, 26, 27) +
           __builtin_shufflevector(x[2 * j], x[2 * j + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22,
                                   23, 28, 29, 30, 31);
  for (int j = 0; j < 2; ++j)  // lanes 2m, 2m + 1: key 8j + m's q0 + q2, q1 + q3
    z[j] = __builtin_shufflevector(y[2 * j], y[2 * j + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20,
                                   21, 24, 25, 28, 29) +
           __builtin_shufflevector(y[2 * j], y[2 * j + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22,
                                   23, 26, 27, 30, 31);
  return __builtin_shufflevector(z[0], z[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26,
                                 28, 30) +
         __builtin_shufflevector(z[0], z[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29,
                                 31);
}

template <typename T, int64_t D>
inline void scores16(float* __restrict pi, const float* __restrict q, const T* const* k,
                     int64_t n) {
  int64_t t = 0;
  for (; t + 16 <= n; t += 16) {
    v16f p[16];
    for (int j = 0; j < 16; ++j) p[j] = lanes16<T, D>(q, k[t + j]);
    const v16f out = tree16(p);
    std::memcpy(pi + t, &out, sizeof(out));
  }
  for (; t < n; ++t) pi[t] = dot16<T, D>(q, k[t]);
}

// the accumulators in registers, each value widened
template <typename T, int64_t D>
inline void weighted_sum16(float* __restrict a, const float* __restrict w, const T* const* v,
                           int64_t n) {
  v16f acc[D / 16] = {};
  for (int64_t t = 0; t < n; ++t)
    for (int64_t c = 0; c < D / 16; ++c) acc[c] += w[t] * load16(v[t] + 16 * c);
  std::memcpy(a, acc, sizeof(acc));
}

#define VECTOR_FORMS(T, DV)                                                                    \
  template <>                                                                                  \
  inline float dot<T, DV>(const float* __restrict q, const T* __restrict k, int64_t) {         \
    return dot16<T, DV>(q, k);                                                                 \
  }                                                                                            \
  template <>                                                                                  \
  inline void scores<T, DV>(float* __restrict pi, const float* __restrict q, const T* const* k, \
                            int64_t n, int64_t) {                                              \
    scores16<T, DV>(pi, q, k, n);                                                              \
  }                                                                                            \
  template <>                                                                                  \
  inline void weighted_sum<T, DV>(float* __restrict a, const float* __restrict w,             \
                                  const T* const* v, int64_t n, int64_t) {                     \
    weighted_sum16<T, DV>(a, w, v, n);                                                         \
  }
VECTOR_FORMS(float, 32)
VECTOR_FORMS(float, 64)
VECTOR_FORMS(float, 128)
VECTOR_FORMS(c10::BFloat16, 32)
VECTOR_FORMS(c10::BFloat16, 64)
VECTOR_FORMS(c10::BFloat16, 128)
#undef VECTOR_FORMS

// the largest of p[0:n] (n >= 1): 16 lanes' largest, then theirs (the same value as the
// scalar loop's, which was a chain of n dependent comparisons)
inline float largest(const float* p, int64_t n) {
  float mx = p[0];
  int64_t t = 1;
  if (n >= 16) {
    v16f m = load16(p);
    for (t = 16; t + 16 <= n; t += 16) {
      const v16f x = load16(p + t);
      m = x > m ? x : m;
    }
    for (int l = 0; l < 16; ++l) mx = m[l] > mx ? m[l] : mx;
  }
  for (; t < n; ++t) mx = p[t] > mx ? p[t] : mx;
  return mx;
}

// the softmax of G query heads over the n seen keys (head g's exponentials at p + g L,
// normalized here) and their weighted sums of the values (at a + g D, zeroed by the caller):
// each head's adds in the order of the keys, as one head alone, the G heads' chains of
// dependent adds side by side (one head's sums were bound by their adds' latency)
template <int G, typename T, int64_t DC>
inline void head_sums(float* __restrict a, float* __restrict p, int64_t L, const T* const* v,
                      int64_t n, int64_t d_runtime) {
  float sum[G] = {};
  for (int64_t t = 0; t < n; ++t)
    for (int g = 0; g < G; ++g) sum[g] += p[g * L + t];
  for (int g = 0; g < G; ++g) {
    const float inv = 1.f / sum[g];
    for (int64_t t = 0; t < n; ++t) p[g * L + t] *= inv;
  }
  constexpr bool vector = (std::is_same_v<T, float> || std::is_same_v<T, c10::BFloat16>) &&
                          (DC == 32 || DC == 64 || DC == 128);
  if constexpr (vector) {  // weighted_sum16's sums, each value read once for the G heads
    v16f out[G][DC / 16] = {};
    for (int64_t t = 0; t < n; ++t)
      for (int64_t c = 0; c < DC / 16; ++c) {
        const v16f vt = load16(v[t] + 16 * c);
        for (int g = 0; g < G; ++g) out[g][c] += p[g * L + t] * vt;
      }
    for (int g = 0; g < G; ++g) std::memcpy(a + g * DC, out[g], sizeof(out[g]));
  } else {
    const int64_t D = DC > 0 ? DC : d_runtime;
    for (int g = 0; g < G; ++g) weighted_sum<T, DC>(a + g * D, p + g * L, v, n, D);
  }
}

template <typename T, int64_t DC>
void run(const at::Tensor& q, const at::Tensor& k_pool, const at::Tensor& v_pool,
         const at::Tensor& past, const at::Tensor& k_own, const at::Tensor& v_own,
         const at::Tensor& mask, at::Tensor& out, double scale) {
  const int64_t R = q.size(0), Hq = q.size(1), S = q.size(2), d_runtime = q.size(3);
  const int64_t D = DC > 0 ? DC : d_runtime;
  const int64_t bs = k_pool.size(1), Hkv = k_pool.size(2), NB = past.size(1);
  const int64_t rep = Hq / Hkv, P = NB * bs, L = P + S;
  const T* qd = q.data_ptr<T>();
  const T* kd = k_pool.data_ptr<T>();
  const T* vd = v_pool.data_ptr<T>();
  const T* kod = k_own.data_ptr<T>();
  const T* vod = v_own.data_ptr<T>();
  // q, k_own and v_own by their strides (rows of D contiguous): a verify call's are views of
  // the step's [R, S, H, D] projections, copied for nothing before (12 copies a step, 4 layers)
  const int64_t qr = q.stride(0), qh = q.stride(1), qs = q.stride(2);
  const int64_t kr = k_own.stride(0), kh = k_own.stride(1), ks = k_own.stride(2);
  const int64_t vr = v_own.stride(0), vh = v_own.stride(1), vs = v_own.stride(2);
  const int64_t* pd = past.data_ptr<int64_t>();
  const bool* md = mask.data_ptr<bool>();
  T* od = out.data_ptr<T>();
  const int64_t token = Hkv * D, block = bs * token;
  const float sc = static_cast<float>(scale);
  // bfloat16 in the vector forms, S > 1 (a verify call): each (row, KV head) widens the keys
  // and values its queries see to float32 once (exact), which its rep x S queries then read,
  // instead of widening each key once a query (10x at 5 tokens and 2 query heads a KV head).
  // The same values through the same operations: the same bits as the direct form, which a
  // decode step keeps (no gain measured at S = 1), as does a past too long for the buffers
  // to stay in the L2 cache (kWiden floats each)
  constexpr bool widen = std::is_same_v<T, c10::BFloat16> && DC > 0 && DC % 16 == 0;
  constexpr int64_t kWiden = 64 * 1024;
  const bool wide = widen && S > 1 && L * D <= kWiden;
  at::parallel_for(0, R * Hkv, 1, [&](int64_t begin, int64_t end) {
    std::vector<const T*> keys(L), values(L);  // each seen key and value, the own ones last
    std::vector<const float*> wkeys(wide ? L : 0), wvalues(wide ? L : 0);  // widened ones
    std::vector<float> p(rep * L), acc(rep * D), qf(rep * D);
    std::vector<float> kf(wide ? L * D : 0), vf(wide ? L * D : 0);
    std::vector<char> any(wide ? L : 0);
    for (int64_t rh = begin; rh < end; ++rh) {
      const int64_t r = rh / Hkv, h = rh % Hkv;
      const T* kown = kod + r * kr + h * kh;  // the S own keys of KV head h
      const T* vown = vod + r * vr + h * vh;
      if constexpr (widen) {  // (only bfloat16 has the widening load)
        if (wide) {  // position j (past, then own) at kf / vf + j D, where seen
          std::fill(any.begin(), any.end(), 0);
          for (int64_t s = 0; s < S; ++s)
            for (int64_t j = 0; j < L; ++j) any[j] |= md[(r * S + s) * L + j];
          for (int64_t j = 0; j < L; ++j) {
            if (!any[j]) continue;
            const T* kj = j < P ? kd + pd[r * NB + j / bs] * block + h * D + (j % bs) * token
                                : kown + (j - P) * ks;
            const T* vj = j < P ? vd + pd[r * NB + j / bs] * block + h * D + (j % bs) * token
                                : vown + (j - P) * vs;
            for (int64_t d = 0; d < D; d += 16) {
              const v16f kw = load16(kj + d), vw = load16(vj + d);
              std::memcpy(kf.data() + j * D + d, &kw, sizeof(kw));
              std::memcpy(vf.data() + j * D + d, &vw, sizeof(vw));
            }
          }
        }
      }
      for (int64_t s = 0; s < S; ++s) {
        // the rep query heads of KV head h at token s: head h rep + i's row at qrow + i qh
        const T* qrow = qd + r * qr + h * rep * qh + s * qs;
        for (int64_t i = 0; i < rep; ++i)
          for (int64_t d = 0; d < D; ++d)
            qf[i * D + d] = static_cast<float>(qrow[i * qh + d]) * sc;
        const bool* m = md + (r * S + s) * L;
        int64_t seen = 0;
        if (wide) {
          for (int64_t j = 0; j < L; ++j)
            if (m[j]) {
              wkeys[seen] = kf.data() + j * D;
              wvalues[seen++] = vf.data() + j * D;
            }
        } else {
          for (int64_t b = 0; b < NB; ++b) {  // block by block: no division a key
            const int64_t base = pd[r * NB + b] * block + h * D;
            for (int64_t o = 0; o < bs; ++o)
              if (m[b * bs + o]) {
                keys[seen] = kd + base + o * token;
                values[seen++] = vd + base + o * token;
              }
          }
          for (int64_t t = 0; t < S; ++t)
            if (m[P + t]) {
              keys[seen] = kown + t * ks;
              values[seen++] = vown + t * vs;
            }
        }
        std::fill(acc.begin(), acc.end(), 0.f);
        if (seen > 0) {  // no key seen: zeros, as torch's CPU attention gives
          for (int64_t i = 0; i < rep; ++i) {
            const float* qi = qf.data() + i * D;
            float* pi = p.data() + i * L;
            if (wide)
              scores<float, DC>(pi, qi, wkeys.data(), seen, D);
            else
              scores<T, DC>(pi, qi, keys.data(), seen, D);
            const float mx = largest(pi, seen);
            for (int64_t t = 0; t < seen; ++t) pi[t] = exp_nonpositive(pi[t] - mx);
          }
          for (int64_t i = 0; i < rep; i += 2) {  // two query heads at once, or the last one
            float* a = acc.data() + i * D;
            float* pi = p.data() + i * L;
            if (i + 1 < rep) {
              if (wide)
                head_sums<2, float, DC>(a, pi, L, wvalues.data(), seen, D);
              else
                head_sums<2, T, DC>(a, pi, L, values.data(), seen, D);
            } else if (wide) {
              head_sums<1, float, DC>(a, pi, L, wvalues.data(), seen, D);
            } else {
              head_sums<1, T, DC>(a, pi, L, values.data(), seen, D);
            }
          }
        }
        T* orow = od + ((r * Hq + h * rep) * S + s) * D;
        for (int64_t i = 0; i < rep; ++i)
          for (int64_t d = 0; d < D; ++d) orow[i * S * D + d] = static_cast<T>(acc[i * D + d]);
      }
    }
  });
}

void check(const at::Tensor& q, const at::Tensor& k_pool, const at::Tensor& v_pool,
           const at::Tensor& past, const at::Tensor& k_own, const at::Tensor& v_own,
           const at::Tensor& mask) {
  for (const at::Tensor* t : {&q, &k_pool, &v_pool, &past, &k_own, &v_own, &mask})
    TORCH_CHECK(t->device().is_cpu(), "decode_attention: CPU tensors only");
  TORCH_CHECK(q.dim() == 4 && q.size(2) >= 1, "decode_attention: q must be [R, Hq, S, D], got ",
              q.sizes());
  TORCH_CHECK(k_pool.dim() == 4 && k_pool.sizes() == v_pool.sizes() && k_pool.is_contiguous() &&
                  v_pool.is_contiguous(),
              "decode_attention: the pools must be contiguous [N, bs, Hkv, D] of one shape");
  const int64_t R = q.size(0), S = q.size(2), Hkv = k_pool.size(2), D = q.size(3);
  TORCH_CHECK(k_pool.size(3) == D && Hkv > 0 && q.size(1) % Hkv == 0,
              "decode_attention: q ", q.sizes(), " does not match the pools ", k_pool.sizes());
  TORCH_CHECK(k_own.sizes() == v_own.sizes() && k_own.dim() == 4 && k_own.size(0) == R &&
                  k_own.size(1) == Hkv && k_own.size(2) == S && k_own.size(3) == D,
              "decode_attention: the own keys/values must be [R, Hkv, S, D], got ", k_own.sizes());
  for (const at::Tensor* t : {&k_pool, &v_pool, &k_own, &v_own})
    TORCH_CHECK(t->scalar_type() == q.scalar_type(), "decode_attention: one dtype for all");
  TORCH_CHECK(past.dim() == 2 && past.size(0) == R && past.scalar_type() == at::kLong,
              "decode_attention: past must be [R, NB] int64");
  TORCH_CHECK(mask.scalar_type() == at::kBool && mask.dim() == 4 && mask.size(0) == R &&
                  mask.size(1) == 1 && mask.size(2) == S &&
                  mask.size(3) == past.size(1) * k_pool.size(1) + S,
              "decode_attention: mask must be [R, 1, S, NB * bs + S] bool, got ", mask.sizes());
}

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& k_pool,
                            const at::Tensor& v_pool, const at::Tensor& past,
                            const at::Tensor& k_own, const at::Tensor& v_own,
                            const at::Tensor& mask, double scale) {
  check(q, k_pool, v_pool, past, k_own, v_own, mask);
  const auto rows = [](const at::Tensor& t) { return t.stride(3) == 1 ? t : t.contiguous(); };
  const auto qc = rows(q), ko = rows(k_own), vo = rows(v_own);
  const auto pc = past.contiguous(), mc = mask.contiguous();
  const int64_t* ids = pc.data_ptr<int64_t>();
  for (int64_t i = 0; i < pc.numel(); ++i)  // a block outside the pools would read outside them
    TORCH_CHECK(ids[i] >= 0 && ids[i] < k_pool.size(0), "decode_attention: block id ", ids[i],
                " outside the pools' ", k_pool.size(0), " blocks");
  auto out = at::empty(q.sizes(), q.options());  // contiguous
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "decode_attention",
                                  [&] {
                                    switch (q.size(3)) {
                                      case 32:
                                        run<scalar_t, 32>(qc, k_pool, v_pool, pc, ko, vo, mc, out,
                                                          scale);
                                        break;
                                      case 64:
                                        run<scalar_t, 64>(qc, k_pool, v_pool, pc, ko, vo, mc, out,
                                                          scale);
                                        break;
                                      case 128:
                                        run<scalar_t, 128>(qc, k_pool, v_pool, pc, ko, vo, mc,
                                                           out, scale);
                                        break;
                                      default:
                                        run<scalar_t, 0>(qc, k_pool, v_pool, pc, ko, vo, mc, out,
                                                         scale);
                                    }
                                  });
  return out;
}

}  // namespace

TORCH_LIBRARY(tensorrt_dist_cpu, m) {
  m.def(
      "decode_attention(Tensor q, Tensor k_pool, Tensor v_pool, Tensor past, Tensor k_own, "
      "Tensor v_own, Tensor mask, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(tensorrt_dist_cpu, CPU, m) { m.impl("decode_attention", decode_attention); }
