// Logits of an output head stored as a Q8_0 tensor: int8 values and one scale per group of 32
// (see q8_head.py). Each logit is a function of its own hidden row and weight row alone, in one
// order: per group, the 32 products summed as two vectors (fused), scaled into a vector
// accumulator (fused); the 16 lanes folded by simd::fold. So rows are batch-invariant, and the
// head reads a quarter of float32's bytes.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "simd.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace {

using simd::fma;
using simd::kLanes;
using simd::load;
using simd::v16;
typedef int8_t c16 __attribute__((vector_size(kLanes)));
constexpr int64_t kRows = 8;  // rows per pass over a weight row: their accumulators stay in registers

inline v16 widen(const int8_t* p) {  // 16 int8 values as floats (exact either way)
#if defined(__AVX512F__)
  const __m512 x = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  return reinterpret_cast<const v16&>(x);
#elif defined(SIMD_AVX2)
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return simd::join(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(x)),
                    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(x, 8))));
#else
  c16 x;
  std::memcpy(&x, p, sizeof(x));
  return __builtin_convertvector(x, v16);
#endif
}

#if defined(SIMD_AVX2)
// The same arithmetic on two AVX2 registers per 16 lanes, written out: GCC keeps a 64-byte vector in
// memory without AVX-512, which made this loop several times slower than the data it reads.
constexpr int64_t kRows2 = 4;  // 8 accumulators and the widened group fit the 16 registers

inline void widen2(const int8_t* p, __m256& lo, __m256& hi) {
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(x));
  hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(x, 8)));
}

// simd::fold's tree on the two halves: lanes l + (l + 8), then + 4, + 2, + 1.
inline float fold2(__m256 lo, __m256 hi) {
  __m256 a = _mm256_add_ps(lo, hi);
  a = _mm256_add_ps(a, _mm256_permute2f128_ps(a, a, 1));
  a = _mm256_add_ps(a, _mm256_permute_ps(a, 0x4E));
  a = _mm256_add_ps(a, _mm256_permute_ps(a, 0xB1));
  return _mm256_cvtss_f32(a);
}

void q8_rows_avx2(const float* x, const int8_t* q, const float* d, float* logits, int64_t rows, int64_t size,
                  int64_t vocab, int64_t begin, int64_t end) {
  const int64_t groups = size / 32;
  for (int64_t v = begin; v < end; ++v) {
    const int8_t* row = q + v * size;
    for (int64_t r0 = 0; r0 < rows; r0 += kRows2) {
      const int64_t count = std::min(kRows2, rows - r0);
      __m256 acc[kRows2][2];
      for (int64_t r = 0; r < kRows2; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
      for (int64_t g = 0; g < groups; ++g) {
        __m256 w[4];  // the group's 32 weights: lanes 0-7, 8-15 (lo) and 16-23, 24-31 (hi)
        widen2(row + g * 32, w[0], w[1]);
        widen2(row + g * 32 + kLanes, w[2], w[3]);
        const __m256 scale = _mm256_add_ps(_mm256_set1_ps(d[v * groups + g]), _mm256_setzero_ps());
        for (int64_t r = 0; r < count; ++r) {
          const float* h = x + (r0 + r) * size + g * 32;
          for (int half = 0; half < 2; ++half) {
            const __m256 part = _mm256_fmadd_ps(w[2 + half], _mm256_loadu_ps(h + kLanes + 8 * half),
                                                _mm256_mul_ps(w[half], _mm256_loadu_ps(h + 8 * half)));
            acc[r][half] = _mm256_fmadd_ps(scale, part, acc[r][half]);
          }
        }
      }
      for (int64_t r = 0; r < count; ++r) logits[(r0 + r) * vocab + v] = fold2(acc[r][0], acc[r][1]);
    }
  }
}
#endif

}  // namespace

// hidden: [R, H] float32; values: [V, H] int8; scales: [V, H / 32] float32 -> [R, V] float32.
at::Tensor q8_logits(const at::Tensor& hidden, const at::Tensor& values, const at::Tensor& scales) {
  TORCH_CHECK(hidden.dtype() == at::kFloat && values.dtype() == at::kChar && scales.dtype() == at::kFloat);
  TORCH_CHECK(hidden.is_contiguous() && values.is_contiguous() && scales.is_contiguous());
  const int64_t rows = hidden.size(0), size = hidden.size(1), vocab = values.size(0), groups = size / 32;
  TORCH_CHECK(values.size(1) == size && size % 32 == 0 && scales.size(0) == vocab && scales.size(1) == groups);
  at::Tensor out = at::empty({rows, vocab}, hidden.options());
  const float* x = hidden.data_ptr<float>();
  const int8_t* q = values.data_ptr<int8_t>();
  const float* d = scales.data_ptr<float>();
  float* logits = out.data_ptr<float>();
  at::parallel_for(0, vocab, 256, [&](int64_t begin, int64_t end) {
#if defined(SIMD_AVX2)
    q8_rows_avx2(x, q, d, logits, rows, size, vocab, begin, end);
#else
    for (int64_t v = begin; v < end; ++v) {
      const int8_t* row = q + v * size;
      for (int64_t r0 = 0; r0 < rows; r0 += kRows) {  // up to kRows rows share each widened group
        const int64_t count = std::min(kRows, rows - r0);
        v16 acc[kRows] = {};
        for (int64_t g = 0; g < groups; ++g) {
          const v16 lo = widen(row + g * 32), hi = widen(row + g * 32 + kLanes), scale = d[v * groups + g] + v16{};
          for (int64_t r = 0; r < count; ++r) {
            const float* h = x + (r0 + r) * size + g * 32;
            acc[r] = fma(scale, fma(hi, load(h + kLanes), lo * load(h)), acc[r]);
          }
        }
        for (int64_t r = 0; r < count; ++r) logits[(r0 + r) * vocab + v] = simd::fold(acc[r]);
      }
    }
#endif
  });
  return out;
}
