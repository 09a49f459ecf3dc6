// The GGUF block formats of 32 weights (ggml's "legacy" quants), as ggml-quants.c lays them out:
//   Q4_0 (18 bytes): d (float16), 16 bytes of nibbles: w_i = d * (q_i - 8), q_i = byte i's low nibble for
//        i < 16, byte i - 16's high nibble after;
//   Q4_1 (20): d, m, the nibbles: w_i = d * q_i + m;
//   Q5_0 (22): d, 32 high bits (little-endian), the nibbles: w_i = d * (q_i + 16 * bit_i - 16);
//   Q5_1 (24): d, m, the high bits, the nibbles: w_i = d * (q_i + 16 * bit_i) + m;
//   Q8_0 (34): d, 32 signed bytes: w_i = d * q_i.
// Against one block of activation levels x (their scale applied after): main = sum of the integer weight
// times x (for Q4_0/Q5_0, sum q * x - 8 or 16 * sum x), second = sum x (Q4_1/Q5_1, times m).
#pragma once

#include "blocks.h"

namespace blocks {

// The levels of a block of nibbles (plus the high bits, for 5 bits), as unsigned bytes in element order.
#if defined(__AVX2__)
inline __m256i nibbles(const uint8_t* qs) {
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(packed, 4), packed), _mm256_set1_epi8(0x0F));
}
inline __m256i five_bits(const uint8_t* qh, const uint8_t* qs) {
  uint32_t high;
  std::memcpy(&high, qh, 4);
  return _mm256_or_si256(nibbles(qs), _mm256_and_si256(bytes_of_bits(high), _mm256_set1_epi8(0x10)));
}
#endif
inline int32_t level(const uint8_t* qs, int64_t i) { return i < 16 ? qs[i] & 0x0F : qs[i - 16] >> 4; }
inline int32_t level5(const uint8_t* qh, const uint8_t* qs, int64_t i) {
  uint32_t high;
  std::memcpy(&high, qh, 4);
  return level(qs, i) | (((high >> i) & 1) << 4);
}

// x: T pointers to the block's 32 levels; x_sums: to their sums per 16 (two each).
template <int T, typename Levels>
inline void unsigned_sums(const Levels& levels, const int8_t* const* x, const int32_t* const* x_sums, int32_t offset,
                          bool second, Sums* out) {
  for (int r = 0; r < T; ++r) {
    const int32_t total = x_sums[r][0] + x_sums[r][1];
    out[r].main = levels(x[r]) - offset * total;
    out[r].second = second ? total : 0;
  }
}

template <int kOffset, bool kMin, bool kFive>
struct Legacy {
  static constexpr int64_t kElements = 32;
  static constexpr int64_t kScaleBytes = kMin ? 4 : 2;
  static constexpr int64_t kBytes = kScaleBytes + (kFive ? 4 : 0) + 16;
  static constexpr bool kSecond = kMin;
  static float d(const uint8_t* b) { return half_at(b); }
  static float d2(const uint8_t* b) { return kMin ? half_at(b + 2) : 0.f; }

  template <int T>
  static void sums(const uint8_t* b, const int8_t* const* x, const int32_t* const* x_sums, Sums* out) {
    const uint8_t* qh = b + kScaleBytes;
    const uint8_t* qs = qh + (kFive ? 4 : 0);
#if defined(__AVX2__)
    const __m256i q = kFive ? five_bits(qh, qs) : nibbles(qs);
    const auto levels = [&](const int8_t* xs) { return add_lanes(dot4(q, load32(xs))); };
#else
    const auto levels = [&](const int8_t* xs) {
      int32_t sum = 0;
      for (int64_t i = 0; i < kElements; ++i) sum += (kFive ? level5(qh, qs, i) : level(qs, i)) * xs[i];
      return sum;
    };
#endif
    unsigned_sums<T>(levels, x, x_sums, kOffset, kMin, out);
  }
};

using Q4_0 = Legacy<8, false, false>;
using Q4_1 = Legacy<0, true, false>;
using Q5_0 = Legacy<16, false, true>;
using Q5_1 = Legacy<0, true, true>;

struct Q8_0 {
  static constexpr int64_t kElements = 32, kBytes = 34;
  static constexpr bool kSecond = false;
  static float d(const uint8_t* b) { return half_at(b); }
  static float d2(const uint8_t*) { return 0.f; }

  template <int T>
  static void sums(const uint8_t* b, const int8_t* const* x, const int32_t* const*, Sums* out) {
    const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
#if defined(__AVX2__)
    const __m256i q = load32(qs), magnitude = _mm256_abs_epi8(q);  // -128 too: 0x80 read unsigned
    for (int r = 0; r < T; ++r) out[r].main = add_lanes(dot4(magnitude, _mm256_sign_epi8(load32(x[r]), q)));
#else
    for (int r = 0; r < T; ++r) {
      int32_t sum = 0;
      for (int64_t i = 0; i < kElements; ++i) sum += qs[i] * x[r][i];
      out[r].main = sum;
    }
#endif
  }
};

}  // namespace blocks
