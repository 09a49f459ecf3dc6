// Attention of new tokens over 8-bit cache rows (kv_rows.py: `dim` int8 levels, then a float32 scale
// per 32), by integer dot products: the arithmetic of `--kv-cache int8` (row_attention.cpp keeps the
// float one for float32 and float16 caches).
//
// A row's result is a function of that row alone, as in row_attention.cpp, and most of it is exact:
// * each lane's query is rounded to 8-bit levels per 32 dimensions (scale max |q| / 127), and what that
//   leaves to 8 bits more, in 1/254 of a level. Per group of 32, a score's integer part
//   254 * sum(level_q * level_k) + sum(rest_q * level_k) is exact in int32, in any order, on any path;
// * a score is then, over the groups in order, s = fma(float(integer part) * key scale, query factor, s);
// * weights are exp(score - the block's max) (row_attention.cpp's exp_block); each lane's weights times
//   a position's value scale, per group of 32 dims, are rounded to unsigned 8 bits, 255 at the block's
//   largest; the values are summed as integers (exact), times that step (largest / 255) once a block;
// * a block's weight sum is one fixed tree over its positions' weights (the unseen ones add 0);
// * blocks combine in float64 as in row_attention.cpp.
// On AVX-512 VNNI the 4-byte dot products are vpdpbusd; elsewhere the same integers, lane by lane.
#include <ATen/ATen.h>

#include "parallel.h"
#include "row_blocks.h"
#include "simd.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

using simd::fma;
using simd::kLanes;
using simd::load;
using simd::splat;
using simd::store;
using simd::v16;
typedef int32_t i16 __attribute__((vector_size(kLanes * sizeof(int32_t))));
typedef uint32_t u16 __attribute__((vector_size(kLanes * sizeof(uint32_t))));

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int64_t kGroup = 32;          // values per scale
constexpr int64_t kMaxDim = 256;
constexpr int32_t kRest = 254;          // the query's second part counts in 1/254 of a level
constexpr int64_t kLaneGroup = 4;       // lanes whose value sums stay in registers together
const uint8_t kZeroRow[kMaxDim + kMaxDim / kGroup * 4] = {};  // a row that adds nothing (level 0, scale 0)

inline i16 splat_i(int32_t x) { return i16{} + x; }

// 16 bytes widened to 16 int32 lanes, as unsigned or signed bytes; 16 lanes (0..255) narrowed to bytes.
// (GCC's __builtin_convertvector between these sizes goes byte by byte.)
inline i16 widen_unsigned(const uint8_t* p) {
#if defined(__AVX512F__)
  return reinterpret_cast<i16>(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#else
  i16 x;
  for (int64_t l = 0; l < kLanes; ++l) x[l] = p[l];
  return x;
#endif
}
inline i16 widen_signed(const int8_t* p) {
#if defined(__AVX512F__)
  return reinterpret_cast<i16>(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#else
  i16 x;
  for (int64_t l = 0; l < kLanes; ++l) x[l] = p[l];
  return x;
#endif
}
inline void narrow_unsigned(i16 x, uint8_t* out) {
#if defined(__AVX512F__)
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_cvtepi32_epi8(reinterpret_cast<__m512i>(x)));
#else
  for (int64_t l = 0; l < kLanes; ++l) out[l] = static_cast<uint8_t>(x[l]);
#endif
}

// Each lane rounded to the nearest integer, ties to even (as std::nearbyint in the default mode).
inline v16 round_even(v16 x) {
#if defined(__AVX512F__)
  return reinterpret_cast<v16>(
      _mm512_roundscale_ps(reinterpret_cast<__m512>(x), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#elif defined(SIMD_AVX2)
  return simd::join(_mm256_round_ps(simd::low(x), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                    _mm256_round_ps(simd::high(x), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#else
  for (int64_t l = 0; l < kLanes; ++l) x[l] = std::nearbyint(x[l]);
  return x;
#endif
}

// acc + per lane, the sum of its 4 bytes of `a` (unsigned) times those of `b` (signed): exact.
inline i16 dot4(i16 acc, i16 a, i16 b) {
#if defined(__AVX512VNNI__) && defined(__AVX512F__)
  return reinterpret_cast<i16>(_mm512_dpbusd_epi32(reinterpret_cast<__m512i>(acc), reinterpret_cast<__m512i>(a),
                                                    reinterpret_cast<__m512i>(b)));
#else
  const u16 ua = reinterpret_cast<u16>(a);
  for (int k = 0; k < 4; ++k)
    acc += reinterpret_cast<i16>((ua >> (8 * k)) & 0xFFu) * ((b << (24 - 8 * k)) >> 24);
  return acc;
#endif
}

inline float scale_of(const uint8_t* row, int64_t dim, int64_t group) {
  float s;
  std::memcpy(&s, row + dim + group * 4, sizeof(s));
  return s;
}

// One lane's query: levels and the rest per 32 dimensions, 4 bytes a word (as the key tiles' lanes).
struct Query {
  int32_t levels[kMaxDim / 4], rest[kMaxDim / 4];
  int32_t level_bias[kMaxDim / kGroup], rest_bias[kMaxDim / kGroup];  // 128 * their sums: the keys' +128
  float factor[kMaxDim / kGroup];  // scale * scaling / 254
};

Query quantise(const float* q, int64_t dim, float scaling) {
  Query out{};
  for (int64_t g = 0; g < dim / kGroup; ++g) {
    const float* x = q + g * kGroup;
    float largest = 0.f;
    for (int64_t d = 0; d < kGroup; ++d) largest = std::max(largest, std::fabs(x[d]));
    const float inverse = largest > 0.f ? 127.f / largest : 0.f;
    int8_t levels[kGroup], rest[kGroup];
    int32_t level_sum = 0, rest_sum = 0;
    for (int64_t d = 0; d < kGroup; ++d) {
      const float scaled = x[d] * inverse;
      const float level = std::clamp(std::nearbyint(scaled), -127.f, 127.f);
      levels[d] = static_cast<int8_t>(level);
      rest[d] = static_cast<int8_t>(std::clamp(std::nearbyint((scaled - level) * kRest), -127.f, 127.f));
      level_sum += levels[d];
      rest_sum += rest[d];
    }
    std::memcpy(out.levels + g * kGroup / 4, levels, kGroup);
    std::memcpy(out.rest + g * kGroup / 4, rest, kGroup);
    out.level_bias[g] = 128 * level_sum;
    out.rest_bias[g] = 128 * rest_sum;
    out.factor[g] = largest / 127.f * scaling / static_cast<float>(kRest);
  }
  return out;
}

// 16 rows' levels (+128, as unsigned bytes) transposed: tile[r] lane l = row l's dimensions 4r..4r+3.
void key_tile(const uint8_t* const* rows, int64_t dim, i16* tile) {
  for (int64_t c = 0; c < (dim + 63) / 64; ++c) {
    const bool whole = dim - c * 64 >= 64;  // else 32 levels, then zeros (level 0)
    i16 r[kLanes];
    for (int64_t l = 0; l < kLanes; ++l) {
      r[l] = i16{};
      if (whole)
        std::memcpy(&r[l], rows[l] + c * 64, 64);
      else
        std::memcpy(&r[l], rows[l] + c * 64, 32);
      r[l] ^= static_cast<int32_t>(0x80808080u);
    }
    row_blocks::transpose16(r);
    for (int64_t i = 0; i < kLanes; ++i) tile[c * kLanes + i] = r[i];
  }
}

// scores[l] for the 16 rows of `tile` and one query: the integer parts per group, then their floats.
inline v16 tile_scores(const i16* tile, const Query& q, const v16* key_scales, int64_t dim) {
  v16 s = v16{};
  for (int64_t g = 0; g < dim / kGroup; ++g) {
    i16 levels = i16{}, rest = i16{};
    for (int64_t r = g * kGroup / 4; r < (g + 1) * kGroup / 4; ++r) {
      levels = dot4(levels, tile[r], splat_i(q.levels[r]));
      rest = dot4(rest, tile[r], splat_i(q.rest[r]));
    }
    const i16 whole = (levels - q.level_bias[g]) * kRest + (rest - q.rest_bias[g]);
    s = fma(__builtin_convertvector(whole, v16) * key_scales[g], splat(q.factor[g]), s);
  }
  return s;
}

// For 16 rows (a null one reads as a zero row): scores of each of `count` queries into out[i * stride + l].
void score_rows(const uint8_t* const* rows_in, const Query* const* queries, int64_t count, int64_t dim, float* out,
                int64_t stride) {
  const uint8_t* rows[kLanes];
  v16 key_scales[kMaxDim / kGroup];
  for (int64_t l = 0; l < kLanes; ++l) rows[l] = rows_in[l] ? rows_in[l] : kZeroRow;
  for (int64_t g = 0; g < dim / kGroup; ++g)
    for (int64_t l = 0; l < kLanes; ++l) key_scales[g][l] = scale_of(rows[l], dim, g);
  i16 tile[kMaxDim / 4];
  key_tile(rows, dim, tile);
  for (int64_t i = 0; i < count; ++i) store(out + i * stride, tile_scores(tile, *queries[i], key_scales, dim));
}

// 4 rows' levels interleaved: quad[c] lane d = the 4 rows' levels of dimension 16c + d, one byte each.
inline void value_quad(const uint8_t* const* rows, int64_t dim, i16* quad) {
#if defined(__AVX512VBMI__)
  if (dim % 64 == 0) {  // byte permutes: rows 0 and 1 interleaved, 2 and 3, then the pairs
    alignas(64) static const auto indices = [] {
      std::array<std::array<uint8_t, 64>, 6> out{};
      for (int i = 0; i < 64; ++i) {
        out[0][i] = static_cast<uint8_t>(i / 2 + (i % 2) * 64);       // dims 0..31 of a and b, alternating
        out[1][i] = static_cast<uint8_t>(32 + i / 2 + (i % 2) * 64);  // dims 32..63
      }
      for (int c = 0; c < 4; ++c)  // dims 16c'..16c'+15 of the pairs (c' = c % 2 within its half)
        for (int d = 0; d < 16; ++d)
          for (int k = 0; k < 4; ++k)
            out[2 + c][4 * d + k] = static_cast<uint8_t>(2 * (16 * (c % 2) + d) + (k % 2) + (k / 2) * 64);
      return out;
    }();
    const __m512i lo = _mm512_load_si512(indices[0].data()), hi = _mm512_load_si512(indices[1].data());
    for (int64_t cc = 0; cc < dim / 64; ++cc) {
      const __m512i r0 = _mm512_loadu_si512(rows[0] + cc * 64), r1 = _mm512_loadu_si512(rows[1] + cc * 64);
      const __m512i r2 = _mm512_loadu_si512(rows[2] + cc * 64), r3 = _mm512_loadu_si512(rows[3] + cc * 64);
      const __m512i pairs[2][2] = {{_mm512_permutex2var_epi8(r0, lo, r1), _mm512_permutex2var_epi8(r2, lo, r3)},
                                   {_mm512_permutex2var_epi8(r0, hi, r1), _mm512_permutex2var_epi8(r2, hi, r3)}};
      for (int c = 0; c < 4; ++c)
        quad[cc * 4 + c] = reinterpret_cast<i16>(_mm512_permutex2var_epi8(
            pairs[c / 2][0], _mm512_load_si512(indices[2 + c].data()), pairs[c / 2][1]));
    }
    return;
  }
#endif
  for (int64_t c = 0; c < dim / kLanes; ++c) {
    i16 word = widen_unsigned(rows[0] + c * kLanes);
    for (int k = 1; k < 4; ++k) word |= widen_unsigned(rows[k] + c * kLanes) << (8 * k);
    quad[c] = word;
  }
}

template <typename T>
T* scratch(std::vector<T>& buffer, size_t size) {
  if (buffer.size() < size) buffer.resize(size);
  return buffer.data();
}

struct Buffers {  // one thread's scratch, kept across calls
  std::vector<float> scores, scaled, value_scales, steps;  // value_scales: [group][position], held ones
  std::vector<uint8_t> weights;  // [lane][group][position]: unsigned 8-bit weights
  std::vector<i16> sums;         // [lane][dim / 16]: integer value sums
};

__attribute__((noinline)) Buffers* thread_buffers() {
  static thread_local Buffers buffers;
  return &buffers;
}

}  // namespace

at::Tensor q8_row_attention(const at::Tensor& q, const at::Tensor& sq, const at::Tensor& keys,
                            const at::Tensor& values, const at::Tensor& lowest, const at::Tensor& anc, int64_t sinks,
                            int64_t stored, int64_t offset, int64_t committed, double scaling, int64_t block) {
  const int64_t rows = q.size(0), heads = q.size(1), dim = q.size(2), kv = keys.size(0), group = heads / kv;
  const int64_t width = rows * group, depths = anc.size(1), groups = dim / kGroup, chunks = dim / kLanes;
  TORCH_CHECK(dim % kGroup == 0 && dim <= kMaxDim, "8-bit rows: the head size in groups of 32, up to 256");
  const uint8_t *k = keys.data_ptr<uint8_t>(), *v = values.data_ptr<uint8_t>();
  const int64_t k_head = keys.stride(0), k_pos = keys.stride(1), v_head = values.stride(0), v_pos = values.stride(1);
  const int64_t* low = lowest.data_ptr<int64_t>();
  const int64_t* ancestors = anc.data_ptr<int64_t>();
  const int64_t min_lowest = *std::min_element(low, low + rows);
  const float scale = static_cast<float>(scaling);

  // each lane's query and sink query, per kv head: lane = row * group + query head in the group
  std::vector<Query> queries(2 * kv * width);
  for (int64_t head = 0; head < kv; ++head)
    for (int64_t lane = 0; lane < width; ++lane) {
      const int64_t at = ((lane / group) * heads + head * group + lane % group) * dim;
      queries[(head * 2) * width + lane] = quantise(q.data_ptr<float>() + at, dim, scale);
      queries[(head * 2 + 1) * width + lane] = quantise(sq.data_ptr<float>() + at, dim, scale);
    }
  std::vector<const Query*> lanes_of(2 * kv * width);
  for (size_t i = 0; i < queries.size(); ++i) lanes_of[i] = &queries[i];
  auto key_row = [&](int64_t head, int64_t row) { return k + head * k_head + row * k_pos; };
  auto value_row = [&](int64_t head, int64_t row) { return v + head * v_head + row * v_pos; };
  // the cache row of held position `pos` if some row sees it, else -1 (row_attention.cpp's Layout::shared)
  auto shared = [&](int64_t pos) -> int64_t {
    if (pos < sinks) return pos;
    if (pos >= committed) return -1;
    const int64_t row = pos - offset;
    return row >= min_lowest && row < stored ? row : -1;
  };

  std::vector<int64_t> blocks;  // the blocks of absolute positions some row sees, in order
  for (int64_t b = 0; b * block < sinks; ++b) blocks.push_back(b);
  for (int64_t b = (min_lowest + offset) / block; b <= (committed + depths - 1) / block; ++b)
    if (blocks.empty() || blocks.back() != b) blocks.push_back(b);
  const int64_t nb = static_cast<int64_t>(blocks.size()), nodes = keys.size(1) - stored;

  std::vector<float> node_scores(kv * nodes * width);  // [kv][node][lane]
  for (int64_t head = 0; head < kv; ++head)
    for (int64_t first = 0; first < nodes; first += kLanes) {
      const uint8_t* tile_rows[kLanes] = {};
      for (int64_t l = 0; l < kLanes && first + l < nodes; ++l) tile_rows[l] = key_row(head, stored + first + l);
      std::vector<float> tile(width * kLanes);
      score_rows(tile_rows, lanes_of.data() + head * 2 * width, width, dim, tile.data(), kLanes);
      for (int64_t l = 0; l < kLanes && first + l < nodes; ++l)
        for (int64_t lane = 0; lane < width; ++lane)
          node_scores[(head * nodes + first + l) * width + lane] = tile[lane * kLanes + l];
    }

  std::vector<float> block_top(kv * nb * width), block_sum(kv * nb * width), block_acc(kv * nb * width * dim);
  parallel::split(0, kv * nb, 1, [&](int64_t begin, int64_t end) {
    Buffers& mine = *thread_buffers();
    float* scores = scratch(mine.scores, width * block);            // [lane][position], then the weights
    float* scaled = scratch(mine.scaled, block);                    // one lane's weights times value scales
    uint8_t* weights = scratch(mine.weights, width * groups * block);
    i16* sums = scratch(mine.sums, width * chunks);
    float* value_scales = scratch(mine.value_scales, groups * block);
    float* steps = scratch(mine.steps, width * groups);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t head = item / nb, first = blocks[item % nb] * block;
      const Query* const* lanes = lanes_of.data() + head * 2 * width;
      for (int64_t j = 0; j < block; j += kLanes) {  // the held positions' scores, 16 at a time
        if (stored > 0) {
          // the next 16 keys and values while these are scored (and these values' scales read): the rows
          // are read in bursts between stretches of arithmetic, each would wait on memory
          const int64_t next = std::clamp<int64_t>(first + j + kLanes - offset, 0, stored - 1);
          const int64_t next_end = std::min(next + kLanes, stored);
          for (const char *p = reinterpret_cast<const char*>(key_row(head, next)),
                          *e = reinterpret_cast<const char*>(key_row(head, next_end)); p < e; p += 64)
            __builtin_prefetch(p, 0, 3);
          for (const char *p = reinterpret_cast<const char*>(value_row(head, next)),
                          *e = reinterpret_cast<const char*>(value_row(head, next_end)); p < e; p += 64)
            __builtin_prefetch(p, 0, 3);
        }
        const uint8_t *held[kLanes] = {}, *held_sinks[kLanes] = {};
        bool any = false, any_sink = false;
        for (int64_t l = 0; l < kLanes; ++l) {
          const int64_t pos = first + j + l, row = shared(pos);
          if (row < 0) continue;
          (pos < sinks ? held_sinks : held)[l] = key_row(head, row);
          (pos < sinks ? any_sink : any) = true;
        }
        if (any) score_rows(held, lanes, width, dim, scores + j, block);
        if (any_sink) {
          float sink_scores[kLanes * 64];
          for (int64_t lane0 = 0; lane0 < width; lane0 += 64) {
            const int64_t count = std::min<int64_t>(64, width - lane0);
            score_rows(held_sinks, lanes + width + lane0, count, dim, sink_scores, kLanes);
            for (int64_t i = 0; i < count; ++i)
              for (int64_t l = 0; l < kLanes; ++l)
                if (held_sinks[l]) scores[(lane0 + i) * block + j + l] = sink_scores[i * kLanes + l];
          }
        }
        for (int64_t lane = 0; lane < width; ++lane)
          for (int64_t l = 0; l < kLanes; ++l)
            if (!held[l] && !held_sinks[l]) scores[lane * block + j + l] = kNegInf;
        for (int64_t l = 0; l < kLanes; ++l) {  // the held positions' value scales, 0 elsewhere
          const uint8_t* row = held[l] ? held[l] : held_sinks[l];
          const uint8_t* value = row ? value_row(head, (row - key_row(head, 0)) / k_pos) : kZeroRow;
          for (int64_t g = 0; g < groups; ++g) value_scales[g * block + j + l] = scale_of(value, dim, g);
        }
      }
      float* top = block_top.data() + item * width;
      for (int64_t lane = 0; lane < width; ++lane) {
        float* s = scores + lane * block;
        const int64_t r = lane / group;
        const int64_t hidden_end = std::min(first + block, low[r] + offset);  // held positions this row does not see
        for (int64_t pos = std::max(first, sinks); pos < hidden_end; ++pos) s[pos - first] = kNegInf;
        for (int64_t t = std::max<int64_t>(0, first - committed); t < depths && committed + t < first + block; ++t) {
          const int64_t node = ancestors[r * depths + t];
          if (node >= 0) s[committed + t - first] = node_scores[(head * nodes + node) * width + lane];
        }
        v16 best = load(s);
        for (int64_t j = kLanes; j < block; j += kLanes) {
          const v16 x = load(s + j);
          best = x > best ? x : best;
        }
        float m = best[0];
        for (int64_t l = 1; l < kLanes; ++l) m = std::max(m, best[l]);
        top[lane] = m;
        if (m == kNegInf)
          std::fill(s, s + block, 0.f);
        else
          row_blocks::exp_block(s, m, s, block);
        v16 total = load(s);  // one tree for every path: the 16-lane sums, then fold
        for (int64_t j = kLanes; j < block; j += kLanes) total = total + load(s + j);
        block_sum[item * width + lane] = simd::fold(total);
        // weights times the value scales, per group, in unsigned 8 bits: 255 at the block's largest
        for (int64_t g = 0; g < groups; ++g) {
          for (int64_t j = 0; j < block; j += kLanes) store(scaled + j, load(s + j) * load(value_scales + g * block + j));
          for (int64_t t = std::max<int64_t>(0, first - committed); t < depths && committed + t < first + block; ++t) {
            const int64_t node = ancestors[r * depths + t];
            if (node >= 0) scaled[committed + t - first] = s[committed + t - first] * scale_of(value_row(head, stored + node), dim, g);
          }
          v16 most = load(scaled);
          for (int64_t j = kLanes; j < block; j += kLanes) {
            const v16 x = load(scaled + j);
            most = x > most ? x : most;
          }
          float largest = most[0];
          for (int64_t l = 1; l < kLanes; ++l) largest = std::max(largest, most[l]);
          const float inverse = largest > 0.f ? 255.f / largest : 0.f;
          uint8_t* u = weights + (lane * groups + g) * block;
          for (int64_t j = 0; j < block; j += kLanes) {
            const v16 level = round_even(load(scaled + j) * splat(inverse));
            narrow_unsigned(__builtin_convertvector(level < 255.f ? level : splat(255.f), i16), u + j);
          }
          steps[lane * groups + g] = largest / 255.f;
        }
      }
      // the held values 4 positions at a time, integer sums for every lane (exact, in any order)
      for (int64_t lane = 0; lane < width * chunks; ++lane) sums[lane] = i16{};
      for (int64_t j = 0; j < block; j += 4) {
        const uint8_t* quad_rows[4];
        bool any = false;
        for (int64_t l = 0; l < 4; ++l) {
          const int64_t pos = first + j + l, row = pos < committed ? shared(pos) : -1;
          quad_rows[l] = row >= 0 ? value_row(head, row) : kZeroRow;
          any |= row >= 0;
        }
        if (!any) continue;
        i16 quad[kMaxDim / kLanes];
        value_quad(quad_rows, dim, quad);
        for (int64_t lane = 0; lane < width; ++lane)
          for (int64_t c = 0; c < chunks; ++c) {
            int32_t four;
            std::memcpy(&four, weights + (lane * groups + c * kLanes / kGroup) * block + j, 4);
            sums[lane * chunks + c] = dot4(sums[lane * chunks + c], splat_i(four), quad[c]);
          }
      }
      for (int64_t lane = 0; lane < width; ++lane) {  // then each row's ancestors, as integers too
        const int64_t r = lane / group;
        for (int64_t t = std::max<int64_t>(0, first - committed); t < depths && committed + t < first + block; ++t) {
          const int64_t node = ancestors[r * depths + t];
          if (node < 0) continue;
          const int8_t* levels = reinterpret_cast<const int8_t*>(value_row(head, stored + node));
          for (int64_t c = 0; c < chunks; ++c) {
            const int32_t w = weights[(lane * groups + c * kLanes / kGroup) * block + committed + t - first];
            sums[lane * chunks + c] += widen_signed(levels + c * kLanes) * w;
          }
        }
        float* acc = block_acc.data() + (item * width + lane) * dim;
        for (int64_t c = 0; c < chunks; ++c)
          store(acc + c * kLanes,
                __builtin_convertvector(sums[lane * chunks + c], v16) * splat(steps[lane * groups + c * kLanes / kGroup]));
      }
    }
  });
  return row_blocks::combine(block_top.data(), block_sum.data(), block_acc.data(), rows, heads, kv, width, nb, dim,
                             q.options());
}
