// Vectors of 16 floats for the kernels, with a fixed order for every sum (GCC/Clang vector extensions:
// one AVX-512 register, or two AVX2 registers with their fma and float16 instructions; elsewhere the
// compiler's lanes, one fma at a time).
#pragma once

#include <c10/util/Half.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
#include <immintrin.h>
#endif

namespace simd {

constexpr int64_t kLanes = 16;  // floats per vector
typedef float v16 __attribute__((vector_size(kLanes * sizeof(float))));

#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define SIMD_AVX2 1  // most laptop CPUs: a v16 is two AVX2 registers, worked on half by half
typedef float v8 __attribute__((vector_size(8 * sizeof(float))));
inline __m256 low(v16 a) { return reinterpret_cast<__m256>(__builtin_shufflevector(a, a, 0, 1, 2, 3, 4, 5, 6, 7)); }
inline __m256 high(v16 a) {
  return reinterpret_cast<__m256>(__builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15));
}
inline v16 join(__m256 a, __m256 b) {
  const v8 x = reinterpret_cast<v8>(a), y = reinterpret_cast<v8>(b);
  return __builtin_shufflevector(x, y, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}

// 16 lanes as two named registers, for the hot loops written out for AVX2 (row_attention.cpp).
struct Pair {
  __m256 lo, hi;
};
inline Pair load2(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline Pair load2(const c10::Half* p) {
  const __m128i* h = reinterpret_cast<const __m128i*>(p);
  return {_mm256_cvtph_ps(_mm_loadu_si128(h)), _mm256_cvtph_ps(_mm_loadu_si128(h + 1))};
}
#endif

inline v16 load(const float* p) {
  v16 x;
  std::memcpy(&x, p, sizeof(x));
  return x;
}
inline void store(float* p, v16 x) { std::memcpy(p, &x, sizeof(x)); }

// 16 float16 values widened to float32: exact, so a value reads the same from either storage.
inline v16 load(const c10::Half* p) {
#if defined(__AVX512F__)
  return reinterpret_cast<v16>(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
#elif defined(SIMD_AVX2)
  const __m128i* h = reinterpret_cast<const __m128i*>(p);
  return join(_mm256_cvtph_ps(_mm_loadu_si128(h)), _mm256_cvtph_ps(_mm_loadu_si128(h + 1)));
#else
  v16 x;
  for (int64_t l = 0; l < kLanes; ++l) x[l] = static_cast<float>(p[l]);
  return x;
#endif
}

// 16 int8 levels times one scale: each level exactly a float32, then one product per lane (the
// arithmetic of kv_rows.unpack), so an 8-bit row reads the same on every path.
inline v16 load_levels(const int8_t* p, float scale) {
#if defined(__AVX512F__)
  const __m512 x = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  return reinterpret_cast<v16>(_mm512_mul_ps(x, _mm512_set1_ps(scale)));
#elif defined(SIMD_AVX2)
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256 s = _mm256_set1_ps(scale);
  return join(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), s),
              _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8))), s));
#else
  v16 x;
  for (int64_t l = 0; l < kLanes; ++l) x[l] = static_cast<float>(p[l]) * scale;
  return x;
#endif
}

// x in every lane: a plain broadcast (x + v16{} would add +0.0, an instruction, and turn -0.0 into +0.0).
inline v16 splat(float x) {
#if defined(SIMD_AVX2)
  return join(_mm256_set1_ps(x), _mm256_set1_ps(x));
#else
  v16 v = {x};
  return __builtin_shufflevector(v, v, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
#endif
}

// a * b + c, rounded once, on every machine (one instruction where the CPU has it).
inline v16 fma(v16 a, v16 b, v16 c) {
#if defined(__AVX512F__)
  return reinterpret_cast<v16>(_mm512_fmadd_ps(reinterpret_cast<__m512>(a), reinterpret_cast<__m512>(b),
                                                reinterpret_cast<__m512>(c)));
#elif defined(SIMD_AVX2)
  return join(_mm256_fmadd_ps(low(a), low(b), low(c)), _mm256_fmadd_ps(high(a), high(b), high(c)));
#else
  v16 out;
  for (int64_t l = 0; l < kLanes; ++l) out[l] = std::fma(a[l], b[l], c[l]);
  return out;
#endif
}

// The sum of a vector's 16 lanes, always by one tree: lanes l + (l + 8), then + 4, + 2, + 1.
inline float fold(v16 a) {
#if defined(SIMD_AVX2)  // the same tree on the two halves
  __m256 h = _mm256_add_ps(low(a), high(a));
  h = _mm256_add_ps(h, _mm256_permute2f128_ps(h, h, 1));
  h = _mm256_add_ps(h, _mm256_permute_ps(h, 0x4E));
  h = _mm256_add_ps(h, _mm256_permute_ps(h, 0xB1));
  return _mm256_cvtss_f32(h);
#else
  a = a + __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
  a = a + __builtin_shufflevector(a, a, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
  a = a + __builtin_shufflevector(a, a, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
  return (a + __builtin_shufflevector(a, a, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14))[0];
#endif
}

}  // namespace simd
