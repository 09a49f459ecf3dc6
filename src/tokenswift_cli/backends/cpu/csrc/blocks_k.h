// The GGUF "K" block formats of 256 weights, as ggml-quants.c lays them out:
//   Q4_K (144 bytes): d, dmin (float16), 12 bytes of eight 6-bit scales sc_j and mins m_j, 128 bytes of
//        nibbles: sub-block j (32 weights) is bytes 32 (j / 2).. of its low nibbles (j even) or high ones;
//        w = d * sc_j * q - dmin * m_j;
//   Q5_K (176): d, dmin, the scales, 32 bytes of high bits (bit j of byte i: weight i of sub-block j), the
//        nibbles: q gains 16 * its bit;
//   Q6_K (210): 128 bytes of low nibbles, 64 of 2-bit highs, 16 signed scales (per 16 weights), d:
//        w = d * sc_g * (q - 32); in each half h of 128 weights, weight e < 64 takes byte 64h + e's low
//        nibble, e >= 64 byte 64h + e - 64's high one, and bits 2 (e / 32 % 4) of byte 32h + e % 32 above.
// Against one block of activation levels x (one scale for its 256): main = sum over sub-blocks of the scale
// times (sum of q * x) (Q6_K: of (q - 32) * x), second = sum over sub-blocks of m_j * (sum of x), times -dmin.
#pragma once

#include "blocks.h"

namespace blocks {

// Q4_K's and Q5_K's 6-bit scales and mins, 8 bytes each (ggml's get_scale_min_k4, by masks on 32-bit words):
// sc[j] = bytes[j], m[j] = bytes[8 + j].
inline void scales_and_mins(const uint8_t* s, uint8_t* bytes) {
  uint32_t w[4];
  std::memcpy(w, s, 12);
  constexpr uint32_t six = 0x3f3f3f3f, four = 0x0f0f0f0f, two = 0x03030303;
  w[3] = ((w[2] >> 4) & four) | (((w[1] >> 6) & two) << 4);  // m[4..7]
  const uint32_t m_low = w[1] & six;                             // m[0..3]
  w[1] = (w[2] & four) | (((w[0] >> 6) & two) << 4);           // sc[4..7]
  w[2] = m_low;
  w[0] &= six;  // sc[0..3]
  std::memcpy(bytes, w, 16);
}

// second = sum over sub-blocks j of m_j * (sum of its 32 levels), from the sums per 16.
template <int T>
inline void mins(const uint8_t* m, const int32_t* const* x_sums, Sums* out) {
#if defined(__AVX2__)
  const __m256i weights = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(m)));
  for (int r = 0; r < T; ++r) {
    // per 128-bit half, hadd gives pairs 0-1, 2-3 of each input: back in order by 64-bit quarters
    const __m256i pairs = _mm256_hadd_epi32(load32(x_sums[r]), load32(x_sums[r] + 8));
    const __m256i sums = _mm256_permute4x64_epi64(pairs, 0xD8);
    out[r].second = add_lanes(_mm256_mullo_epi32(weights, sums));
  }
#else
  for (int r = 0; r < T; ++r) {
    int32_t low = 0;
    for (int j = 0; j < 8; ++j) low += m[j] * (x_sums[r][2 * j] + x_sums[r][2 * j + 1]);
    out[r].second = low;
  }
#endif
}

template <bool kFive>
struct Q45K {
  static constexpr int64_t kElements = 256, kBytes = kFive ? 176 : 144;
  static constexpr bool kSecond = true;
  static float d(const uint8_t* b) { return half_at(b); }
  static float d2(const uint8_t* b) { return -half_at(b + 2); }

  template <int T>
  static void sums(const uint8_t* b, const int8_t* const* x, const int32_t* const* x_sums, Sums* out) {
    uint8_t sc_m[16];
    scales_and_mins(b + 4, sc_m);
    const uint8_t *sc = sc_m, *m = sc_m + 8;
    const uint8_t* qh = b + 16;
    const uint8_t* qs = b + (kFive ? 48 : 16);
#if defined(__AVX512BW__)
    // chunk c: sub-blocks 2c (bytes 0-31) and 2c + 1 (32-63), lanes 0-7 and 8-15
    __m512i q[4], scale[4];
    const __m256i high = load32(qh);
    __m512i bits = halves(high, _mm256_srli_epi16(high, 1));  // bit 2c of each byte: sub-block 2c's, 2c + 1's
    for (int c = 0; c < 4; ++c) {
      const __m256i packed = load32(qs + 32 * c);
      q[c] = _mm512_and_si512(halves(packed, _mm256_srli_epi16(packed, 4)), _mm512_set1_epi8(0x0F));
      if constexpr (kFive) {
        q[c] = _mm512_or_si512(q[c], _mm512_slli_epi16(_mm512_and_si512(bits, _mm512_set1_epi8(1)), 4));
        bits = _mm512_srli_epi16(bits, 2);
      }
      scale[c] = halves(_mm256_set1_epi16(sc[2 * c]), _mm256_set1_epi16(sc[2 * c + 1]));  // int16 lanes
    }
    for (int r = 0; r < T; ++r) {
      __m512i acc = _mm512_setzero_si512();
      for (int c = 0; c < 4; ++c) acc = add_scaled_dot4(acc, q[c], load64(x[r] + 64 * c), scale[c]);
      out[r].main = add_lanes(acc);
    }
#elif defined(__AVX2__)
    __m256i q[8];
    __m256i bits = load32(qh);
    for (int j = 0; j < 8; ++j) {
      const __m256i packed = load32(qs + 32 * (j / 2));
      q[j] = _mm256_and_si256(j % 2 ? _mm256_srli_epi16(packed, 4) : packed, _mm256_set1_epi8(0x0F));
      if constexpr (kFive) {
        q[j] = _mm256_or_si256(q[j], _mm256_slli_epi16(_mm256_and_si256(bits, _mm256_set1_epi8(1)), 4));
        bits = _mm256_srli_epi16(bits, 1);
      }
    }
    for (int r = 0; r < T; ++r) {
      __m256i acc = _mm256_setzero_si256();
      for (int j = 0; j < 8; ++j) acc = add_scaled_dot4(acc, q[j], load32(x[r] + 32 * j), _mm256_set1_epi16(sc[j]));
      out[r].main = add_lanes(acc);
    }
#else
    for (int r = 0; r < T; ++r) {
      int32_t total = 0;
      for (int j = 0; j < 8; ++j) {
        int32_t sum = 0;
        for (int i = 0; i < 32; ++i) {
          int32_t level = (qs[32 * (j / 2) + i] >> (4 * (j % 2))) & 0x0F;
          if (kFive) level |= ((qh[i] >> j) & 1) << 4;
          sum += level * x[r][32 * j + i];
        }
        total += sc[j] * sum;
      }
      out[r].main = total;
    }
#endif
    mins<T>(m, x_sums, out);
  }
};

using Q4_K = Q45K<false>;
using Q5_K = Q45K<true>;

struct Q6_K {
  static constexpr int64_t kElements = 256, kBytes = 210;
  static constexpr bool kSecond = false;
  static float d(const uint8_t* b) { return half_at(b + 208); }
  static float d2(const uint8_t*) { return 0.f; }

  template <int T>
  static void sums(const uint8_t* b, const int8_t* const* x, const int32_t* const* x_sums, Sums* out) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
#if defined(__AVX512BW__)
    // chunk c: weights 64c..64c + 63; int16 lane i (bytes 2i, 2i + 1) is in group 4c + i / 8
    const __m128i scale_bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(sc));
    const __m512i scales = _mm512_cvtepi8_epi32(scale_bytes);
    const __m512i scales16 = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(scale_bytes));
    const __m512i nibble = _mm512_set1_epi8(0x0F), two = _mm512_set1_epi8(3);
    __m512i q[4], scale[4];
    for (int h = 0; h < 2; ++h) {
      const __m512i low = load64(ql + 64 * h);
      const __m256i top = load32(qh + 32 * h);
      const __m512i high = halves(top, _mm256_srli_epi16(top, 2));  // bits 0-1: weights 0-31, 32-63 of the half
      q[2 * h] = _mm512_or_si512(_mm512_and_si512(low, nibble), _mm512_slli_epi16(_mm512_and_si512(high, two), 4));
      q[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(low, 4), nibble),
                                     _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(high, 4), two), 4));
    }
    const __m512i group_of_lane = _mm512_srli_epi16(
        _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6,
                         5, 4, 3, 2, 1, 0), 3);
    for (int c = 0; c < 4; ++c)
      scale[c] = _mm512_permutexvar_epi16(_mm512_add_epi16(group_of_lane, _mm512_set1_epi16(4 * c)), scales16);
    for (int r = 0; r < T; ++r) {
      // - 32 * sum over groups of sc_g * (sum of x): (q - 32) * x summed
      __m512i acc = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(_mm512_mullo_epi32(scales, load64(x_sums[r])), 5));
      for (int c = 0; c < 4; ++c) acc = add_scaled_dot4(acc, q[c], load64(x[r] + 64 * c), scale[c]);
      out[r].main = add_lanes(acc);
    }
#elif defined(__AVX2__)
    // quarter k: weights 32k..32k + 31, lanes 0-3 group 2k, 4-7 group 2k + 1
    __m256i q[8], scale[8];
    const __m256i nibble = _mm256_set1_epi8(0x0F), two = _mm256_set1_epi8(3);
    for (int k = 0; k < 8; ++k) {
      const int h = k / 4, part = k % 4;
      const __m256i low = load32(ql + 64 * h + 32 * (part % 2));
      const __m256i nibbles = _mm256_and_si256(part < 2 ? low : _mm256_srli_epi16(low, 4), nibble);
      __m256i top = load32(qh + 32 * h);
      for (int s = 0; s < part; ++s) top = _mm256_srli_epi16(top, 2);
      q[k] = _mm256_or_si256(nibbles, _mm256_slli_epi16(_mm256_and_si256(top, two), 4));
      scale[k] = _mm256_set_m128i(_mm_set1_epi16(sc[2 * k + 1]), _mm_set1_epi16(sc[2 * k]));  // int16 lanes
    }
    const __m256i scales_low = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc)));
    const __m256i scales_high = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + 8)));
    for (int r = 0; r < T; ++r) {
      const __m256i weighted = _mm256_add_epi32(_mm256_mullo_epi32(scales_low, load32(x_sums[r])),
                                                _mm256_mullo_epi32(scales_high, load32(x_sums[r] + 8)));
      __m256i acc = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(weighted, 5));
      for (int k = 0; k < 8; ++k) acc = add_scaled_dot4(acc, q[k], load32(x[r] + 32 * k), scale[k]);
      out[r].main = add_lanes(acc);
    }
#else
    for (int r = 0; r < T; ++r) {
      int32_t total = 0;
      for (int g = 0; g < 16; ++g) {
        int32_t sum = 0;
        for (int i = 16 * g; i < 16 * g + 16; ++i) {
          const int h = i / 128, e = i % 128;
          const int32_t low = e < 64 ? ql[64 * h + e] & 0x0F : ql[64 * h + e - 64] >> 4;
          const int32_t high = (qh[32 * h + e % 32] >> (2 * (e / 32))) & 3;
          sum += ((low | (high << 4)) - 32) * x[r][i];
        }
        total += sc[g] * sum;
      }
      out[r].main = total;
    }
    (void)x_sums;
#endif
  }
};

}  // namespace blocks
