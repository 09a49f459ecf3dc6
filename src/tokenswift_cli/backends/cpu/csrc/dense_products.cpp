// Dense products (float32, bfloat16 or float16 operands) with one order of arithmetic per output, whatever
// the number of rows, the threads or the instruction set: a verified tree's rows get the bits plain decoding
// gives them alone, on any CPU. A BLAS picks its kernel (and so its order of sums) by the shape and by the
// CPU (issue 60: a bfloat16 1536 -> 576 product rounded otherwise on an Intel Xeon than on an AMD EPYC).
//
// Every operand is widened to float32 first (exact for all three types) and the arithmetic is float32
// fmas (compiled with -ffp-contract=off, so no other multiply-add is fused):
// * row products, y[r, n] = sum over k of x[r, k] * w[n, k] (a linear layer, the scores q . k): 16 lanes,
//   each a chain of fmas from +0 (k padded with zeros to a whole chunk), then y = simd::fold(acc) (one
//   tree over the lanes), then + bias[n]. Float32 and float16 weights: lane l takes k = 16c + l, c = 0, 1, ...
//   Bfloat16 weights, by chunks of 32: lane l takes k = 32c + 2l + 1, then 32c + 2l (the pairs and order of
//   `vdpbf16ps`; a bfloat16 pair widens to two float32 lanes by a shift and a mask, no shuffle). With
//   bfloat16 activations too, a CPU with AVX-512 BF16 runs `vdpbf16ps` itself (each product of two bfloat16
//   values is exact in float32, then added with one rounding: an fma), and the others emulate it with
//   denormals as zeros (MXCSR's DAZ and FTZ, as `vdpbf16ps` has them);
// * column products, y[r, n] = sum over k of x[r, k] * v[k, n] (probabilities times values): for k
//   ascending, y = fma(x[r, k], v[k, n], y) from +0, one chain per output.
// AVX-512 holds a 16-lane vector in one register, AVX2 in two, the portable path lane by lane
// (simd.h): the same operations on the same values, so the same bits.
#include <ATen/ATen.h>

#include "parallel.h"
#include "simd.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <type_traits>
#include <vector>

namespace {

using simd::kLanes;
using simd::v16;
#if defined(__AVX512F__)
constexpr int64_t kRowTile = 4;  // input rows sharing each loaded piece of weights (16 accumulators: 16 registers)
#else
constexpr int64_t kRowTile = 2;  // a v16 is two AVX2 registers: 4 outputs x 2 rows fill 16 of them
#endif
constexpr int64_t kOutputs = 4;  // weight rows read together: 4 independent chains of fmas for one input row

// 16 values of a weight row widened to float32 (exact).
inline v16 load_wide(const float* p) { return simd::load(p); }
inline v16 load_wide(const c10::Half* p) { return simd::load(p); }
inline v16 load_wide(const c10::BFloat16* p) {
#if defined(__AVX512F__)
  const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return reinterpret_cast<v16>(_mm512_castsi512_ps(_mm512_slli_epi32(wide, 16)));
#elif defined(SIMD_AVX2)
  const __m128i* h = reinterpret_cast<const __m128i*>(p);
  const __m256i lo = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(h)), 16);
  const __m256i hi = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(h + 1)), 16);
  return simd::join(_mm256_castsi256_ps(lo), _mm256_castsi256_ps(hi));
#else
  v16 x;
  for (int64_t l = 0; l < kLanes; ++l) x[l] = static_cast<float>(p[l]);
  return x;
#endif
}

// The first `count` (< 16) values from p, zeros after them.
template <typename T>
inline v16 load_part(const T* p, int64_t count) {
  T part[kLanes] = {};
  std::copy(p, p + count, part);
  return load_wide(part);
}

// How a row product walks k for weights of type W: chunks of 16 (one vector), or of 32 for bfloat16.
template <typename W>
struct Chunks {
  static constexpr int64_t kSize = kLanes;
  static constexpr bool kPaired = false;
};
template <>
struct Chunks<c10::BFloat16> {
  static constexpr int64_t kSize = 2 * kLanes;
  static constexpr bool kPaired = true;  // lanes take pairs (2l, 2l + 1): odd then even
};

// 32 bfloat16 weights as two float32 vectors: lane l of `odd` holds p[2l + 1], of `even` p[2l] (exact).
struct Pairs {
  v16 odd, even;
};
inline Pairs load_pairs(const c10::BFloat16* p) {
#if defined(__AVX512F__)
  const __m512i v = _mm512_loadu_si512(p);
  const __m512i odd = _mm512_and_si512(v, _mm512_set1_epi32(static_cast<int32_t>(0xFFFF0000u)));
  const __m512i even = _mm512_slli_epi32(v, 16);
  return {reinterpret_cast<v16>(_mm512_castsi512_ps(odd)), reinterpret_cast<v16>(_mm512_castsi512_ps(even))};
#elif defined(SIMD_AVX2)
  const __m256i mask = _mm256_set1_epi32(static_cast<int32_t>(0xFFFF0000u));
  const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + kLanes));
  return {simd::join(_mm256_castsi256_ps(_mm256_and_si256(lo, mask)), _mm256_castsi256_ps(_mm256_and_si256(hi, mask))),
          simd::join(_mm256_castsi256_ps(_mm256_slli_epi32(lo, 16)), _mm256_castsi256_ps(_mm256_slli_epi32(hi, 16)))};
#else
  Pairs out;
  for (int64_t l = 0; l < kLanes; ++l) {
    out.odd[l] = static_cast<float>(p[2 * l + 1]);
    out.even[l] = static_cast<float>(p[2 * l]);
  }
  return out;
#endif
}

// Activations [G, R, K] (any strides but K's) as rows of X padded with zeros to `padded` values: widened
// to float32, or (X = bfloat16) kept; `paired`: each chunk of 32 floats as its 16 odd values, then its 16
// even ones (the lanes of `Pairs`, for bfloat16 weights).
template <typename X>
std::vector<X> input_rows(const at::Tensor& x, int64_t padded, bool paired = false) {
  const int64_t groups = x.size(0), rows = x.size(1), size = x.size(2);
  std::vector<X> out(groups * rows * padded, X(0.f));
  at::Tensor held = x.to(std::is_same_v<X, float> ? at::kFloat : at::kBFloat16);  // exact (or x itself)
  if (held.stride(2) != 1) held = held.contiguous();
  const X* in = static_cast<const X*>(held.data_ptr());
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t r = 0; r < rows; ++r) {
      const X* row = in + g * held.stride(0) + r * held.stride(1);
      X* to = out.data() + (g * rows + r) * padded;
      if (!paired) {
        std::copy(row, row + size, to);
        continue;
      }
      for (int64_t k = 0; k < size; ++k) to[k / 32 * 32 + (k % 2 ? 0 : kLanes) + k % 32 / 2] = row[k];
    }
  return out;
}

// One chunk of k for O weight rows and T input rows: acc[o][r] = fma(x, w, acc[o][r]) lane by lane
// (bfloat16 weights: the odd lanes, then the even ones; with bfloat16 inputs on a CPU that has it, one
// `vdpbf16ps`, which does the same: each product of two bfloat16 values is exact in float32).
template <typename W, typename X, int64_t O, int64_t T>
inline void chunk(const W* const* w, int64_t wk, const X* const* x, int64_t xk, v16 (&acc)[O][T]) {
  if constexpr (!Chunks<W>::kPaired) {
    v16 xs[T];
    for (int64_t r = 0; r < T; ++r) xs[r] = simd::load(x[r] + xk);
    for (int64_t o = 0; o < O; ++o) {
      const v16 wo = load_wide(w[o] + wk);
      for (int64_t r = 0; r < T; ++r) acc[o][r] = simd::fma(xs[r], wo, acc[o][r]);
    }
  } else if constexpr (std::is_same_v<X, float>) {
    v16 odd[T], even[T];
    for (int64_t r = 0; r < T; ++r) odd[r] = simd::load(x[r] + xk), even[r] = simd::load(x[r] + xk + kLanes);
    for (int64_t o = 0; o < O; ++o) {
      const Pairs p = load_pairs(w[o] + wk);
      for (int64_t r = 0; r < T; ++r) acc[o][r] = simd::fma(even[r], p.even, simd::fma(odd[r], p.odd, acc[o][r]));
    }
  } else {
#if defined(__AVX512BF16__)
    __m512bh xs[T];
    for (int64_t r = 0; r < T; ++r) xs[r] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(x[r] + xk));
    for (int64_t o = 0; o < O; ++o) {
      const __m512bh wo = reinterpret_cast<__m512bh>(_mm512_loadu_si512(w[o] + wk));
      for (int64_t r = 0; r < T; ++r)
        acc[o][r] = reinterpret_cast<v16>(_mm512_dpbf16_ps(reinterpret_cast<__m512>(acc[o][r]), xs[r], wo));
    }
#else
    Pairs xs[T];
    for (int64_t r = 0; r < T; ++r) xs[r] = load_pairs(x[r] + xk);
    for (int64_t o = 0; o < O; ++o) {
      const Pairs p = load_pairs(w[o] + wk);
      for (int64_t r = 0; r < T; ++r)
        acc[o][r] = simd::fma(xs[r].even, p.even, simd::fma(xs[r].odd, p.odd, acc[o][r]));
    }
#endif
  }
}

// O weight rows times T input rows, each pair one chain of fmas over the k chunks, then fold.
template <typename W, typename X, int64_t O, int64_t T>
void row_block(const W* const* w, const X* const* x, int64_t size, float* const* out) {
  constexpr int64_t kChunk = Chunks<W>::kSize;
  v16 acc[O][T];
  for (int64_t o = 0; o < O; ++o)
    for (int64_t r = 0; r < T; ++r) acc[o][r] = v16{};
  const int64_t whole = size / kChunk * kChunk;
  for (int64_t k = 0; k < whole; k += kChunk) chunk<W, X, O, T>(w, k, x, k, acc);
  if (whole < size) {  // the last, partial chunk: zeros past the row's end (x is padded with them)
    W part[O][kChunk] = {};
    const W* parts[O];
    for (int64_t o = 0; o < O; ++o) {
      std::copy(w[o] + whole, w[o] + size, part[o]);
      parts[o] = part[o];
    }
    chunk<W, X, O, T>(parts, 0, x, whole, acc);
  }
  for (int64_t o = 0; o < O; ++o)
    for (int64_t r = 0; r < T; ++r) out[o * T + r][0] = simd::fold(acc[o][r]);
}

template <typename W, typename X, int64_t O, int64_t T>
void row_block_at(const W* weights, int64_t w_stride, const X* x, int64_t padded, int64_t size, int64_t o0,
                  int64_t r0, float* out, int64_t n_out) {
  const W* w[O];
  const X* xs[T];
  float* ys[O * T];
  for (int64_t o = 0; o < O; ++o) {
    w[o] = weights + (o0 + o) * w_stride;
    for (int64_t r = 0; r < T; ++r) ys[o * T + r] = out + (r0 + r) * n_out + o0 + o;
  }
  for (int64_t r = 0; r < T; ++r) xs[r] = x + (r0 + r) * padded;
  row_block<W, X, O, T>(w, xs, size, ys);
}

// Outputs [begin, end) of one group for every input row: blocks of 4 outputs, then the last few one by one.
template <typename W, typename X>
void row_outputs(const W* weights, int64_t w_stride, const X* x, int64_t rows, int64_t padded, int64_t size,
                 int64_t begin, int64_t end, float* out, int64_t n_out) {
  for (int64_t o = begin; o < end;) {
    const bool block = o + kOutputs <= end;
    for (int64_t r = 0; r < rows;) {
      const bool tile = r + kRowTile <= rows;
      if (block && tile) row_block_at<W, X, kOutputs, kRowTile>(weights, w_stride, x, padded, size, o, r, out, n_out);
      else if (block) row_block_at<W, X, kOutputs, 1>(weights, w_stride, x, padded, size, o, r, out, n_out);
      else if (tile) row_block_at<W, X, 1, kRowTile>(weights, w_stride, x, padded, size, o, r, out, n_out);
      else row_block_at<W, X, 1, 1>(weights, w_stride, x, padded, size, o, r, out, n_out);
      r += tile ? kRowTile : 1;
    }
    o += block ? kOutputs : 1;
  }
}

// Bfloat16 times bfloat16 where the CPU lacks `vdpbf16ps`: its denormals as zeros (inputs and results),
// so the emulation gives its bits (x86's MXCSR: DAZ and FTZ, for this thread while the guard lives).
struct BFloat16Rounding {
#if defined(__x86_64__) && !defined(__AVX512BF16__)
  unsigned saved = _mm_getcsr();
  BFloat16Rounding() { _mm_setcsr(saved | 0x8040); }
  ~BFloat16Rounding() { _mm_setcsr(saved); }
#endif
};

template <typename W, typename X>
void row_products_of(const at::Tensor& x, const at::Tensor& w, at::Tensor& out) {
  const int64_t groups = w.size(0), rows = x.size(1), size = x.size(2), n_out = w.size(1);
  constexpr int64_t kChunk = Chunks<W>::kSize;
  const int64_t padded = (size + kChunk - 1) / kChunk * kChunk;
  const std::vector<X> held = input_rows<X>(x, padded, Chunks<W>::kPaired && std::is_same_v<X, float>);
  const int64_t x_groups = x.size(0);  // 1: the same rows for every group of weights
  const int64_t blocks = (n_out + kOutputs - 1) / kOutputs;
  const W* weights = w.data_ptr<W>();
  float* y = out.data_ptr<float>();
  parallel::split(0, groups * blocks, 4, [&](int64_t begin, int64_t end) {
    std::optional<BFloat16Rounding> rounding;
    if constexpr (!std::is_same_v<X, float>) rounding.emplace();
    for (int64_t i = begin; i < end;) {  // the outputs of one group at a time
      const int64_t g = i / blocks, first = i % blocks, last = std::min(blocks, first + (end - i));
      const X* xg = held.data() + (x_groups == 1 ? 0 : g) * rows * padded;
      row_outputs<W, X>(weights + g * w.stride(0), w.stride(1), xg, rows, padded, size, first * kOutputs,
                        std::min(n_out, last * kOutputs), y + g * rows * n_out, n_out);
      i += last - first;
    }
  });
}

// T input rows times 16 outputs (columns n0..n0+15 of v): a chain of fmas over k per output.
template <typename V, int64_t T>
void column_block(const V* v, int64_t v_stride, const float* const* x, int64_t size, int64_t width, float* const* out) {
  v16 acc[T];
  for (int64_t r = 0; r < T; ++r) acc[r] = v16{};
  for (int64_t k = 0; k < size; ++k) {
    const v16 column = width == kLanes ? load_wide(v + k * v_stride) : load_part(v + k * v_stride, width);
    for (int64_t r = 0; r < T; ++r) acc[r] = simd::fma(simd::splat(x[r][k]), column, acc[r]);
  }
  for (int64_t r = 0; r < T; ++r) {
    float lanes[kLanes];
    simd::store(lanes, acc[r]);
    std::memcpy(out[r], lanes, width * sizeof(float));
  }
}

template <typename V>
void column_products_of(const at::Tensor& x, const at::Tensor& v, at::Tensor& out) {
  const int64_t groups = v.size(0), rows = x.size(1), size = x.size(2), n_out = v.size(2);
  const std::vector<float> wide = input_rows<float>(x, size);
  const int64_t chunks = (n_out + kLanes - 1) / kLanes;
  const V* values = v.data_ptr<V>();
  float* y = out.data_ptr<float>();
  parallel::split(0, groups * chunks, 4, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t g = i / chunks, n0 = i % chunks * kLanes, width = std::min(kLanes, n_out - n0);
      const V* vg = values + g * v.stride(0) + n0;
      const float* xg = wide.data() + g * rows * size;
      int64_t r = 0;
      for (; r + kRowTile <= rows; r += kRowTile) {
        const float* xs[kRowTile];
        float* ys[kRowTile];
        for (int64_t t = 0; t < kRowTile; ++t) {
          xs[t] = xg + (r + t) * size;
          ys[t] = y + (g * rows + r + t) * n_out + n0;
        }
        column_block<V, kRowTile>(vg, v.stride(1), xs, size, width, ys);
      }
      for (; r < rows; ++r) {
        const float* xs[1] = {xg + r * size};
        float* ys[1] = {y + (g * rows + r) * n_out + n0};
        column_block<V, 1>(vg, v.stride(1), xs, size, width, ys);
      }
    }
  });
}

template <typename F>
void by_type(const at::Tensor& t, const F& body) {
  switch (t.scalar_type()) {
    case at::kFloat: return body(static_cast<float*>(nullptr));
    case at::kBFloat16: return body(static_cast<c10::BFloat16*>(nullptr));
    case at::kHalf: return body(static_cast<c10::Half*>(nullptr));
    default: TORCH_CHECK(false, "dense products take float32, bfloat16 or float16, not ", t.scalar_type());
  }
}

}  // namespace

// x: [G or 1, R, K], w: [G, N, K] (float32, bfloat16 or float16; K contiguous); bias: [N] or none
// -> [G, R, N] float32, y[g, r, n] = sum_k x[g, r, k] * w[g, n, k] (+ bias[n]) in the order above.
at::Tensor dense_row_products(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 3 && w.dim() == 3 && x.size(2) == w.size(2), "row products of [G, R, K] and [G, N, K]");
  TORCH_CHECK(x.size(0) == 1 || x.size(0) == w.size(0), "as many groups of rows as of weights, or one");
  TORCH_CHECK(x.stride(2) == 1 && w.stride(2) == 1, "k must be contiguous");
  at::Tensor out = at::empty({w.size(0), x.size(1), w.size(1)}, x.options().dtype(at::kFloat));
  if (out.numel() == 0) return out;
  if (w.scalar_type() == at::kBFloat16 && x.scalar_type() == at::kBFloat16)
    row_products_of<c10::BFloat16, c10::BFloat16>(x, w, out);
  else
    by_type(w, [&](auto* type) { row_products_of<std::remove_pointer_t<decltype(type)>, float>(x, w, out); });
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->numel() == w.size(1), "one bias per output");
    out.add_(bias->to(at::kFloat).view({1, 1, w.size(1)}));  // one float32 addition per output
  }
  return out;
}

// x: [G, R, K], v: [G, K, N] (N contiguous) -> [G, R, N] float32, y[g, r, n] = sum_k x[g, r, k] * v[g, k, n],
// k ascending.
at::Tensor dense_column_products(const at::Tensor& x, const at::Tensor& v) {
  TORCH_CHECK(x.dim() == 3 && v.dim() == 3 && x.size(2) == v.size(1) && x.size(0) == v.size(0),
              "column products of [G, R, K] and [G, K, N]");
  TORCH_CHECK(v.stride(2) == 1, "n must be contiguous");
  at::Tensor out = at::empty({v.size(0), x.size(1), v.size(2)}, x.options().dtype(at::kFloat));
  if (out.numel() == 0) return out;
  by_type(v, [&](auto* type) { column_products_of<std::remove_pointer_t<decltype(type)>>(x, v, out); });
  return out;
}
