// Attention of new tokens over a KV cache in float32, each row on its own (see row_attention.py).
//
// Every row's arithmetic is a function of that row alone: its query, the keys and values it sees in
// order of absolute position, and blocks of `block` absolute positions. So a token verified in a
// tree gets the bits it gets decoded alone, whatever the other rows, the thread count or where the
// cache keeps a position. The rules that make it so:
// * every score is fold(partial(query, key)) * scale: `key_dots`, or for 16 keys at once `query_dots`
//   (fold16) or `tile_scores` (a transposed tile: the same products and the same tree of adds), the
//   same roundings on every path;
// * within a block, a row's weights are `exp_block` of its scores minus its own maximum in that block,
//   and it adds `w` and `w * v` in position order, in float32; positions it does not see have w = 0,
//   which adds nothing;
// * across blocks the sums are float64, in block order, each block's scaled by exp(its maximum - the
//   row's maximum over all blocks), that exp from `exp_block` too;
// * products are summed by `fma` (one rounding) or as written: compiled with -ffp-contract=off, the
//   compiler fuses nothing on its own, so the same sum is the same roundings wherever it is written.
// The cache may store float16: each key and value is widened to float32 (exactly) before any
// arithmetic, where it is read or once into a scratch copy; same bits. 8-bit rows (kv_rows.py) have
// their own arithmetic, by integer products: q8_attention.cpp.
#include <ATen/ATen.h>

#include <optional>

#include "parallel.h"
#include "row_blocks.h"
#include "simd.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace {

using simd::fma;
using simd::fold;
using simd::kLanes;
using simd::load;
using simd::splat;
using simd::store;
using simd::v16;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int64_t kMaxChunks = 16;  // head dims up to 256
constexpr int64_t kGroup = 4;  // lanes whose value sums stay in registers together (a0..a3 below)

// Chunk c (16 values) of a row, in float32 (float16 widened exactly).
template <typename T>
inline v16 chunk(const T* row, int64_t c, int64_t) {
  return load(row + c * kLanes);
}

#if defined(SIMD_AVX2)
// fold16's tree on halves (lo = lanes 0-7, hi = 8-15), with AVX2's in-register shuffles: GCC would move
// the generic shuffles of fold16 below lane by lane through memory.
inline simd::Pair fold16(const simd::Pair* a) {
  __m256 l1[8][2], l2[4][2], l3[2][2];
  for (int i = 0; i < 8; ++i)  // lanes l + (l + 8): a vector's two halves
    for (int h = 0; h < 2; ++h) l1[i][h] = _mm256_add_ps(a[2 * i + h].lo, a[2 * i + h].hi);
  for (int i = 0; i < 4; ++i)  // + 4: the 128-bit quarters of each half
    for (int h = 0; h < 2; ++h) {
      const __m256 x = l1[2 * i + h][0], y = l1[2 * i + h][1];
      l2[i][h] = _mm256_add_ps(_mm256_permute2f128_ps(x, y, 0x20), _mm256_permute2f128_ps(x, y, 0x31));
    }
  for (int i = 0; i < 2; ++i)  // + 2: pairs of lanes
    for (int h = 0; h < 2; ++h) {
      const __m256d x = _mm256_castps_pd(l2[2 * i + h][0]), y = _mm256_castps_pd(l2[2 * i + h][1]);
      l3[i][h] = _mm256_add_ps(_mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_unpacklo_pd(x, y), 0xD8)),
                               _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_unpackhi_pd(x, y), 0xD8)));
    }
  simd::Pair out;
  for (int h = 0; h < 2; ++h) {  // + 1: even and odd lanes
    const __m256 x = l3[h][0], y = l3[h][1];
    const __m256d even = _mm256_castps_pd(_mm256_shuffle_ps(x, y, _MM_SHUFFLE(2, 0, 2, 0)));
    const __m256d odd = _mm256_castps_pd(_mm256_shuffle_ps(x, y, _MM_SHUFFLE(3, 1, 3, 1)));
    (h ? out.hi : out.lo) = _mm256_add_ps(_mm256_castpd_ps(_mm256_permute4x64_pd(even, 0xD8)),
                                          _mm256_castpd_ps(_mm256_permute4x64_pd(odd, 0xD8)));
  }
  return out;
}
#endif

// The same tree for 16 vectors at once: lane i of the result is fold(a[i]), bit for bit.
inline v16 fold16(const v16* a) {
#if defined(SIMD_AVX2)
  simd::Pair halves[kLanes];
  for (int i = 0; i < kLanes; ++i) halves[i] = {simd::low(a[i]), simd::high(a[i])};
  const simd::Pair out = fold16(halves);
  return simd::join(out.lo, out.hi);
#else
  v16 l1[8], l2[4], l3[2];
  for (int i = 0; i < 8; ++i)  // per pair: lanes l + (l + 8) of each, 8 lanes apiece
    l1[i] = __builtin_shufflevector(a[2 * i], a[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
            __builtin_shufflevector(a[2 * i], a[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  for (int i = 0; i < 4; ++i)  // + 4: 4 lanes apiece
    l2[i] = __builtin_shufflevector(l1[2 * i], l1[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
            __builtin_shufflevector(l1[2 * i], l1[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  for (int i = 0; i < 2; ++i)  // + 2: 2 lanes apiece
    l3[i] = __builtin_shufflevector(l2[2 * i], l2[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
            __builtin_shufflevector(l2[2 * i], l2[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
  return __builtin_shufflevector(l3[0], l3[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
         __builtin_shufflevector(l3[0], l3[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
#endif
}

// Per lane: query chunk 0 times key chunk 0, then the other chunks fused in, in order.
// C chunks known when compiled (the usual head sizes), else 0 and `chunks`; P float or float16 (a key).
template <int64_t C, typename P>
inline v16 partial(const P* q, const v16* k, int64_t chunks) {
  const int64_t n = C > 0 ? C : chunks;
  v16 a = load(q) * k[0];
  for (int64_t c = 1; c < n; ++c) a = fma(load(q + c * kLanes), k[c], a);
  return a;
}

template <int64_t C, typename T>
void key_dots_of(const T* key, const float* const* queries, int64_t count, int64_t chunks, float scale,
                 float* out, int64_t stride) {
  v16 k[C > 0 ? C : kMaxChunks], parts[kLanes];
  const int64_t n = C > 0 ? C : chunks;
  for (int64_t c = 0; c < n; ++c) k[c] = load(key + c * kLanes);
  int64_t i = 0;
  for (; i + kLanes <= count; i += kLanes) {
    for (int64_t l = 0; l < kLanes; ++l) parts[l] = partial<C>(queries[i + l], k, chunks);
    const v16 dots = fold16(parts) * scale;
    for (int64_t l = 0; l < kLanes; ++l) out[(i + l) * stride] = dots[l];
  }
  for (; i < count; ++i) out[i * stride] = fold(partial<C>(queries[i], k, chunks)) * scale;
}

// out[i * stride] = scale * (query i . key) for `count` queries: 16 at a time, then one by one.
template <typename T>
__attribute__((noinline)) void key_dots(const T* key, const float* const* queries, int64_t count, int64_t dim,
                                        float scale, float* out, int64_t stride) {
  const int64_t chunks = dim / kLanes;
  if (chunks == 4) return key_dots_of<4>(key, queries, count, chunks, scale, out, stride);
  if (chunks == 8) return key_dots_of<8>(key, queries, count, chunks, scale, out, stride);
  key_dots_of<0>(key, queries, count, chunks, scale, out, stride);
}

// out[l * stride] = scale * (query . key l) for 16 keys at once: the same `partial` and `fold` per score
// as `key_dots` (fold16's lane l is fold of its l-th vector, and a product's operands commute), so a
// score has the same bits on either path. For few queries (a plain step's), it folds 16 scores at once.
template <int64_t C, typename T>
void query_dots_of(const float* query, const T* const* keys, int64_t chunks, float scale, float* out) {
  const int64_t n = C > 0 ? C : chunks;
#if defined(SIMD_AVX2)  // `partial` and fold16 on halves: the same products and adds
  simd::Pair q[C > 0 ? C : kMaxChunks], parts[kLanes];
  for (int64_t c = 0; c < n; ++c) q[c] = simd::load2(query + c * kLanes);
  for (int64_t l = 0; l < kLanes; ++l) {
    simd::Pair k = simd::load2(keys[l]);
    __m256 lo = _mm256_mul_ps(k.lo, q[0].lo), hi = _mm256_mul_ps(k.hi, q[0].hi);
    for (int64_t c = 1; c < n; ++c) {
      k = simd::load2(keys[l] + c * kLanes);
      lo = _mm256_fmadd_ps(k.lo, q[c].lo, lo);
      hi = _mm256_fmadd_ps(k.hi, q[c].hi, hi);
    }
    parts[l] = {lo, hi};
  }
  const simd::Pair dots = fold16(parts);
  _mm256_storeu_ps(out, _mm256_mul_ps(dots.lo, _mm256_set1_ps(scale)));
  _mm256_storeu_ps(out + 8, _mm256_mul_ps(dots.hi, _mm256_set1_ps(scale)));
#else
  v16 q[C > 0 ? C : kMaxChunks], parts[kLanes];
  for (int64_t c = 0; c < n; ++c) q[c] = load(query + c * kLanes);
  for (int64_t l = 0; l < kLanes; ++l) parts[l] = partial<C>(keys[l], q, chunks);
  store(out, fold16(parts) * scale);
#endif
}

template <typename T>
__attribute__((noinline)) void query_dots(const float* query, const T* const* keys, int64_t dim, float scale,
                                          float* out) {
  const int64_t chunks = dim / kLanes;
  if (chunks == 4) return query_dots_of<4>(query, keys, chunks, scale, out);
  if (chunks == 8) return query_dots_of<8>(query, keys, chunks, scale, out);
  query_dots_of<0>(query, keys, chunks, scale, out);
}

// From this many lanes on, a tile of 16 keys is transposed once (dimension-major) and each lane's 16
// scores come from broadcast products, without fold16's shuffles; the same bits as `query_dots`.
constexpr int64_t kTransposeWidth = 6;
constexpr bool kPrefetch = true;

// 16 keys (`stride` apart) widened and transposed: tile[d * 16 + l] = key l's dimension d.
template <typename T>
void transpose_keys(const T* key0, int64_t stride, float* tile, int64_t chunks) {
  for (int64_t c = 0; c < chunks; ++c) {
    v16 r[kLanes];
    for (int64_t l = 0; l < kLanes; ++l) r[l] = load(key0 + l * stride + c * kLanes);
    row_blocks::transpose16(r);
    for (int64_t i = 0; i < kLanes; ++i) store(tile + (c * kLanes + i) * kLanes, r[i]);
  }
}

// 16 scores for each of G lanes from a transposed tile: lane l of a[i] is key l's partial lane i (the
// product of dimension i, then those of i + 16, i + 32, ... fused in), and the adds are fold's tree
// (i + 8, then + 4, + 2, + 1), so every score has the bits `query_dots` and `key_dots` give it.
template <int64_t C, int64_t G>
inline void tile_scores_of(const float* const* q, const float* tile, int64_t chunks, float scale, float* const* out) {
  const int64_t n = C > 0 ? C : chunks;
  auto partials = [&](int64_t i, v16* a) {
    const v16 k0 = load(tile + i * kLanes);
    for (int64_t g = 0; g < G; ++g) a[g] = splat(q[g][i]) * k0;
    for (int64_t c = 1; c < n; ++c) {
      const v16 k = load(tile + (c * kLanes + i) * kLanes);
      for (int64_t g = 0; g < G; ++g) a[g] = fma(splat(q[g][c * kLanes + i]), k, a[g]);
    }
  };
  v16 l2[4][G];
  for (int64_t i = 0; i < 4; ++i) {
    v16 a[G], b[G];
    partials(i, a);
    partials(i + 8, b);
    for (int64_t g = 0; g < G; ++g) a[g] = a[g] + b[g];
    v16 c[G], d[G];
    partials(i + 4, c);
    partials(i + 12, d);
    for (int64_t g = 0; g < G; ++g) l2[i][g] = a[g] + (c[g] + d[g]);
  }
  for (int64_t g = 0; g < G; ++g) store(out[g], ((l2[0][g] + l2[2][g]) + (l2[1][g] + l2[3][g])) * scale);
}

// scores[lane * stride + l] = scale * (query of lane . key l) for every lane, 4 lanes at a time.
template <int64_t C>
void tile_scores_c(const float* const* queries, int64_t width, const float* tile, int64_t chunks, float scale,
                   float* scores, int64_t stride) {
  int64_t lane = 0;
  for (; lane + 4 <= width; lane += 4) {
    float* out[4] = {scores + lane * stride, scores + (lane + 1) * stride, scores + (lane + 2) * stride,
                     scores + (lane + 3) * stride};
    tile_scores_of<C, 4>(queries + lane, tile, chunks, scale, out);
  }
  for (; lane < width; ++lane) {
    float* out[1] = {scores + lane * stride};
    tile_scores_of<C, 1>(queries + lane, tile, chunks, scale, out);
  }
}

__attribute__((noinline)) void tile_scores(const float* const* queries, int64_t width, const float* tile,
                                           int64_t chunks, float scale, float* scores, int64_t stride) {
  if (chunks == 4) return tile_scores_c<4>(queries, width, tile, chunks, scale, scores, stride);
  tile_scores_c<0>(queries, width, tile, chunks, scale, scores, stride);
}

template <typename T>
using Held = std::vector<std::pair<int64_t, const T*>>;  // (index in the block, value row)

// For G lanes (G <= kGroup): out[g] = sum over `held` of w[g][j] * v and total[g] = sum of w[g][j], in
// position order. The weight sums ride along with the products, whose arithmetic hides their latency.
template <int64_t C, int64_t G, typename T>
void value_sums(const Held<T>& held, const float* const* w, int64_t chunks, float* const* out, float* total) {
  float t[G] = {};
#if defined(SIMD_AVX2)
  // One chunk at a time (G x 2 accumulators fit AVX2's 16 registers; G x C would spill): each sum
  // adds the same products in the same order.
  const int64_t n = C > 0 ? C : chunks;
  for (int64_t c = 0; c < n; ++c) {
    __m256 a[G][2];
    for (int64_t g = 0; g < G; ++g) a[g][0] = a[g][1] = _mm256_setzero_ps();
    for (const auto& [j, v] : held) {
      const simd::Pair x = simd::load2(v + c * kLanes);
      for (int64_t g = 0; g < G; ++g) {
        if (c == 0) t[g] = t[g] + w[g][j];
        const __m256 b = _mm256_set1_ps(w[g][j]);
        a[g][0] = _mm256_fmadd_ps(b, x.lo, a[g][0]);
        a[g][1] = _mm256_fmadd_ps(b, x.hi, a[g][1]);
      }
    }
    for (int64_t g = 0; g < G; ++g) {
      _mm256_storeu_ps(out[g] + c * kLanes, a[g][0]);
      _mm256_storeu_ps(out[g] + c * kLanes + 8, a[g][1]);
    }
  }
#else
  if constexpr (C > 0) {  // the whole row in registers: G x C accumulators
    v16 a[G][C] = {};
    for (const auto& [j, v] : held) {
      v16 x[C];
      for (int64_t c = 0; c < C; ++c) x[c] = chunk(v, c, C);
      for (int64_t g = 0; g < G; ++g) {
        t[g] = t[g] + w[g][j];
        const v16 b = splat(w[g][j]);
        for (int64_t c = 0; c < C; ++c) a[g][c] = fma(b, x[c], a[g][c]);
      }
    }
    for (int64_t g = 0; g < G; ++g)
      for (int64_t c = 0; c < C; ++c) store(out[g] + c * kLanes, a[g][c]);
  } else {
    for (int64_t c = 0; c < chunks; ++c) {  // one chunk at a time: the same sums, in the same order
      v16 a[G] = {};
      for (const auto& [j, v] : held) {
        const v16 x = chunk(v, c, chunks);
        for (int64_t g = 0; g < G; ++g) {
          if (c == 0) t[g] = t[g] + w[g][j];
          a[g] = fma(splat(w[g][j]), x, a[g]);
        }
      }
      for (int64_t g = 0; g < G; ++g) store(out[g] + c * kLanes, a[g]);
    }
  }
#endif
  for (int64_t g = 0; g < G; ++g) total[g] = t[g];
}

template <int64_t C, typename T>
void value_sums_of(int64_t lanes, const Held<T>& held, const float* const* w, int64_t chunks, float* const* out,
                   float* total) {
  if (lanes == 1) return value_sums<C, 1>(held, w, chunks, out, total);
  if (lanes == 2) return value_sums<C, 2>(held, w, chunks, out, total);
  if (lanes == 3) return value_sums<C, 3>(held, w, chunks, out, total);
  value_sums<C, 4>(held, w, chunks, out, total);
}

// floor(t), exactly, for |t| < 2^31.
inline v16 floor16(v16 t) {
#if defined(__AVX512F__)
  return reinterpret_cast<v16>(_mm512_roundscale_ps(reinterpret_cast<__m512>(t), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC));
#elif defined(SIMD_AVX2)
  return simd::join(_mm256_round_ps(simd::low(t), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC),
                    _mm256_round_ps(simd::high(t), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC));
#else
  typedef int32_t i16 __attribute__((vector_size(kLanes * sizeof(int32_t))));
  const v16 n = __builtin_convertvector(__builtin_convertvector(t, i16), v16);  // toward zero, then down
  return n > t ? n - 1.f : n;
#endif
}

}  // namespace

// exp(x) for x <= 0 (scores minus their max), 0 for -inf: range reduction and a degree-6 polynomial,
// each step one fma, 16 lanes at a time (`n` is a multiple of 16), so every weight takes the same
// instructions.
__attribute__((noinline)) void row_blocks::exp_block(const float* scores, float top, float* out, int64_t n) {
#if defined(SIMD_AVX2)  // the same steps on 8 lanes at a time (GCC would do the selects lane by lane)
  const __m256 lowest = _mm256_set1_ps(-87.f), tops = _mm256_set1_ps(top);
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 x = _mm256_sub_ps(_mm256_loadu_ps(scores + i), tops);
    const __m256 below = _mm256_cmp_ps(x, lowest, _CMP_LT_OQ);  // x < lowest, false for NaN
    const __m256 clamped = _mm256_blendv_ps(x, lowest, below);
    const __m256 n_ = _mm256_round_ps(_mm256_fmadd_ps(clamped, _mm256_set1_ps(1.44269504f), _mm256_set1_ps(0.5f)),
                                      _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    const __m256 r = _mm256_fmadd_ps(n_, _mm256_set1_ps(-1.42860677e-06f),
                                     _mm256_fmadd_ps(n_, _mm256_set1_ps(-0.693145752f), clamped));
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(1.f / 720.f), r, _mm256_set1_ps(1.f / 120.f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 24.f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 6.f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n_), _mm256_set1_epi32(127)), 23);
    _mm256_storeu_ps(out + i, _mm256_andnot_ps(below, _mm256_mul_ps(p, _mm256_castsi256_ps(bits))));  // +0 below
  }
#else
  typedef int32_t i16 __attribute__((vector_size(kLanes * sizeof(int32_t))));
  const v16 lowest = splat(-87.f);
  for (int64_t i = 0; i < n; i += kLanes) {
    const v16 x = load(scores + i) - top;
    const v16 clamped = x < lowest ? lowest : x;
    const v16 n_ = floor16(fma(clamped, splat(1.44269504f), splat(0.5f)));  // the nearest power of 2
    const v16 r = fma(n_, splat(-1.42860677e-06f), fma(n_, splat(-0.693145752f), clamped));
    v16 p = fma(splat(1.f / 720.f), r, splat(1.f / 120.f));
    p = fma(p, r, splat(1.f / 24.f));
    p = fma(p, r, splat(1.f / 6.f));
    p = fma(p, r, splat(0.5f));
    p = fma(p, r, splat(1.f));
    p = fma(p, r, splat(1.f));
    const i16 bits = (__builtin_convertvector(n_, i16) + 127) << 23;
    v16 scale;
    std::memcpy(&scale, &bits, sizeof(scale));
    store(out + i, x < lowest ? v16{} : p * scale);
  }
#endif
}

namespace {

// A float16 row widened into `out` (exact), `dim` a multiple of 16; returns `out`.
inline const float* widen(const c10::Half* row, float* out, int64_t dim) {
  for (int64_t c = 0; c < dim; c += kLanes) store(out + c, load(row + c));
  return out;
}
inline const float* widen(const float* row, float*, int64_t) { return row; }

template <typename T>
constexpr bool kWidens = !std::is_same_v<T, float>;

template <typename T>  // the cache's storage: float, or float16 widened as it is read
struct Layout {
  int64_t rows, heads, kv, group, dim, block, sinks, stored, offset, committed, depths;
  const float *q, *sq;
  const T *k, *v;
  int64_t k_head, k_pos, v_head, v_pos;
  const int64_t *lowest, *anc;

  const T* key(int64_t head, int64_t row) const { return k + head * k_head + row * k_pos; }
  const T* value(int64_t head, int64_t row) const { return v + head * v_head + row * v_pos; }
  // The cache row of held position `pos` (a sink or a committed one) if any row sees it, else -1.
  int64_t shared(int64_t pos, int64_t min_lowest) const {
    if (pos < sinks) return pos;
    if (pos >= committed) return -1;
    const int64_t row = pos - offset;
    return row >= min_lowest && row < stored ? row : -1;
  }
  bool sees(int64_t r, int64_t pos, int64_t row) const { return pos < sinks || row >= lowest[r]; }
};

template <typename T>  // one thread's scratch for the blocks it computes, kept across calls
struct Buffers {
  std::vector<float> scores, keys, values;
  Held<T> held;
  Held<float> wide_held;
};

// This thread's scratch. Through a call GCC cannot see into: a reference to a thread_local from a shared
// library is re-derived at each use (a call to __tls_get_addr), and `held` grows by one per position
// (a 4K plain step's attention 4% less without it: new/old 0.962, IQR 0.905-0.997, 150 rounds).
template <typename T>
__attribute__((noinline)) Buffers<T>* thread_buffers() {
  static thread_local Buffers<T> buffers;
  return &buffers;
}

// Every lane's per-block results, kept across calls (no allocation, no page faults per forward).
template <typename X>
X* scratch(std::vector<X>& buffer, size_t size) {
  if (buffer.size() < size) buffer.resize(size);
  return buffer.data();
}

template <typename T>
at::Tensor attend(const at::Tensor& q, const at::Tensor& sq, const at::Tensor& keys, const at::Tensor& values,
                  const at::Tensor& lowest, const at::Tensor& anc, int64_t sinks, int64_t stored, int64_t offset,
                  int64_t committed, double scaling, int64_t block) {
  const Layout<T> at{q.size(0), q.size(1), keys.size(0), q.size(1) / keys.size(0), q.size(2), block, sinks, stored,
                     offset, committed, anc.size(1), q.data_ptr<float>(), sq.data_ptr<float>(), keys.data_ptr<T>(),
                     values.data_ptr<T>(), keys.stride(0), keys.stride(1), values.stride(0), values.stride(1),
                     lowest.data_ptr<int64_t>(), anc.data_ptr<int64_t>()};
  const int64_t rows = at.rows, group = at.group, dim = at.dim, width = rows * group;  // lanes per kv head
  const int64_t chunks = dim / kLanes;
  const float scale = static_cast<float>(scaling);
  const int64_t min_lowest = *std::min_element(at.lowest, at.lowest + rows);
  std::vector<int64_t> blocks;  // the blocks of absolute positions some row sees, in order
  for (int64_t b = 0; b * block < sinks; ++b) blocks.push_back(b);  // the kept positions (--keep), however many
  for (int64_t b = (min_lowest + offset) / block; b <= (committed + at.depths - 1) / block; ++b)
    if (blocks.empty() || blocks.back() != b) blocks.push_back(b);
  const int64_t nb = static_cast<int64_t>(blocks.size()), nodes = keys.size(1) - stored;
  // held positions [whole_begin, whole_end) are cache rows every row may see, past the sinks: tiles of
  // 16 of them take the fast paths; the others go position by position through `shared`
  const int64_t whole_begin = std::max(sinks, min_lowest + offset), whole_end = std::min(committed, stored + offset);

  // Scores of every lane (row r, query head g of the kv head) against the new tokens, per kv head.
  std::vector<float> node_scores(at.kv * nodes * width);  // [kv][node][lane]
  std::vector<const float*> all_queries(at.kv * 2 * width);  // per kv head: its lanes' queries, then sink queries
  for (int64_t head = 0; head < at.kv; ++head)
    for (int64_t lane = 0; lane < width; ++lane) {
      const int64_t offset_q = ((lane / group) * at.heads + head * group + lane % group) * dim;
      all_queries[head * 2 * width + lane] = at.q + offset_q;
      all_queries[head * 2 * width + width + lane] = at.sq + offset_q;
    }
  for (int64_t head = 0; head < at.kv; ++head)
    for (int64_t node = 0; node < nodes; ++node)
      key_dots(at.key(head, stored + node), all_queries.data() + head * 2 * width,
               width, dim, scale, node_scores.data() + (head * nodes + node) * width, 1);

  // Per (kv head, block), in one pass while its keys and values are at hand: each lane's scores, their
  // maximum `top`, weights exp(score - top), and the block's weight sum and weighted values (float32).
  static thread_local std::vector<float> tops, sums, accs;
  float* block_top = scratch(tops, at.kv * nb * width);
  float* block_sum = scratch(sums, at.kv * nb * width);
  float* block_acc = scratch(accs, at.kv * nb * width * dim);
  const bool transposed = width >= kTransposeWidth;
  parallel::split(0, at.kv * nb, 1, [&](int64_t begin, int64_t end) {
    Buffers<T>& mine = *thread_buffers<T>();
    std::vector<float>&scores_buffer = mine.scores, &keys_buffer = mine.keys, &values_buffer = mine.values;
    Held<T>& held = mine.held;
    Held<float>& wide_held = mine.wide_held;
    float* scores = scratch(scores_buffer, width * block);  // [lane][position in the block], then the weights
    float* tile = scratch(keys_buffer, kLanes * dim);  // 16 keys widened (exact), row by row or transposed
    for (int64_t item = begin; item < end; ++item) {
      const int64_t head = item / nb, first = blocks[item % nb] * block;
      const float* const* queries = all_queries.data() + head * 2 * width;
      // the next block's keys and values, fetched a tile at a time while this one computes: a plain
      // step does too little arithmetic per key for the hardware's prefetcher alone to keep up
      const char *next_k = nullptr, *next_v = nullptr;
      int64_t next_rows = 0;
      if (item + 1 < end) {
        const int64_t next_head = (item + 1) / nb, next_first = blocks[(item + 1) % nb] * block;
        const int64_t row0 = std::max<int64_t>(0, next_first - offset), row1 = std::min(stored, next_first + block - offset);
        if (row1 > row0) {
          next_k = reinterpret_cast<const char*>(at.key(next_head, row0));
          next_v = reinterpret_cast<const char*>(at.value(next_head, row0));
          next_rows = row1 - row0;
        }
      }
      for (int64_t j = 0; j < block; j += kLanes) {
        if (kPrefetch && stored > 0) {
          // the next 16 keys, and this block's values for later, while these keys are scored: the reads
          // come in bursts between long stretches of arithmetic, and would each wait on memory
          const int64_t next = first + j + kLanes - offset, these = first + j - offset;
          for (int64_t l = 0; l < kLanes; ++l) {
            const char* k = reinterpret_cast<const char*>(at.key(head, std::min(next + l, stored - 1)));
            const char* v = reinterpret_cast<const char*>(at.value(head, std::clamp<int64_t>(these + l, 0, stored - 1)));
            for (int64_t byte = 0; byte < dim * static_cast<int64_t>(sizeof(T)); byte += 64) {
              __builtin_prefetch(k + byte, 0, 3);
              __builtin_prefetch(v + byte, 0, 2);
            }
          }
        }
        if (first + j >= whole_begin && first + j + kLanes <= whole_end) {  // 16 held keys every lane may see
          const T* key0 = at.key(head, first + j - offset);
          if (transposed) {
            transpose_keys(key0, at.k_pos, tile, chunks);
            tile_scores(queries, width, tile, chunks, scale, scores + j, block);
          } else if (kWidens<T> && width > 1) {  // the 16 keys widened once (exact) for all lanes
            const float* keys16[kLanes];
            for (int64_t l = 0; l < kLanes; ++l) keys16[l] = widen(key0 + l * at.k_pos, tile + l * dim, dim);
            for (int64_t lane = 0; lane < width; ++lane) query_dots(queries[lane], keys16, dim, scale, scores + lane * block + j);
          } else {
            const T* keys16[kLanes];
            for (int64_t l = 0; l < kLanes; ++l) keys16[l] = key0 + l * at.k_pos;
            for (int64_t lane = 0; lane < width; ++lane) query_dots(queries[lane], keys16, dim, scale, scores + lane * block + j);
          }
          continue;
        }
        for (int64_t lane = 0; lane < width; ++lane) store(scores + lane * block + j, v16{} + kNegInf);
        for (int64_t l = j; l < j + kLanes; ++l) {
          const int64_t pos = first + l, row = at.shared(pos, min_lowest);
          if (row < 0) continue;
          key_dots(at.key(head, row), queries + (pos < sinks ? width : 0), width, dim, scale,
                   scores + l, block);
        }
      }
      float* top = block_top + item * width;
      for (int64_t lane = 0; lane < width; ++lane) {
        float* s = scores + lane * block;
        const int64_t r = lane / group;
        // held positions below the row's own lowest are not seen (the sinks always are)
        const int64_t hidden_end = std::min(first + block, at.lowest[r] + offset);
        for (int64_t pos = std::max(first, sinks); pos < hidden_end; ++pos) s[pos - first] = kNegInf;
        for (int64_t t = std::max<int64_t>(0, first - committed); t < at.depths && committed + t < first + block; ++t) {
          const int64_t node = at.anc[r * at.depths + t];
          if (node >= 0) s[committed + t - first] = node_scores[(head * nodes + node) * width + lane];
        }
        top[lane] = row_blocks::weights_of(s, block);
      }
      const float* weights = scores;
      float* sum = block_sum + item * width;
      float* acc = block_acc + item * width * dim;
      held.clear();  // the positions of the block some row sees, in order
      for (int64_t j = 0; j < block; ++j) {
        const int64_t pos = first + j;
        if (pos >= whole_begin && pos < whole_end) {
          held.push_back({j, at.value(head, pos - offset)});
        } else if (const int64_t row = at.shared(pos, min_lowest); row >= 0) {
          held.push_back({j, at.value(head, row)});
        }
      }
      auto value_lanes = [&](const auto& values) {
        for (int64_t lane0 = 0; lane0 < width; lane0 += kGroup) {  // kGroup lanes at a time, in registers
          const int64_t lanes = std::min(kGroup, width - lane0);
          const float* w[kGroup];
          float* out[kGroup];
          for (int64_t g = 0; g < lanes; ++g) {
            w[g] = weights + (lane0 + g) * block;
            out[g] = acc + (lane0 + g) * dim;
          }
          if (chunks == 4)
            value_sums_of<4>(lanes, values, w, chunks, out, sum + lane0);
          else
            value_sums_of<0>(lanes, values, w, chunks, out, sum + lane0);
        }
      };
      // several passes over the block's values: widen them once (exact)
      if (kWidens<T> && width > kGroup) {
        float* widened = scratch(values_buffer, held.size() * dim);
        wide_held.clear();
        for (size_t i = 0; i < held.size(); ++i)
          wide_held.push_back({held[i].first, widen(held[i].second, widened + i * dim, dim)});
        value_lanes(wide_held);
      } else {
        value_lanes(held);
      }
      for (int64_t lane = 0; lane < width; ++lane) {  // then each row's ancestors, after every held position
        const int64_t r = lane / group;
        for (int64_t t = std::max<int64_t>(0, first - committed); t < at.depths && committed + t < first + block; ++t) {
          const int64_t node = at.anc[r * at.depths + t];
          if (node < 0) continue;
          const float w = weights[lane * block + committed + t - first];
          const T* v = at.value(head, stored + node);
          sum[lane] = sum[lane] + w;
          float* out = acc + lane * dim;
          for (int64_t c = 0; c < chunks; ++c) store(out + c * kLanes, fma(splat(w), chunk(v, c, chunks), load(out + c * kLanes)));
        }
      }
    }
  });

  return row_blocks::combine(block_top, block_sum, block_acc, rows, at.heads, at.kv, width, nb, dim, q.options());
}

}  // namespace


// Each lane's blocks, in block order and float64, each scaled by exp(its top - the lane's top) (from
// exp_block, 16 blocks at a time).
at::Tensor row_blocks::combine(const float* block_top, const float* block_sum, const float* block_acc, int64_t rows,
                               int64_t heads, int64_t kv, int64_t width, int64_t nb, int64_t dim,
                               const at::TensorOptions& options) {
  const int64_t group = heads / kv;
  at::Tensor result = at::empty({rows, heads, dim}, options);
  float* out = result.data_ptr<float>();
  const int64_t padded = (nb + kLanes - 1) / kLanes * kLanes;
  parallel::split(0, kv * width, 1, [&](int64_t begin, int64_t end) {
    std::vector<double> total(dim);
    std::vector<float> tops_of(padded, kNegInf), factors(padded);
    for (int64_t index = begin; index < end; ++index) {
      const int64_t head = index / width, lane = index % width;
      float overall = kNegInf;
      for (int64_t b = 0; b < nb; ++b) {
        tops_of[b] = block_top[(head * nb + b) * width + lane];
        overall = std::max(overall, tops_of[b]);
      }
      exp_block(tops_of.data(), overall, factors.data(), padded);
      double weight = 0.0;
      std::fill(total.begin(), total.end(), 0.0);
      for (int64_t b = 0; b < nb; ++b) {
        if (tops_of[b] == kNegInf) continue;  // a block the lane does not see
        const int64_t item = head * nb + b;
        const double factor = factors[b];
        weight += factor * block_sum[item * width + lane];
        const float* a = block_acc + (item * width + lane) * dim;
        for (int64_t d = 0; d < dim; ++d) total[d] += factor * a[d];
      }
      float* o = out + ((lane / group) * heads + head * group + lane % group) * dim;
      for (int64_t d = 0; d < dim; ++d) o[d] = static_cast<float>(total[d] / weight);
    }
  });
  return result;
}

at::Tensor q8_row_attention(const at::Tensor& q, const at::Tensor& sq, const at::Tensor& keys,
                            const at::Tensor& values, const at::Tensor& lowest, const at::Tensor& anc, int64_t sinks,
                            int64_t stored, int64_t offset, int64_t committed, double scaling, int64_t block,
                            const std::optional<at::Tensor>& mirror, const std::optional<at::Tensor>& mirror_state);

// q, sq: [R, H, D] float32; keys, values: [KV, N, D] (D contiguous), float32 or float16 (computed in
// float32), or [KV, N, D * 9 / 8] uint8: 8-bit rows with their scales (kv_rows.py, q8_attention.cpp); lowest: [R] first
// held cache row each row sees; anc: [R, T] node at each depth of each row's path (-1 past its own depth).
at::Tensor row_attention(const at::Tensor& q, const at::Tensor& sq, const at::Tensor& keys, const at::Tensor& values,
                         const at::Tensor& lowest, const at::Tensor& anc, int64_t sinks, int64_t stored,
                         int64_t offset, int64_t committed, double scaling, int64_t block) {
  TORCH_CHECK(q.dtype() == at::kFloat && sq.dtype() == at::kFloat && keys.dtype() == values.dtype() &&
              (keys.dtype() == at::kFloat || keys.dtype() == at::kHalf || keys.dtype() == at::kByte));
  TORCH_CHECK(keys.dtype() != at::kByte || (q.size(2) % 32 == 0 && keys.size(2) == q.size(2) * 9 / 8 &&
                                             values.size(2) == keys.size(2)),
              "8-bit rows: the head size in groups of 32, each row its levels and float32 scales");
  TORCH_CHECK(q.is_contiguous() && sq.is_contiguous() && keys.stride(2) == 1 && values.stride(2) == 1);
  TORCH_CHECK(lowest.is_contiguous() && anc.is_contiguous() && lowest.dtype() == at::kLong &&
              anc.dtype() == at::kLong);
  TORCH_CHECK(q.size(2) % kLanes == 0 && q.size(2) <= kLanes * kMaxChunks && block % kLanes == 0 && q.size(1) % keys.size(0) == 0);
  if (keys.dtype() == at::kHalf)
    return attend<c10::Half>(q, sq, keys, values, lowest, anc, sinks, stored, offset, committed, scaling, block);
  if (keys.dtype() == at::kByte)
    return q8_row_attention(q, sq, keys, values, lowest, anc, sinks, stored, offset, committed, scaling, block,
                            std::nullopt, std::nullopt);
  return attend<float>(q, sq, keys, values, lowest, anc, sinks, stored, offset, committed, scaling, block);
}
