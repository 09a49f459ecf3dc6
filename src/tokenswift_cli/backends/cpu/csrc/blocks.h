// What every GGUF block format's product shares (block_products.cpp, blocks_legacy.h, blocks_k.h): the
// activations quantised to 8 bits, and the integer dot products of bytes.
//
// A format's `sums<T>` gives, for one weight block and T rows of activations, exact integers: `main`, the
// sum of the block's integer weights times the rows' levels (scales inside the block included, as
// integers), and `second`, what multiplies the block's second float factor (its minimum's sum). Integers
// are exact whichever instructions sum them, so every instruction set gives the same ones; only the float
// steps after them (block_products.cpp) have an order, and it is one order everywhere.
#pragma once

#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace blocks {

struct Sums {
  int32_t main = 0, second = 0;
};

// A block's float16 factor, widened (exact).
inline float half_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

#if defined(__AVX2__)
// Per 32-bit lane, the sum of 4 consecutive products of unsigned bytes u (<= 127 here) and signed bytes s.
// Without VNNI, `vpmaddubsw` sums pairs into int16 first: |2 * 127 * 127| < 32,768, so it never saturates.
inline __m256i dot4(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

// acc + per 32-bit lane, scale * (the sum of 4 such products), `scale` the int16 weight of both pairs (exact:
// each pair's sum fits int16, |2 * 63 * 127| < 32,768, and every sum int32).
inline __m256i add_scaled_dot4(__m256i acc, __m256i u, __m256i s, __m256i scale) {
  const __m256i pairs = _mm256_maddubs_epi16(u, s);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpwssd_epi32(acc, pairs, scale);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, scale));
#endif
}

inline int32_t add_lanes(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

inline __m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// 0xFF in byte i where bit i of `bits` is set.
inline __m256i bytes_of_bits(uint32_t bits) {
#if defined(__AVX512BW__) && defined(__AVX512VL__)
  return _mm256_movm_epi8(bits);
#else
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int32_t>(bits)),
      _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
  const __m256i others = _mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));  // all but bit i of byte i
  return _mm256_cmpeq_epi8(others, _mm256_set1_epi64x(-1));
#endif
}
#endif

#if defined(__AVX512BW__)
inline __m512i dot4(__m512i u, __m512i s) {
#if defined(__AVX512VNNI__)
  return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s);
#else
  return _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1));
#endif
}
inline __m512i add_scaled_dot4(__m512i acc, __m512i u, __m512i s, __m512i scale) {
  const __m512i pairs = _mm512_maddubs_epi16(u, s);
#if defined(__AVX512VNNI__)
  return _mm512_dpwssd_epi32(acc, pairs, scale);
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(pairs, scale));
#endif
}
inline int32_t add_lanes(__m512i v) {
  return add_lanes(_mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1)));
}
inline __m512i load64(const void* p) { return _mm512_loadu_si512(p); }
// 32 bytes in the low half, 32 more in the high half.
inline __m512i halves(__m256i low, __m256i high) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
}
#endif

}  // namespace blocks
