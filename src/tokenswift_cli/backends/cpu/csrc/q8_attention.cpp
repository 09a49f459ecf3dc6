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
//
// Where the cache keeps its rows also by tiles of 16 positions (a full cache: `Tiles` below), a tile of
// held positions is read from there: the keys already transposed for the products, the values already
// 4 positions a word, the scales apart, consecutive tiles one stretch of memory. A call lays out the
// tiles its committed positions completed since the last; the rest (the sinks, the edges of what is
// held, the newest positions, the tree's nodes) is read from the rows, to the same bits.
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
#include <optional>
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
constexpr int64_t kRowsAhead = 64;      // rows fetched ahead of their scores (where no tiles are)
constexpr int32_t kRest = 254;          // the query's second part counts in 1/254 of a level
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

// The scores of `N` queries for the 16 rows of `tile` (into out[i * stride + l]): per group, the integer
// parts (N x 2 independent sums, so that no product waits on the one before), then their floats.
template <int64_t N>
inline void tile_scores(const i16* tile, const Query* const* q, const v16* key_scales, int64_t dim, float* out,
                        int64_t stride) {
  v16 s[N];
  for (int64_t n = 0; n < N; ++n) s[n] = v16{};
  for (int64_t g = 0; g < dim / kGroup; ++g) {
    i16 levels[N], rest[N];
    for (int64_t n = 0; n < N; ++n) levels[n] = rest[n] = i16{};
    for (int64_t r = g * kGroup / 4; r < (g + 1) * kGroup / 4; ++r)
      for (int64_t n = 0; n < N; ++n) {
        levels[n] = dot4(levels[n], tile[r], splat_i(q[n]->levels[r]));
        rest[n] = dot4(rest[n], tile[r], splat_i(q[n]->rest[r]));
      }
    for (int64_t n = 0; n < N; ++n) {
      const i16 whole = (levels[n] - q[n]->level_bias[g]) * kRest + (rest[n] - q[n]->rest_bias[g]);
      s[n] = fma(__builtin_convertvector(whole, v16) * key_scales[g], splat(q[n]->factor[g]), s[n]);
    }
  }
  for (int64_t n = 0; n < N; ++n) store(out + n * stride, s[n]);
}

// Group g's scale of 16 rows `stride` bytes apart.
inline v16 gather_scales(const uint8_t* row0, int64_t stride, int64_t dim, int64_t g) {
#if defined(__AVX512F__)
  const __m512i at = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                        _mm512_set1_epi32(static_cast<int32_t>(stride)));
  return reinterpret_cast<v16>(_mm512_i32gather_ps(at, row0 + dim + g * 4, 1));
#else
  v16 x;
  for (int64_t l = 0; l < kLanes; ++l) x[l] = scale_of(row0 + l * stride, dim, g);
  return x;
#endif
}

// The scores of `count` queries for 16 rows (into out[i * stride + l]), from their transposed tile.
void tile_scores(const i16* tile, const v16* key_scales, const Query* const* queries, int64_t count, int64_t dim,
                 float* out, int64_t stride) {
  int64_t i = 0;
  for (; i + 4 <= count; i += 4) tile_scores<4>(tile, queries + i, key_scales, dim, out + i * stride, stride);
  if (count - i == 3) tile_scores<3>(tile, queries + i, key_scales, dim, out + i * stride, stride);
  if (count - i == 2) tile_scores<2>(tile, queries + i, key_scales, dim, out + i * stride, stride);
  if (count - i == 1) tile_scores<1>(tile, queries + i, key_scales, dim, out + i * stride, stride);
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
  tile_scores(tile, key_scales, queries, count, dim, out, stride);
}

// The same for 16 consecutive rows `row_stride` bytes apart.
void score_run(const uint8_t* row0, int64_t row_stride, const Query* const* queries, int64_t count, int64_t dim,
               float* out, int64_t stride) {
  const uint8_t* rows[kLanes];
  v16 key_scales[kMaxDim / kGroup];
  for (int64_t l = 0; l < kLanes; ++l) rows[l] = row0 + l * row_stride;
  for (int64_t g = 0; g < dim / kGroup; ++g) key_scales[g] = gather_scales(row0, row_stride, dim, g);
  i16 tile[kMaxDim / 4];
  key_tile(rows, dim, tile);
  tile_scores(tile, key_scales, queries, count, dim, out, stride);
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

// Positions [begin, end) of a block that are cache rows `pos - shift`: the sinks, or the held recent rows.
struct Span {
  int64_t begin, end, shift;
  bool holds(int64_t pos) const { return pos >= begin && pos < end; }
};

// Integer value sums of `Lanes` lanes over quads [from, to) of a block (`Chunks` 16-dim pieces a row),
// in registers: `weights[l]` is lane l's [group][position] weights.
template <int64_t Chunks, int64_t Lanes>
void sum_quads(const i16* quads, int64_t from, int64_t to, const uint8_t* const* weights, int64_t block,
               i16* sums) {
  i16 o[Lanes][Chunks];
  for (auto& lane : o)
    for (auto& x : lane) x = i16{};
  for (int64_t j = from; j < to; ++j)
    for (int64_t c = 0; c < Chunks; ++c) {
      const i16 v = quads[j * Chunks + c];
      for (int64_t l = 0; l < Lanes; ++l) {
        int32_t four;
        std::memcpy(&four, weights[l] + (c * kLanes / kGroup) * block + 4 * j, 4);
        o[l][c] = dot4(o[l][c], splat_i(four), v);
      }
    }
  for (int64_t l = 0; l < Lanes; ++l)
    for (int64_t c = 0; c < Chunks; ++c) sums[l * Chunks + c] = o[l][c];
}

// The same sums for any head size, one lane at a time.
void sum_quads(const i16* quads, int64_t from, int64_t to, const uint8_t* weights, int64_t block, int64_t chunks,
               i16* sums) {
  for (int64_t c = 0; c < chunks; ++c) sums[c] = i16{};
  for (int64_t j = from; j < to; ++j)
    for (int64_t c = 0; c < chunks; ++c) {
      int32_t four;
      std::memcpy(&four, weights + (c * kLanes / kGroup) * block + 4 * j, 4);
      sums[c] = dot4(sums[c], splat_i(four), quads[j * chunks + c]);
    }
}

// The 8-bit rows laid out again by tiles of 16 positions (kv_rows.py's tiles, kept by the cache across
// steps), in four arrays [kv head][slot]: the keys transposed as key_tile makes them, the keys' scales per
// group (16 floats), the values by 4 positions as value_quad makes them, the values' scales. The same bits
// as the rows, arranged for the products: read from here, a tile needs no transposing, no gathering, and
// consecutive tiles' keys (and values) are one stretch of memory.
struct Tiles {
  uint8_t* base = nullptr;
  int64_t kv = 0, slots = 0, dim = 0;
  int64_t lo = 0, hi = 0;  // tiles [lo, hi) are laid out; tile t holds positions 16t..16t+15, in slot t % slots

  bool has(int64_t t) const { return base && t >= lo && t < hi; }
  int64_t at(int64_t head, int64_t t) const { return head * slots + t % slots; }
  int64_t words() const { return 16 * dim; }  // bytes of a tile's keys (or values)
  int64_t scales() const { return 64 * (dim / kGroup); }
  i16* key_words(int64_t head, int64_t t) const { return reinterpret_cast<i16*>(base + at(head, t) * words()); }
  float* key_scales(int64_t head, int64_t t) const {
    return reinterpret_cast<float*>(base + kv * slots * words() + at(head, t) * scales());
  }
  i16* quads(int64_t head, int64_t t) const {
    return reinterpret_cast<i16*>(base + kv * slots * (words() + scales()) + at(head, t) * words());
  }
  float* value_scales(int64_t head, int64_t t) const {
    return reinterpret_cast<float*>(base + kv * slots * (2 * words() + scales()) + at(head, t) * scales());
  }
};

// Tile `t` of one kv head from its 16 key rows and 16 value rows.
void lay_out(const Tiles& tiles, int64_t head, int64_t t, const uint8_t* const* key_rows,
             const uint8_t* const* value_rows) {
  const int64_t dim = tiles.dim, groups = dim / kGroup, chunks = dim / kLanes;
  key_tile(key_rows, dim, tiles.key_words(head, t));
  float *key_scales = tiles.key_scales(head, t), *value_scales = tiles.value_scales(head, t);
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t l = 0; l < kLanes; ++l) {
      key_scales[g * kLanes + l] = scale_of(key_rows[l], dim, g);
      value_scales[g * kLanes + l] = scale_of(value_rows[l], dim, g);
    }
  for (int64_t j = 0; j < kLanes / 4; ++j) value_quad(value_rows + 4 * j, dim, tiles.quads(head, t) + j * chunks);
}

template <typename T>
T* scratch(std::vector<T>& buffer, size_t size) {
  if (buffer.size() < size) buffer.resize(size);
  return buffer.data();
}

struct Buffers {  // one thread's scratch, kept across calls
  std::vector<float> scores, scaled, value_scales, steps;  // value_scales: [group][position], held ones
  std::vector<uint8_t> weights;  // [lane][group][position]: unsigned 8-bit weights
  std::vector<i16> quads;        // [position / 4][dim / 16]: the block's values, 4 positions a word
  std::vector<i16> sums;         // [lane][dim / 16]: integer value sums
};

__attribute__((noinline)) Buffers* thread_buffers() {
  static thread_local Buffers buffers;
  return &buffers;
}

}  // namespace

at::Tensor q8_row_attention(const at::Tensor& q, const at::Tensor& sq, const at::Tensor& keys,
                            const at::Tensor& values, const at::Tensor& lowest, const at::Tensor& anc, int64_t sinks,
                            int64_t stored, int64_t offset, int64_t committed, double scaling, int64_t block,
                            const std::optional<at::Tensor>& mirror, const std::optional<at::Tensor>& mirror_state) {
  const int64_t rows = q.size(0), heads = q.size(1), dim = q.size(2), kv = keys.size(0), group = heads / kv;
  const int64_t width = rows * group, depths = anc.size(1), groups = dim / kGroup, chunks = dim / kLanes;
  TORCH_CHECK(dim % kGroup == 0 && dim <= kMaxDim, "8-bit rows: the head size in groups of 32, up to 256");
  TORCH_CHECK(block % kLanes == 0, "8-bit rows: blocks of a multiple of 16 positions");
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

  // the tiles: the held positions' complete tiles laid out once (the new ones since the last call)
  Tiles tiles;
  if (mirror && mirror->numel() > 0) {
    TORCH_CHECK(mirror_state && mirror_state->dtype() == at::kLong && mirror_state->numel() == 2 &&
                    mirror_state->is_contiguous() && mirror->dtype() == at::kByte && mirror->is_contiguous() &&
                    mirror->dim() == 3 && mirror->size(0) == kv && mirror->size(2) == 36 * dim &&
                    reinterpret_cast<uintptr_t>(mirror->data_ptr()) % 64 == 0,
                "8-bit tiles: [kv, slots, 36 * dim] bytes, 64-byte aligned, and their state [2] (int64)");
    tiles = Tiles{mirror->data_ptr<uint8_t>(), kv, mirror->size(1), dim};
    int64_t* state = mirror_state->data_ptr<int64_t>();
    const int64_t first_held = (sinks + offset + kLanes - 1) / kLanes, complete = committed / kLanes;
    int64_t lo = state[0], hi = state[1];
    if (hi < first_held || hi > complete || lo > hi) lo = hi = first_held;  // none still laid out (or a new text)
    const int64_t from = std::max({hi, first_held, complete - tiles.slots});
    if (complete > from)
      parallel::split(0, kv * (complete - from), 1, [&](int64_t begin, int64_t end) {
        for (int64_t item = begin; item < end; ++item) {
          const int64_t head = item % kv, t = from + item / kv;
          const uint8_t *key_rows[kLanes], *value_rows[kLanes];
          for (int64_t l = 0; l < kLanes; ++l) {
            key_rows[l] = key_row(head, t * kLanes + l - offset);
            value_rows[l] = value_row(head, t * kLanes + l - offset);
          }
          lay_out(tiles, head, t, key_rows, value_rows);
        }
      });
    hi = std::max(hi, complete);
    lo = std::max({lo, first_held, hi - tiles.slots});
    state[0] = tiles.lo = lo;
    state[1] = tiles.hi = hi;
  }

  std::vector<float> block_top(kv * nb * width), block_sum(kv * nb * width), block_acc(kv * nb * width * dim);
  parallel::split(0, kv * nb, 1, [&](int64_t begin, int64_t end) {
    Buffers& mine = *thread_buffers();
    float* scores = scratch(mine.scores, width * block);            // [lane][position], then the weights
    float* scaled = scratch(mine.scaled, block);                    // one lane's weights times value scales
    uint8_t* weights = scratch(mine.weights, width * groups * block);
    i16* quads = scratch(mine.quads, block / 4 * chunks);
    i16* sums = scratch(mine.sums, width * chunks);
    float* value_scales = scratch(mine.value_scales, groups * block);
    float* steps = scratch(mine.steps, width * groups);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t head = item / nb, first = blocks[item % nb] * block;
      const Query* const* lanes = lanes_of.data() + head * 2 * width;
      // the rows some row sees: the sinks, then the held ones (position - offset), each one stretch
      const Span sink{first, std::min(first + block, sinks), 0};
      const Span held{std::max({first, sinks, min_lowest + offset}), std::min({first + block, committed, stored + offset}),
                      offset};
      const bool any_sink = sink.end > sink.begin, any_held = held.end > held.begin;
      auto row_of = [&](int64_t pos) -> int64_t {
        return sink.holds(pos) ? pos : held.holds(pos) ? pos - offset : -1;
      };
      // whether the 16 positions from `p` (a tile's first) are all held and laid out in `tiles`
      auto laid_out = [&](int64_t p) { return tiles.has(p / kLanes) && p >= held.begin && p + kLanes <= held.end; };
      std::fill(value_scales, value_scales + groups * block, 0.f);
      for (int64_t j = 0; j < block; j += kLanes) {  // the held positions' scores, 16 at a time
        const int64_t p = first + j;
        const bool in_sinks = p < sink.end, in_held = p + kLanes > held.begin && p < held.end;
        if (in_held && any_held) {
          // the keys and values some tiles ahead (rows go on past the block): read while these score
          const int64_t ahead = p + kRowsAhead - offset, ahead_end = std::min(ahead + kLanes, stored);
          if (kRowsAhead >= 0 && ahead < ahead_end && !tiles.has((p + kRowsAhead) / kLanes)) {
            for (const uint8_t *a = key_row(head, ahead), *e = key_row(head, ahead_end); a < e; a += 64)
              __builtin_prefetch(a, 0, 3);
            for (const uint8_t *a = value_row(head, ahead), *e = value_row(head, ahead_end); a < e; a += 64)
              __builtin_prefetch(a, 0, 3);
          }
          if (laid_out(p)) {
            const int64_t t = p / kLanes;
            v16 key_scales[kMaxDim / kGroup];
            for (int64_t g = 0; g < groups; ++g) {
              key_scales[g] = load(tiles.key_scales(head, t) + g * kLanes);
              store(value_scales + g * block + j, load(tiles.value_scales(head, t) + g * kLanes));
            }
            tile_scores(tiles.key_words(head, t), key_scales, lanes, width, dim, scores + j, block);
          } else if (p >= held.begin && p + kLanes <= held.end) {
            score_run(key_row(head, p - offset), k_pos, lanes, width, dim, scores + j, block);
            for (int64_t g = 0; g < groups; ++g)
              store(value_scales + g * block + j, gather_scales(value_row(head, p - offset), v_pos, dim, g));
          } else {
            const uint8_t* tile_rows[kLanes];
            for (int64_t l = 0; l < kLanes; ++l) tile_rows[l] = held.holds(p + l) ? key_row(head, p + l - offset) : nullptr;
            score_rows(tile_rows, lanes, width, dim, scores + j, block);
          }
        }
        if (in_sinks) {
          const uint8_t* tile_rows[kLanes];
          for (int64_t l = 0; l < kLanes; ++l) tile_rows[l] = sink.holds(p + l) ? key_row(head, p + l) : nullptr;
          float sink_scores[kLanes * 64];
          for (int64_t lane0 = 0; lane0 < width; lane0 += 64) {
            const int64_t count = std::min<int64_t>(64, width - lane0);
            score_rows(tile_rows, lanes + width + lane0, count, dim, sink_scores, kLanes);
            for (int64_t i = 0; i < count; ++i)
              for (int64_t l = 0; l < kLanes; ++l)
                if (tile_rows[l]) scores[(lane0 + i) * block + j + l] = sink_scores[i * kLanes + l];
          }
        }
        if (!(p >= held.begin && p + kLanes <= held.end))  // not all held: the others are not seen
          for (int64_t l = 0; l < kLanes; ++l)
            if (row_of(p + l) < 0)
              for (int64_t lane = 0; lane < width; ++lane) scores[lane * block + j + l] = kNegInf;
      }
      // the held values, 4 positions a word, laid out once for every lane (other positions: zero rows)
      const int64_t quad_from = any_sink || any_held ? ((any_sink ? sink.begin : held.begin) - first) / 4 : 0;
      const int64_t quad_to = any_sink || any_held ? ((any_held ? held.end : sink.end) - first + 3) / 4 : 0;
      // read in place where every quad is in laid-out tiles, one stretch of slots
      bool direct = quad_from < quad_to && (first + 4 * quad_from) % kLanes == 0 && (first + 4 * quad_to) % kLanes == 0;
      for (int64_t p = first + 4 * quad_from; direct && p < first + 4 * quad_to; p += kLanes) direct = laid_out(p);
      const int64_t first_tile = (first + 4 * quad_from) / kLanes, last_tile = (first + 4 * quad_to) / kLanes - 1;
      direct = direct && first_tile % tiles.slots <= last_tile % tiles.slots;
      for (int64_t j = quad_from; j < quad_to; ++j) {
        const int64_t p = first + 4 * j, tile = p - (p - first) % kLanes;
        if (laid_out(tile)) {
          if (!direct)
            std::memcpy(quads + j * chunks, tiles.quads(head, tile / kLanes) + (p - tile) / 4 * chunks,
                        chunks * sizeof(i16));
          continue;
        }
        if (tile >= held.begin && tile + kLanes <= held.end) {  // a whole tile's rows, their scales read
          const uint8_t* quad_rows[4];
          for (int64_t l = 0; l < 4; ++l) quad_rows[l] = value_row(head, p + l - offset);
          value_quad(quad_rows, dim, quads + j * chunks);
          continue;
        }
        const uint8_t* quad_rows[4];  // else the rows one by one, and their scales (0 where none)
        for (int64_t l = 0; l < 4; ++l) {
          const int64_t pos = first + 4 * j + l, row = row_of(pos);
          quad_rows[l] = row >= 0 ? value_row(head, row) : kZeroRow;
        }
        for (int64_t l = 0; l < 4; ++l)
          if (quad_rows[l] != kZeroRow)
            for (int64_t g = 0; g < groups; ++g) value_scales[g * block + 4 * j + l] = scale_of(quad_rows[l], dim, g);
        value_quad(quad_rows, dim, quads + j * chunks);
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
        top[lane] = row_blocks::weights_of(s, block);
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
          const float largest = row_blocks::block_max(scaled, block);
          const float inverse = largest > 0.f ? 255.f / largest : 0.f;
          uint8_t* u = weights + (lane * groups + g) * block;
          for (int64_t j = 0; j < block; j += kLanes) {
            const v16 level = round_even(load(scaled + j) * splat(inverse));
            narrow_unsigned(__builtin_convertvector(level < 255.f ? level : splat(255.f), i16), u + j);
          }
          steps[lane * groups + g] = largest / 255.f;
        }
      }
      // the held values' integer sums for every lane (exact, in any order), lanes in registers together
      if (chunks == 4 || chunks == 8) {
        constexpr int64_t kSums = 16;  // registers of sums a pass keeps
        for (int64_t lane0 = 0; lane0 < width; lane0 += kSums / chunks) {
          const uint8_t* lane_weights[kSums / 4];
          i16 pass[kSums];
          for (int64_t l = 0; l < kSums / chunks; ++l)  // past the last lane: it again, its sums dropped
            lane_weights[l] = weights + std::min(lane0 + l, width - 1) * groups * block;
          // in place: quad j of the block is quad j - quad_from of the stretch
          const i16* source = direct ? tiles.quads(head, first_tile) - quad_from * chunks : quads;
          if (chunks == 4)
            sum_quads<4, 4>(source, quad_from, quad_to, lane_weights, block, pass);
          else
            sum_quads<8, 2>(source, quad_from, quad_to, lane_weights, block, pass);
          for (int64_t l = 0; l < kSums / chunks && lane0 + l < width; ++l)
            std::copy(pass + l * chunks, pass + (l + 1) * chunks, sums + (lane0 + l) * chunks);
        }
      } else {
        for (int64_t lane = 0; lane < width; ++lane)
          sum_quads(direct ? tiles.quads(head, first_tile) - quad_from * chunks : quads, quad_from, quad_to,
                    weights + lane * groups * block, block, chunks, sums + lane * chunks);
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
