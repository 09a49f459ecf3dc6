// Prototypes of a plain step's attention (one row, every position seen, head size 64, 3 query heads per
// KV head, blocks of 256 positions) in other arithmetics than the engine's, for timing and precision only
// (benchmarks/attention_prototypes.py builds and runs them; issue 41). Not used by the engine.
//
// * bf16_attend: keys and values in bfloat16, scores and value sums by vdpbf16ps (avx512_bf16): keys stored
//   as transposed tiles of 16 positions (a lane holds a key's pair of dimensions), values as pairs of
//   positions (a lane holds two positions' values of one dimension); the query and weights in bfloat16.
// * i8_attend: keys and values in 8 bits with a float32 scale per 32 dimensions, by vpdpbusd
//   (avx512_vnni): keys as transposed tiles of 16 positions (4 dimensions a lane, stored plus 128, since
//   vpdpbusd multiplies unsigned by signed bytes), values interleaved by 4 positions with their scales
//   apart; the query in signed 8 bits per 32 dimensions; each lane's weights times the values' scales in
//   unsigned 8 bits per block, 255 at the block's largest. Integer sums are exact, so they have one value
//   in any order.
// * touch: reads the bytes bf16_attend reads (as many as the float16 cache), in the same order, nothing else.
// * dpbf16_mismatches: vdpbf16ps against "acc + a1 * b1, then + a0 * b0" in float32 (the order Intel
//   documents), on random operands in float32's normal range.
#include <torch/extension.h>
#include <immintrin.h>

#include "parallel.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace {

constexpr int64_t D = 64, kPairs = D / 2, kGroup = 3;
constexpr int64_t kKeyTile = 16 * D + 2 * 16 * 4;  // 8-bit key tile: 16 rows of 4 dims x 16 keys, scales [2][16]
constexpr int64_t kValueQuad = 4 * D;              // 8-bit values of 4 positions: [dim][position]

// exp(x - top), 0 below -87: the engine's exp_block (row_attention.cpp), AVX-512.
void exp_block(const float* scores, float top, float* out, int64_t n) {
  const __m512 lowest = _mm512_set1_ps(-87.f), tops = _mm512_set1_ps(top);
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 x = _mm512_sub_ps(_mm512_loadu_ps(scores + i), tops);
    const __mmask16 below = _mm512_cmp_ps_mask(x, lowest, _CMP_LT_OQ);
    const __m512 clamped = _mm512_mask_blend_ps(below, x, lowest);
    const __m512 n_ = _mm512_roundscale_ps(_mm512_fmadd_ps(clamped, _mm512_set1_ps(1.44269504f), _mm512_set1_ps(0.5f)),
                                           _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    const __m512 r = _mm512_fmadd_ps(n_, _mm512_set1_ps(-1.42860677e-06f),
                                     _mm512_fmadd_ps(n_, _mm512_set1_ps(-0.693145752f), clamped));
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(1.f / 720.f), r, _mm512_set1_ps(1.f / 120.f));
    for (const float c : {1.f / 24.f, 1.f / 6.f, 0.5f, 1.f, 1.f}) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n_), _mm512_set1_epi32(127)), 23);
    _mm512_storeu_ps(out + i, _mm512_maskz_mul_ps(~below, p, _mm512_castsi512_ps(bits)));
  }
}

// Each lane's block maximum, then its weights in place; returns nothing, fills top[g].
void weights_of(float* scores, int64_t block, float* top) {
  for (int g = 0; g < kGroup; ++g) {
    float* s = scores + g * block;
    __m512 best = _mm512_loadu_ps(s);
    for (int64_t j = 16; j < block; j += 16) best = _mm512_max_ps(best, _mm512_loadu_ps(s + j));
    top[g] = _mm512_reduce_max_ps(best);
    exp_block(s, top[g], s, block);
  }
}

// Per lane's blocks (top, weight sum, weighted values): the softmax over the whole row, in float64.
at::Tensor combine(int64_t heads, int64_t kv, int64_t nb, const std::vector<float>& tops,
                   const std::vector<float>& sums, const std::vector<float>& accs) {
  at::Tensor out = at::empty({heads, D});
  float* o = out.data_ptr<float>();
  for (int64_t head = 0; head < kv; ++head)
    for (int64_t g = 0; g < kGroup; ++g) {
      float m = -INFINITY;
      for (int64_t b = 0; b < nb; ++b) m = std::max(m, tops[(head * nb + b) * kGroup + g]);
      double weight = 0, total[D] = {};
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t i = (head * nb + b) * kGroup + g;
        const double factor = std::exp(static_cast<double>(tops[i]) - m);
        weight += factor * sums[i];
        for (int64_t d = 0; d < D; ++d) total[d] += factor * accs[i * D + d];
      }
      for (int64_t d = 0; d < D; ++d) o[(head * kGroup + g) * D + d] = static_cast<float>(total[d] / weight);
    }
  return out;
}

void bf16_block(const uint32_t* query_pairs, const uint16_t* tiles, const uint16_t* value_pairs, int64_t block,
                float scale, float* scores, uint32_t* weight_pairs, float* top, float* sum, float* acc) {
  for (int64_t t = 0; t < block / 16; ++t) {
    const uint16_t* tile = tiles + t * 16 * D;
    for (int64_t b = 0; b < 16 * D * 2; b += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(tile + 16 * D) + b, _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(value_pairs + t * 16 * D) + b, _MM_HINT_T1);
    }
    __m512 a[kGroup][4];
    for (auto& lane : a)
      for (auto& x : lane) x = _mm512_setzero_ps();
    for (int64_t i = 0; i < kPairs; ++i) {
      const __m512bh k = (__m512bh)_mm512_loadu_si512(tile + i * 32);
      for (int g = 0; g < kGroup; ++g)
        a[g][i & 3] = _mm512_dpbf16_ps(a[g][i & 3], k, (__m512bh)_mm512_set1_epi32(query_pairs[g * kPairs + i]));
    }
    for (int g = 0; g < kGroup; ++g)
      _mm512_storeu_ps(scores + g * block + t * 16,
                       _mm512_mul_ps(_mm512_add_ps(_mm512_add_ps(a[g][0], a[g][1]), _mm512_add_ps(a[g][2], a[g][3])),
                                     _mm512_set1_ps(scale)));
  }
  weights_of(scores, block, top);
  const __m512bh ones = (__m512bh)_mm512_set1_epi16(0x3F80);
  for (int g = 0; g < kGroup; ++g) {
    __m512 total = _mm512_setzero_ps();
    for (int64_t j = 0; j < block; j += 32) {
      const __m512bh w = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(scores + g * block + j + 16), _mm512_loadu_ps(scores + g * block + j));
      _mm512_storeu_si512(weight_pairs + g * block / 2 + j / 2, (__m512i)w);
      total = _mm512_dpbf16_ps(total, w, ones);
    }
    sum[g] = _mm512_reduce_add_ps(total);
  }
  __m512 o[kGroup][4];
  for (auto& lane : o)
    for (auto& x : lane) x = _mm512_setzero_ps();
  for (int64_t j = 0; j < block / 2; ++j)
    for (int c = 0; c < 4; ++c) {
      const __m512bh v = (__m512bh)_mm512_loadu_si512(value_pairs + j * 2 * D + c * 32);
      for (int g = 0; g < kGroup; ++g)
        o[g][c] = _mm512_dpbf16_ps(o[g][c], v, (__m512bh)_mm512_set1_epi32(weight_pairs[g * block / 2 + j]));
    }
  for (int g = 0; g < kGroup; ++g)
    for (int c = 0; c < 4; ++c) _mm512_storeu_ps(acc + g * D + c * 16, o[g][c]);
}

struct Query8 {
  int32_t words[16];  // 64 signed levels, 4 a word
  float scale[2];     // per 32 dimensions
  int32_t bias[2];    // 128 * the sum of the levels: what the keys' +128 adds
};

void i8_block(const Query8* q, const uint8_t* keys, const uint8_t* values, const float* value_scales,
              int64_t scales_stride, int64_t block, float scale, float* scores, uint8_t* weight_levels,
              float* weight_scratch, float* top, float* sum, float* acc) {
  for (int64_t t = 0; t < block / 16; ++t) {
    const uint8_t* tile = keys + t * kKeyTile;
    for (int64_t b = 0; b < kKeyTile; b += 64) _mm_prefetch(reinterpret_cast<const char*>(tile + kKeyTile + b), _MM_HINT_T0);
    for (int64_t b = 0; b < 4 * kValueQuad; b += 64)
      _mm_prefetch(reinterpret_cast<const char*>(values + t * 4 * kValueQuad + b), _MM_HINT_T1);
    __m512i a[kGroup][2];
    for (auto& lane : a) lane[0] = lane[1] = _mm512_setzero_si512();
    for (int r = 0; r < 16; ++r) {
      const __m512i k = _mm512_loadu_si512(tile + r * 64);
      for (int g = 0; g < kGroup; ++g) a[g][r >> 3] = _mm512_dpbusd_epi32(a[g][r >> 3], k, _mm512_set1_epi32(q[g].words[r]));
    }
    const float* key_scales = reinterpret_cast<const float*>(tile + 16 * D);
    for (int g = 0; g < kGroup; ++g) {
      __m512 s = _mm512_setzero_ps();
      for (int h = 0; h < 2; ++h) {
        const __m512 dots = _mm512_cvtepi32_ps(_mm512_sub_epi32(a[g][h], _mm512_set1_epi32(q[g].bias[h])));
        s = _mm512_fmadd_ps(_mm512_mul_ps(dots, _mm512_loadu_ps(key_scales + h * 16)), _mm512_set1_ps(q[g].scale[h] * scale), s);
      }
      _mm512_storeu_ps(scores + g * block + t * 16, s);
    }
  }
  weights_of(scores, block, top);
  float step[kGroup][2];
  for (int g = 0; g < kGroup; ++g) {
    const float* w = scores + g * block;
    __m512 total = _mm512_setzero_ps();
    for (int64_t j = 0; j < block; j += 16) total = _mm512_add_ps(total, _mm512_loadu_ps(w + j));
    sum[g] = _mm512_reduce_add_ps(total);
    for (int h = 0; h < 2; ++h) {
      __m512 most = _mm512_setzero_ps();
      for (int64_t j = 0; j < block; j += 16) {
        const __m512 x = _mm512_mul_ps(_mm512_loadu_ps(w + j), _mm512_loadu_ps(value_scales + h * scales_stride + j));
        _mm512_storeu_ps(weight_scratch + j, x);
        most = _mm512_max_ps(most, x);
      }
      const float largest = _mm512_reduce_max_ps(most), inverse = largest > 0 ? 255.f / largest : 0.f;
      step[g][h] = largest / 255.f;
      for (int64_t j = 0; j < block; j += 16) {
        const __m512i u = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(weight_scratch + j), _mm512_set1_ps(inverse)));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(weight_levels + (g * 2 + h) * block + j), _mm512_cvtusepi32_epi8(u));
      }
    }
  }
  __m512i o[kGroup][4];
  for (auto& lane : o)
    for (auto& x : lane) x = _mm512_setzero_si512();
  for (int64_t j = 0; j < block / 4; ++j)
    for (int c = 0; c < 4; ++c) {
      const __m512i v = _mm512_loadu_si512(values + j * kValueQuad + c * 64);
      for (int g = 0; g < kGroup; ++g) {
        int32_t four;
        std::memcpy(&four, weight_levels + (g * 2 + c / 2) * block + j * 4, 4);
        o[g][c] = _mm512_dpbusd_epi32(o[g][c], _mm512_set1_epi32(four), v);
      }
    }
  for (int g = 0; g < kGroup; ++g)
    for (int c = 0; c < 4; ++c)
      _mm512_storeu_ps(acc + g * D + c * 16, _mm512_mul_ps(_mm512_cvtepi32_ps(o[g][c]), _mm512_set1_ps(step[g][c / 2])));
}

struct Blocks {
  std::vector<float> tops, sums, accs;
  Blocks(int64_t items) : tops(items * kGroup), sums(items * kGroup), accs(items * kGroup * D) {}
};

}  // namespace

// q [heads, 64] float32; tiles [kv, N/16, 32, 16, 2] and pairs [kv, N/2, 64, 2], bfloat16 bits (int16).
at::Tensor bf16_attend(at::Tensor q, at::Tensor tiles, at::Tensor pairs, double scaling, int64_t block) {
  const int64_t heads = q.size(0), kv = tiles.size(0), n = tiles.size(1) * 16, nb = n / block;
  TORCH_CHECK(heads == kv * kGroup && q.size(1) == D && n % block == 0);
  const at::Tensor qb = q.to(at::kBFloat16).contiguous();
  const auto* query_pairs = reinterpret_cast<const uint32_t*>(qb.data_ptr());
  const auto* k = reinterpret_cast<const uint16_t*>(tiles.data_ptr());
  const auto* v = reinterpret_cast<const uint16_t*>(pairs.data_ptr());
  Blocks blocks(kv * nb);
  parallel::split(0, kv * nb, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(kGroup * block);
    std::vector<uint32_t> weight_pairs(kGroup * block / 2);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t head = item / nb, first = (item % nb) * block;
      bf16_block(query_pairs + head * kGroup * kPairs, k + (head * n + first) * D, v + (head * n + first) * D, block,
                 static_cast<float>(scaling), scores.data(), weight_pairs.data(), &blocks.tops[item * kGroup],
                 &blocks.sums[item * kGroup], &blocks.accs[item * kGroup * D]);
    }
  });
  return combine(heads, kv, nb, blocks.tops, blocks.sums, blocks.accs);
}

// q [heads, 64] float32; keys [kv, N/16, kKeyTile] and values [kv, N/4, kValueQuad] uint8; value_scales
// [kv, 2, N] float32.
at::Tensor i8_attend(at::Tensor q, at::Tensor keys, at::Tensor values, at::Tensor value_scales, double scaling,
                     int64_t block) {
  const int64_t heads = q.size(0), kv = keys.size(0), n = keys.size(1) * 16, nb = n / block;
  TORCH_CHECK(heads == kv * kGroup && q.size(1) == D && n % block == 0 && keys.size(2) == kKeyTile);
  std::vector<Query8> queries(heads);
  const float* qf = q.data_ptr<float>();
  for (int64_t h = 0; h < heads; ++h)
    for (int half = 0; half < 2; ++half) {
      const float* x = qf + h * D + half * 32;
      float largest = 0;
      for (int d = 0; d < 32; ++d) largest = std::max(largest, std::fabs(x[d]));
      const float inverse = largest > 0 ? 127.f / largest : 0.f;
      int8_t levels[32];
      int32_t total = 0;
      for (int d = 0; d < 32; ++d) total += levels[d] = static_cast<int8_t>(std::nearbyint(x[d] * inverse));
      std::memcpy(queries[h].words + half * 8, levels, 32);
      queries[h].scale[half] = largest / 127.f;
      queries[h].bias[half] = 128 * total;
    }
  const uint8_t *k = keys.data_ptr<uint8_t>(), *v = values.data_ptr<uint8_t>();
  const float* scales = value_scales.data_ptr<float>();
  Blocks blocks(kv * nb);
  parallel::split(0, kv * nb, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(kGroup * block), scratch(block);
    std::vector<uint8_t> weight_levels(kGroup * 2 * block);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t head = item / nb, first = (item % nb) * block;
      i8_block(queries.data() + head * kGroup, k + (head * n + first) / 16 * kKeyTile, v + (head * n + first) / 4 * kValueQuad,
               scales + head * 2 * n + first, n, block, static_cast<float>(scaling), scores.data(), weight_levels.data(),
               scratch.data(), &blocks.tops[item * kGroup], &blocks.sums[item * kGroup], &blocks.accs[item * kGroup * D]);
    }
  });
  return combine(heads, kv, nb, blocks.tops, blocks.sums, blocks.accs);
}

int64_t touch(at::Tensor tiles, at::Tensor pairs, int64_t block) {
  const int64_t kv = tiles.size(0), n = tiles.size(1) * 16, nb = n / block, bytes = block * D * 2;
  const char *k = reinterpret_cast<const char*>(tiles.data_ptr()), *v = reinterpret_cast<const char*>(pairs.data_ptr());
  std::vector<int64_t> sink(kv * nb);
  parallel::split(0, kv * nb, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t offset = (item / nb * n + item % nb * block) * D * 2;
      __m512i x = _mm512_setzero_si512();
      for (int64_t o = 0; o < bytes; o += 64) x = _mm512_xor_si512(x, _mm512_loadu_si512(k + offset + o));
      for (int64_t o = 0; o < bytes; o += 64) x = _mm512_xor_si512(x, _mm512_loadu_si512(v + offset + o));
      sink[item] = _mm512_reduce_add_epi64(x);
    }
  });
  return sink[0];
}

int64_t dpbf16_mismatches(int64_t vectors) {
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  auto bits = [](float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; };
  auto bf16 = [&](float f) { const uint32_t u = bits(f); return static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16); };
  auto widen = [](uint16_t h) { const uint32_t u = static_cast<uint32_t>(h) << 16; float f; std::memcpy(&f, &u, 4); return f; };
  int64_t mismatches = 0;
  for (int64_t it = 0; it < vectors; ++it) {
    uint16_t a[32], b[32];
    float acc[16], out[16];
    for (int i = 0; i < 32; ++i) a[i] = bf16(normal(rng)), b[i] = bf16(normal(rng));
    for (float& x : acc) x = 4 * normal(rng);
    _mm512_storeu_ps(out, _mm512_dpbf16_ps(_mm512_loadu_ps(acc), (__m512bh)_mm512_loadu_si512(a), (__m512bh)_mm512_loadu_si512(b)));
    for (int i = 0; i < 16; ++i) {
      const float odd = acc[i] + widen(a[2 * i + 1]) * widen(b[2 * i + 1]);  // -ffp-contract=off: two roundings
      mismatches += bits(odd + widen(a[2 * i]) * widen(b[2 * i])) != bits(out[i]);
    }
  }
  return mismatches;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("bf16_attend", &bf16_attend);
  m.def("i8_attend", &i8_attend);
  m.def("touch", &touch);
  m.def("dpbf16_mismatches", &dpbf16_mismatches);
}
