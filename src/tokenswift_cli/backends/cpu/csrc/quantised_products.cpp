// Products of quantised weights with 8-bit activations, as llama.cpp computes them: 4-bit weights
// (int4.py's Int4Linear, Q4_1: w = m + d * q, q in 0..15) and 8-bit ones (q8_head.py's output head, Q8_0:
// w = d * q, q in -127..127), float16 d and m per group of 32 inputs (the GGUF's own numbers), times
// activations quantised per row and group of 32 to x ~ dx * xq, xq in -127..127 (dx = max |x| / 127,
// xq = x * (1 / dx) rounded to nearest even). Integer dot products (AVX-512 VNNI `vpdpbusd`, or
// `vpmaddubsw` + `vpmaddwd` where a CPU lacks it) sum q * xq exactly, so every instruction set gets the
// same integers; the float steps are one order everywhere (compiled with -ffp-contract=off):
//   y = sum over groups of (d * dx) * (sum of q * xq) [+ sum over groups of m * (dx * sum of xq)]
// * 16 float lanes, by chunks of 16 groups: first (Q4 only) the chunk's offsets, lane = group mod 16,
//   acc = fma(m, dx * float(sum of xq), acc); then each pair of groups (2p, 2p + 1) of the chunk, lanes
//   0-7 and 8-15, lane l holding the sum of 4 consecutive products (bytes 4l..4l+3 of its group):
//   acc = fma(float(sum), d * dx, acc);
// * y = fold(acc) (simd::fold's tree), then + bias if any.
// A row's result depends on that row alone (its own quantisation, the same steps whatever the batch).
// Weights are stored by blocks of 4 rows, per pair of groups each row's bytes side by side: the 4 rows
// computed together (4 independent chains of fmas for one input row) are read as one stream.
#include <ATen/ATen.h>

#include "parallel.h"
#include "simd.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

namespace {

using simd::kLanes;
using simd::v16;
constexpr int64_t kGroup = 32;
constexpr int64_t kRowTile = 4;  // input rows sharing each unpacked piece of a weight row
constexpr int64_t kOutputs = 4;  // weight rows stored interleaved: pair p of rows 4b..4b+3 side by side
// A plain step's weights are read once, as a stream: fetched this far ahead (non-temporal), the step
// took 4-6% less on two threads (4K context, embedded model; 512-32,768 bytes tried, 4,096 best).
constexpr int64_t kFetchAhead = 4096;

// One row's activations quantised per group of 32; `groups` padded with zero groups to `padded`.
struct Quantised {
  std::vector<int8_t> q;  // [padded * 32]
  std::vector<float> dx, offset;  // [padded]: the scale, and dx * (sum of the group's xq)
};

void quantise_row(const float* x, int64_t groups, Quantised& out) {
  for (int64_t g = 0; g < groups; ++g) {
    const float* in = x + g * kGroup;
    float amax = 0.f;
    for (int64_t i = 0; i < kGroup; ++i) amax = std::max(amax, std::fabs(in[i]));
    const float dx = amax / 127.f;
    const float inverse = dx != 0.f ? 1.f / dx : 0.f;
    int32_t sum = 0;
    for (int64_t i = 0; i < kGroup; ++i) {
      const float level = std::nearbyint(in[i] * inverse);  // the default rounding: nearest even
      const int32_t clamped = static_cast<int32_t>(std::clamp(level, -127.f, 127.f));
      out.q[g * kGroup + i] = static_cast<int8_t>(clamped);
      sum += clamped;
    }
    out.dx[g] = dx;
    out.offset[g] = dx * static_cast<float>(sum);
  }
}

// The integer sums of 4 consecutive unsigned x signed byte products, per 32-bit lane, as floats (exact).
#if defined(__AVX512BW__)
inline v16 dot_sums(__m512i u, __m512i s) {
#if defined(__AVX512VNNI__)
  const __m512i sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s);
#else
  const __m512i sums = _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1));  // |u| <= 128: no saturation
#endif
  const __m512 f = _mm512_cvtepi32_ps(sums);
  return reinterpret_cast<const v16&>(f);
}
#elif defined(SIMD_AVX2)
inline v16 dot_sums(__m256i u_lo, __m256i s_lo, __m256i u_hi, __m256i s_hi) {
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i lo = _mm256_madd_epi16(_mm256_maddubs_epi16(u_lo, s_lo), ones);
  const __m256i hi = _mm256_madd_epi16(_mm256_maddubs_epi16(u_hi, s_hi), ones);
  return simd::join(_mm256_cvtepi32_ps(lo), _mm256_cvtepi32_ps(hi));
}
#endif

// One pair of groups' 64 4-bit weight levels, unpacked from their 32 bytes (group 2p's in the low nibbles).
struct Q4Pair {
#if defined(__AVX512BW__)
  __m512i q;  // bytes 0-31: group 2p, 32-63: group 2p + 1
#elif defined(SIMD_AVX2)
  __m256i low, high;
#else
  const uint8_t* w;
#endif
};

inline Q4Pair unpack_q4(const uint8_t* w) {
#if defined(__AVX512BW__)
  const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
  const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(packed), _mm256_srli_epi16(packed, 4), 1);
  return {_mm512_and_si512(both, _mm512_set1_epi8(0x0F))};
#elif defined(SIMD_AVX2)
  const __m256i packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)), mask = _mm256_set1_epi8(0x0F);
  return {_mm256_and_si256(packed, mask), _mm256_and_si256(_mm256_srli_epi16(packed, 4), mask)};
#else
  return {w};
#endif
}

// The 16 lanes of integer sums of one pair of groups, as floats (exact): lane l < 8 sums the products
// of bytes 4l..4l+3 of group 2p, lane l >= 8 those of group 2p + 1.
inline v16 pair_sums(const Q4Pair& n, const int8_t* x) {
#if defined(__AVX512BW__)
  return dot_sums(n.q, _mm512_loadu_si512(x));
#elif defined(SIMD_AVX2)
  const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + kGroup));
  return dot_sums(n.low, a, n.high, b);
#else
  v16 out;
  for (int64_t l = 0; l < kLanes; ++l) {
    const int64_t half = l / 8, byte = 4 * (l % 8);
    int32_t sum = 0;
    for (int64_t b = 0; b < 4; ++b) sum += ((n.w[byte + b] >> (4 * half)) & 0x0F) * x[half * kGroup + byte + b];
    out[l] = static_cast<float>(sum);
  }
  return out;
#endif
}


// One pair of groups' 64 8-bit weights (group 2p's 32 bytes, then group 2p + 1's): for the unsigned x
// signed products, their magnitudes, and the activations take their signs.
struct Q8Pair {
#if defined(__AVX512BW__)
  __m512i magnitude;
  __mmask64 negative;
#elif defined(SIMD_AVX2)
  __m256i low, high;  // the signed values
#else
  const int8_t* w;
#endif
};

inline Q8Pair unpack_q8(const uint8_t* w) {
#if defined(__AVX512BW__)
  const __m512i q = _mm512_loadu_si512(w);
  return {_mm512_abs_epi8(q), _mm512_movepi8_mask(q)};
#elif defined(SIMD_AVX2)
  return {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + kGroup))};
#else
  return {reinterpret_cast<const int8_t*>(w)};
#endif
}

inline v16 pair_sums(const Q8Pair& n, const int8_t* x) {
#if defined(__AVX512BW__)
  const __m512i a = _mm512_loadu_si512(x);
  return dot_sums(n.magnitude, _mm512_mask_sub_epi8(a, n.negative, _mm512_setzero_si512(), a));  // |q| * (+-x) = q * x
#elif defined(SIMD_AVX2)
  const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + kGroup));
  return dot_sums(_mm256_abs_epi8(n.low), _mm256_sign_epi8(a, n.low), _mm256_abs_epi8(n.high), _mm256_sign_epi8(b, n.high));
#else
  v16 out;
  for (int64_t l = 0; l < kLanes; ++l) {
    const int64_t offset = (l / 8) * kGroup + 4 * (l % 8);
    int32_t sum = 0;
    for (int64_t b = 0; b < 4; ++b) sum += n.w[offset + b] * x[offset + b];
    out[l] = static_cast<float>(sum);
  }
  return out;
#endif
}

// The two kinds of weights: bytes per row and pair of groups, whether groups have offsets, the unpacking.
struct Q4 {
  static constexpr int64_t kPairBytes = kGroup;
  static constexpr bool kOffsets = true;
  static Q4Pair unpack(const uint8_t* w) { return unpack_q4(w); }
};
struct Q8 {
  static constexpr int64_t kPairBytes = 2 * kGroup;
  static constexpr bool kOffsets = false;
  static Q8Pair unpack(const uint8_t* w) { return unpack_q8(w); }
};

// Lane l of the result: s[2k] for l < 8, s[2k + 1] for l >= 8 (the pair k of 16 groups' scales).
inline v16 pair_scales(const v16& s, int64_t k) {
#if defined(__AVX512F__)
  alignas(64) static const int32_t kIndex[8][kLanes] = {
      {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1},          {2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3},
      {4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5},          {6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7},
      {8, 8, 8, 8, 8, 8, 8, 8, 9, 9, 9, 9, 9, 9, 9, 9},          {10, 10, 10, 10, 10, 10, 10, 10, 11, 11, 11, 11, 11, 11, 11, 11},
      {12, 12, 12, 12, 12, 12, 12, 12, 13, 13, 13, 13, 13, 13, 13, 13}, {14, 14, 14, 14, 14, 14, 14, 14, 15, 15, 15, 15, 15, 15, 15, 15}};
  const __m512 out = _mm512_permutexvar_ps(_mm512_load_si512(kIndex[k]), reinterpret_cast<const __m512&>(s));
  return reinterpret_cast<const v16&>(out);
#elif defined(SIMD_AVX2)
  return simd::join(_mm256_set1_ps(s[2 * k]), _mm256_set1_ps(s[2 * k + 1]));
#else
  v16 out;
  for (int64_t l = 0; l < kLanes; ++l) out[l] = s[2 * k + l / 8];
  return out;
#endif
}

// O weight rows times T input rows (O * T accumulators, independent chains of fmas, in registers).
// Each (output, row) pair: per chunk of 16 groups, acc = fma(m, dx * sum xq, acc), then for each of
// its 8 pairs of groups acc = fma(pair sums, d * dx, acc); the result is fold(acc).
template <typename W, int64_t O, int64_t T>
void output_block(const uint8_t* const* w, const c10::Half* const* d, const c10::Half* const* m,
                  const Quantised* const* xs, int64_t pairs, int64_t chunks, float* const* out) {
  v16 acc[O][T];
  for (int64_t o = 0; o < O; ++o)
    for (int64_t r = 0; r < T; ++r) acc[o][r] = v16{};
  for (int64_t c = 0; c < chunks; ++c) {
    v16 s[O][T];
    for (int64_t o = 0; o < O; ++o) {
      const v16 dc = simd::load(d[o] + c * kLanes);
      for (int64_t r = 0; r < T; ++r) s[o][r] = dc * simd::load(xs[r]->dx.data() + c * kLanes);
      if constexpr (W::kOffsets) {
        const v16 mc = simd::load(m[o] + c * kLanes);
        for (int64_t r = 0; r < T; ++r)
          acc[o][r] = simd::fma(mc, simd::load(xs[r]->offset.data() + c * kLanes), acc[o][r]);
      }
    }
    const int64_t first = c * (kLanes / 2), count = std::min(pairs - first, kLanes / 2);
    for (int64_t k = 0; k < count; ++k) {
      const int64_t p = first + k;
      if constexpr (O == kOutputs)  // w[0] starts the block: its pairs are one stream, fetched ahead
        for (int64_t line = 0; line < kOutputs * W::kPairBytes; line += 64)
          __builtin_prefetch(w[0] + p * kOutputs * W::kPairBytes + line + kFetchAhead, 0, 0);
      for (int64_t o = 0; o < O; ++o) {
        const auto n = W::unpack(w[o] + p * kOutputs * W::kPairBytes);
        for (int64_t r = 0; r < T; ++r)
          acc[o][r] = simd::fma(pair_sums(n, xs[r]->q.data() + p * 2 * kGroup), pair_scales(s[o][r], k), acc[o][r]);
      }
    }
  }
  for (int64_t o = 0; o < O; ++o)
    for (int64_t r = 0; r < T; ++r) out[o * T + r][0] = simd::fold(acc[o][r]);
}

template <typename W, int64_t O, int64_t T>
void output_block_at(const uint8_t* packed, const c10::Half* scales, const c10::Half* lows, const Quantised* rows,
                     int64_t o0, int64_t r0, int64_t n_out, int64_t pairs, int64_t chunks, float* out, float* sink) {
  const uint8_t* w[O];
  const c10::Half *d[O], *m[O];
  const Quantised* xs[T];
  float* ys[O * T];
  for (int64_t o = 0; o < O; ++o) {
    const int64_t row = o0 + o;
    w[o] = packed + ((row / kOutputs) * pairs * kOutputs + row % kOutputs) * W::kPairBytes;
    d[o] = scales + row * chunks * kLanes;
    m[o] = lows + row * chunks * kLanes;
    for (int64_t r = 0; r < T; ++r) ys[o * T + r] = row < n_out ? out + (r0 + r) * n_out + row : sink + r;
  }
  for (int64_t r = 0; r < T; ++r) xs[r] = rows + r0 + r;
  output_block<W, O, T>(w, d, m, xs, pairs, chunks, ys);
}

// Outputs [begin, end) (rows of the padded weights) for every input row.
template <typename W>
void output_rows(const uint8_t* packed, const c10::Half* scales, const c10::Half* lows, const Quantised* x,
                 int64_t count, float* out, int64_t n_out, int64_t padded, int64_t begin, int64_t end) {
  const int64_t pairs = padded / 2, chunks = (padded + kLanes - 1) / kLanes;
  float sink[kRowTile];  // results of the padding rows
  for (int64_t r0 = 0; r0 < count; r0 += kRowTile) {
    const int64_t tile = std::min(kRowTile, count - r0);
    for (int64_t o = begin; o < end; o += kOutputs) {
      if (tile == 1) {  // a plain step: 4 outputs at a time, so 4 chains of fmas overlap
        output_block_at<W, 4, 1>(packed, scales, lows, x, o, r0, n_out, pairs, chunks, out, sink);
      } else if (tile == 2) {
        for (int64_t i = 0; i < kOutputs; i += 2)
          output_block_at<W, 2, 2>(packed, scales, lows, x, o + i, r0, n_out, pairs, chunks, out, sink);
      } else {
        for (int64_t i = 0; i < kOutputs; ++i) {
          if (tile == 3)
            output_block_at<W, 1, 3>(packed, scales, lows, x, o + i, r0, n_out, pairs, chunks, out, sink);
          else
            output_block_at<W, 1, 4>(packed, scales, lows, x, o + i, r0, n_out, pairs, chunks, out, sink);
        }
      }
    }
  }
}

// This thread's quantised rows, kept across calls: a plain step makes 120 products, each of which
// allocated them anew (three vectors a row). Through a call GCC cannot see into: a reference to a
// thread_local from a shared library is re-derived at each use.
__attribute__((noinline)) std::vector<Quantised>& quantised_rows() {
  static thread_local std::vector<Quantised> rows;
  return rows;
}

// The products of x [R, K] float32 with N rows of weights of kind W -> [R, N] float32 (+ bias).
template <typename W>
at::Tensor products(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales, const at::Tensor* lows,
                    const std::optional<at::Tensor>& bias, int64_t n_out) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && packed.scalar_type() == at::kByte);
  TORCH_CHECK(scales.scalar_type() == at::kHalf && packed.is_contiguous() && scales.is_contiguous());
  TORCH_CHECK(!lows || (lows->scalar_type() == at::kHalf && lows->is_contiguous() && lows->sizes() == scales.sizes()));
  const at::Tensor input = x.contiguous();
  const int64_t rows = input.size(0), size = input.size(1), groups = size / kGroup;
  const int64_t padded = (groups + 1) / 2 * 2, stored = scales.size(1), n_padded = packed.size(0) * kOutputs;
  TORCH_CHECK(size % kGroup == 0 && packed.size(1) == padded / 2 * kOutputs * W::kPairBytes,
              "packed weights of another width");
  TORCH_CHECK(n_out <= n_padded && n_padded - n_out < kOutputs && scales.size(0) == n_padded);
  TORCH_CHECK(stored % kLanes == 0 && stored >= padded);
  const bool biased = bias.has_value() && bias->defined();
  if (biased) TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->numel() == n_out);
  std::vector<Quantised>& quantised = quantised_rows();
  if (static_cast<int64_t>(quantised.size()) < rows) quantised.resize(rows);
  const float* in = input.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    Quantised& q = quantised[r];
    q.q.assign(padded * kGroup, 0);
    q.dx.assign(stored, 0.f);
    q.offset.assign(stored, 0.f);
    quantise_row(in + r * size, groups, q);
  }
  at::Tensor out = at::empty({rows, n_out}, input.options());
  const c10::Half* m = lows ? lows->data_ptr<c10::Half>() : nullptr;
  parallel::split(0, n_padded / kOutputs, 16, [&](int64_t begin, int64_t end) {
    output_rows<W>(packed.data_ptr<uint8_t>(), scales.data_ptr<c10::Half>(), m, quantised.data(), rows,
                   out.data_ptr<float>(), n_out, padded, begin * kOutputs, end * kOutputs);
  });
  return biased ? out + bias->view({1, n_out}) : out;
}

}  // namespace

// 4-bit weights. x: [R, K] float32; packed: [N4 / 4, pairs * 4 * 32] uint8 for N4 = N rounded up to 4: per
// block of 4 rows, per pair p of groups, each row's 32 bytes (byte j: group 2p's q_j | group 2p+1's q_j << 4);
// scales, lows: [N4, G16] float16 (d and m per group, zero past the K / 32 groups and N rows, G16 a multiple
// of 16); bias: [N] float32 or none -> [R, N] float32.
at::Tensor q4_products(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales, const at::Tensor& lows,
                       const std::optional<at::Tensor>& bias, int64_t n_out) {
  return products<Q4>(x, packed, scales, &lows, bias, n_out);
}

// 8-bit weights (Q8_0), as q4_products without offsets: packed [N4 / 4, pairs * 4 * 64] int8 bytes, per block
// of 4 rows, per pair p of groups, each row's 64 values (group 2p's 32, then group 2p + 1's).
at::Tensor q8_products(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales, int64_t n_out) {
  return products<Q8>(x, packed, scales, nullptr, std::nullopt, n_out);
}
