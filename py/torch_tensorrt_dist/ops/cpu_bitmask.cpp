// Grammar bitmasks applied to a step's logits on the CPU: a float32 copy of the logits with
// -inf where a row's grammar forbids the token.
//
// tensorrt_dist_mask::masked_float(logits, bitmask, rows) -> x
//   logits  [N, V] float32, bfloat16 or float16 (any strides)  the step's sampling rows
//   bitmask [B, W] int32 (contiguous), B >= N, W = ceil(V / 32)  token t of row i is bit
//           t % 32 of word t // 32 of row i (llguidance's layout); only the rows in ``rows``
//           are read (the others may hold anything: a reused buffer)
//   rows    the rows with a grammar (each in [0, N))
//   -> x [N, V] float32 (contiguous): float(logits) + 0 where allowed (and on every row not
//      in ``rows``), float(logits) + -inf where forbidden
//
// The values are those of ``torch.add(logits, forbidden(bitmask))`` (grammar_masks.py): the
// same additions of 0 and -inf in float32 (x + 0 is x, -0 + 0 is +0; x - inf is -inf, NaN and
// +inf - inf are NaN), one pass over the rows instead of a table lookup per mask byte, an
// expanded float32 mask and an add. One thread: a step's rows are a few thousand values.
// Built at first use by ``cpu_bitmask.py`` (torch's C++ extension loader, -march=native).

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <cstdint>
#include <limits>
#include <vector>

namespace {

template <typename T>
inline float to_float(T v) {
  return static_cast<float>(v);
}

// row ``x`` (stride ``sx`` elements) into ``y``, each value plus 0
template <typename T>
void copy_row(const T* x, int64_t sx, float* y, int64_t V) {
  if (sx == 1) {
    for (int64_t t = 0; t < V; ++t) y[t] = to_float(x[t]) + 0.0f;
  } else {
    for (int64_t t = 0; t < V; ++t) y[t] = to_float(x[t * sx]) + 0.0f;
  }
}

// row ``x`` into ``y``, plus 0 where bit t of ``mask`` is set, plus -inf where it is not
template <typename T>
void mask_row(const T* x, int64_t sx, const int32_t* mask, float* y, int64_t V) {
  const float ninf = -std::numeric_limits<float>::infinity();
  const int64_t full = V / 32;
  for (int64_t w = 0; w < full; ++w) {
    const uint32_t bits = static_cast<uint32_t>(mask[w]);
    const T* xw = x + w * 32 * sx;
    float* yw = y + w * 32;
    if (sx == 1) {
      for (int k = 0; k < 32; ++k) yw[k] = to_float(xw[k]) + (((bits >> k) & 1u) ? 0.0f : ninf);
    } else {
      for (int k = 0; k < 32; ++k)
        yw[k] = to_float(xw[k * sx]) + (((bits >> k) & 1u) ? 0.0f : ninf);
    }
  }
  if (full * 32 < V) {  // the last word's tokens (its padding bits are not read)
    const uint32_t bits = static_cast<uint32_t>(mask[full]);
    for (int64_t t = full * 32; t < V; ++t)
      y[t] = to_float(x[t * sx]) + (((bits >> (t - full * 32)) & 1u) ? 0.0f : ninf);
  }
}

template <typename T>
void apply(const at::Tensor& logits, const int32_t* mask, int64_t W, const std::vector<char>& on,
           float* y) {
  const int64_t N = logits.size(0), V = logits.size(1);
  const int64_t s0 = logits.stride(0), s1 = logits.stride(1);
  const T* x = logits.data_ptr<T>();
  for (int64_t i = 0; i < N; ++i) {
    if (on[i])
      mask_row<T>(x + i * s0, s1, mask + i * W, y + i * V, V);
    else
      copy_row<T>(x + i * s0, s1, y + i * V, V);
  }
}

at::Tensor masked_float(const at::Tensor& logits, const at::Tensor& bitmask, at::IntArrayRef rows) {
  TORCH_CHECK(logits.device().is_cpu() && bitmask.device().is_cpu(),
              "masked_float: CPU tensors only");
  TORCH_CHECK(logits.dim() == 2, "masked_float: logits ", logits.sizes(), " are not [N, V]");
  const int64_t N = logits.size(0), V = logits.size(1), W = (V + 31) / 32;
  TORCH_CHECK(bitmask.scalar_type() == at::kInt && bitmask.dim() == 2 && bitmask.is_contiguous() &&
                  bitmask.size(0) >= N && bitmask.size(1) == W,
              "masked_float: bitmask ", bitmask.sizes(), " ", bitmask.scalar_type(),
              " is not a contiguous int32 [>= ", N, ", ", W, "]");
  std::vector<char> on(static_cast<size_t>(N), 0);
  for (const int64_t r : rows) {
    TORCH_CHECK(0 <= r && r < N, "masked_float: row ", r, " is not in [0, ", N, ")");
    on[static_cast<size_t>(r)] = 1;
  }
  auto y = at::empty({N, V}, logits.options().dtype(at::kFloat));
  if (N == 0 || V == 0) return y;
  const int32_t* mask = bitmask.data_ptr<int32_t>();
  float* yd = y.data_ptr<float>();
  switch (logits.scalar_type()) {
    case at::kFloat: apply<float>(logits, mask, W, on, yd); break;
    case at::kBFloat16: apply<c10::BFloat16>(logits, mask, W, on, yd); break;
    case at::kHalf: apply<c10::Half>(logits, mask, W, on, yd); break;
    default:
      TORCH_CHECK(false, "masked_float: float32, bfloat16 or float16 logits only, got ",
                  logits.scalar_type());
  }
  return y;
}

}  // namespace

TORCH_LIBRARY(tensorrt_dist_mask, m) {
  m.def("masked_float(Tensor logits, Tensor bitmask, int[] rows) -> Tensor");
}

TORCH_LIBRARY_IMPL(tensorrt_dist_mask, CPU, m) { m.impl("masked_float", masked_float); }
