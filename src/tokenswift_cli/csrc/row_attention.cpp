// Attention of new tokens over a KV cache in float32, each row on its own (see row_attention.py).
//
// Every row's arithmetic is a function of that row alone: its query, the keys and values it sees in
// order of absolute position, and blocks of `block` absolute positions. So a token verified in a
// tree gets the bits it gets decoded alone, whatever the other rows, the thread count or where the
// cache keeps a position. The rules that make it so:
// * every score is fold(partial(query, key)) * scale (`key_dots`, or `query_dots` for 16 keys at once,
//   the same roundings), and every weight comes from `exp_block`;
// * within a block, a row adds `w` and `w * v` in position order, in float32; positions it does
//   not see have w = 0, which adds nothing; across blocks the sums are float64, in block order;
// * products are summed by `fma` (one rounding) or as written: compiled with -ffp-contract=off, the
//   compiler fuses nothing on its own, so the same sum is the same roundings wherever it is written.
// The cache may store float16: each key and value is widened to float32 (exactly) before any
// arithmetic, where it is read or, when many rows read it, once into a scratch copy; same bits.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

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
using simd::store;
using simd::v16;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int64_t kMaxChunks = 16;  // head dims up to 256
constexpr int64_t kGroup = 4;  // lanes whose value sums stay in registers together (a0..a3 below)

// The same tree for 16 vectors at once: lane i of the result is fold(a[i]), bit for bit.
inline v16 fold16(const v16* a) {
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
  v16 q[C > 0 ? C : kMaxChunks], parts[kLanes];
  for (int64_t c = 0; c < n; ++c) q[c] = load(query + c * kLanes);
  for (int64_t l = 0; l < kLanes; ++l) parts[l] = partial<C>(keys[l], q, chunks);
  store(out, fold16(parts) * scale);
}

template <typename T>
__attribute__((noinline)) void query_dots(const float* query, const T* const* keys, int64_t dim, float scale,
                                          float* out) {
  const int64_t chunks = dim / kLanes;
  if (chunks == 4) return query_dots_of<4>(query, keys, chunks, scale, out);
  if (chunks == 8) return query_dots_of<8>(query, keys, chunks, scale, out);
  query_dots_of<0>(query, keys, chunks, scale, out);
}

template <typename T>
using Held = std::vector<std::pair<int64_t, const T*>>;  // (index in the block, value row)

// For G lanes (G <= kGroup): out[g] = sum over `held` of w[g][j] * v and total[g] = sum of w[g][j], in
// position order. The weight sums ride along with the products, whose arithmetic hides their latency.
template <int64_t C, int64_t G, typename T>
void value_sums(const Held<T>& held, const float* const* w, int64_t chunks, float* const* out, float* total) {
  float t[G] = {};
  if constexpr (C > 0) {  // the whole row in registers: G x C accumulators
    v16 a[G][C] = {};
    for (const auto& [j, v] : held) {
      v16 x[C];
      for (int64_t c = 0; c < C; ++c) x[c] = load(v + c * kLanes);
      for (int64_t g = 0; g < G; ++g) {
        t[g] = t[g] + w[g][j];
        const v16 b = w[g][j] + v16{};
        for (int64_t c = 0; c < C; ++c) a[g][c] = fma(b, x[c], a[g][c]);
      }
    }
    for (int64_t g = 0; g < G; ++g)
      for (int64_t c = 0; c < C; ++c) store(out[g] + c * kLanes, a[g][c]);
  } else {
    for (int64_t c = 0; c < chunks; ++c) {  // one chunk at a time: the same sums, in the same order
      v16 a[G] = {};
      for (const auto& [j, v] : held) {
        const v16 x = load(v + c * kLanes);
        for (int64_t g = 0; g < G; ++g) {
          if (c == 0) t[g] = t[g] + w[g][j];
          a[g] = fma(w[g][j] + v16{}, x, a[g]);
        }
      }
      for (int64_t g = 0; g < G; ++g) store(out[g] + c * kLanes, a[g]);
    }
  }
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

// exp(x) for x <= 0 (scores minus their max), 0 for -inf: range reduction and a degree-6 polynomial,
// 16 lanes at a time (`n` is a multiple of 16), so every weight takes the same instructions.
__attribute__((noinline)) void exp_block(const float* scores, float top, float* out, int64_t n) {
  typedef int32_t i16 __attribute__((vector_size(kLanes * sizeof(int32_t))));
  const v16 lowest = v16{} - 87.f;
  for (int64_t i = 0; i < n; i += kLanes) {
    const v16 x = load(scores + i) - top;
    const v16 clamped = x < lowest ? lowest : x;
    const v16 t = clamped * 1.44269504f + 0.5f;
    v16 n_ = __builtin_convertvector(__builtin_convertvector(t, i16), v16);  // toward zero, then down:
    n_ = n_ > t ? n_ - 1.f : n_;                                              // floor(t)
    const v16 r = (clamped - n_ * 0.693145752f) - n_ * 1.42860677e-06f;
    v16 p = v16{} + 1.f / 720.f;
    p = p * r + 1.f / 120.f;
    p = p * r + 1.f / 24.f;
    p = p * r + 1.f / 6.f;
    p = p * r + 0.5f;
    p = p * r + 1.f;
    p = p * r + 1.f;
    const i16 bits = (__builtin_convertvector(n_, i16) + 127) << 23;
    v16 scale;
    std::memcpy(&scale, &bits, sizeof(scale));
    store(out + i, x < lowest ? v16{} : p * scale);
  }
}

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

template <typename T>
at::Tensor attend(const at::Tensor& q, const at::Tensor& sq, const at::Tensor& keys, const at::Tensor& values,
                  const at::Tensor& lowest, const at::Tensor& anc, int64_t sinks, int64_t stored, int64_t offset,
                  int64_t committed, double scaling, int64_t block) {
  const Layout<T> at{q.size(0), q.size(1), keys.size(0), q.size(1) / keys.size(0), q.size(2), block, sinks, stored,
                     offset, committed, anc.size(1), q.data_ptr<float>(), sq.data_ptr<float>(), keys.data_ptr<T>(),
                     values.data_ptr<T>(), keys.stride(0), keys.stride(1), values.stride(0), values.stride(1),
                     lowest.data_ptr<int64_t>(), anc.data_ptr<int64_t>()};
  const int64_t rows = at.rows, group = at.group, dim = at.dim, width = rows * group;  // lanes per kv head
  const int64_t min_lowest = *std::min_element(at.lowest, at.lowest + rows);
  std::vector<int64_t> blocks;  // the blocks of absolute positions some row sees, in order
  if (sinks > 0) blocks.push_back(0);
  for (int64_t b = (min_lowest + offset) / block; b <= (committed + at.depths - 1) / block; ++b)
    if (blocks.empty() || blocks.back() != b) blocks.push_back(b);
  const int64_t nb = static_cast<int64_t>(blocks.size()), nodes = keys.size(1) - stored;

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
      key_dots(at.key(head, stored + node), all_queries.data() + head * 2 * width, width, dim,
               static_cast<float>(scaling), node_scores.data() + (head * nodes + node) * width, 1);

  // Per (kv head, block): scores, then after the max over all blocks, weights and sums.
  std::vector<float> scores(at.kv * nb * width * block, kNegInf), block_top(at.kv * nb * width, kNegInf);
  at::parallel_for(0, at.kv * nb, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> widened(kWidens<T> && width > kGroup ? kLanes * dim : 0);  // 16 keys, widened once
    for (int64_t item = begin; item < end; ++item) {
      const int64_t head = item / nb, first = blocks[item % nb] * block;
      float* s = scores.data() + item * width * block;
      const float* const* queries = all_queries.data() + head * 2 * width;
      const T* keys16[kLanes];
      for (int64_t j = 0; j < block; j += kLanes) {
        bool whole = first + j >= sinks;  // 16 held positions past the sinks: 16 scores per query at once
        for (int64_t l = 0; l < kLanes && whole; ++l) {
          const int64_t row = at.shared(first + j + l, min_lowest);
          whole = row >= 0;
          keys16[l] = whole ? at.key(head, row) : nullptr;
        }
        if (whole) {
          if (widened.empty()) {
            for (int64_t lane = 0; lane < width; ++lane)
              query_dots(queries[lane], keys16, dim, static_cast<float>(scaling), s + lane * block + j);
          } else {  // many lanes read each key: widen the 16 keys once (exact), not once per lane
            const float* wide16[kLanes];
            for (int64_t l = 0; l < kLanes; ++l) wide16[l] = widen(keys16[l], widened.data() + l * dim, dim);
            for (int64_t lane = 0; lane < width; ++lane)
              query_dots(queries[lane], wide16, dim, static_cast<float>(scaling), s + lane * block + j);
          }
          continue;
        }
        for (int64_t l = j; l < j + kLanes; ++l) {
          const int64_t pos = first + l, row = at.shared(pos, min_lowest);
          if (row < 0) continue;
          key_dots(at.key(head, row), queries + (pos < sinks ? width : 0), width, dim, static_cast<float>(scaling),
                   s + l, block);
        }
      }
      for (int64_t lane = 0; lane < width; ++lane) {
        const int64_t r = lane / group;
        // held positions below the row's own lowest are not seen (the sinks always are)
        const int64_t hidden_end = std::min(first + block, at.lowest[r] + offset);
        for (int64_t pos = std::max(first, sinks); pos < hidden_end; ++pos) s[lane * block + pos - first] = kNegInf;
        for (int64_t t = std::max<int64_t>(0, first - committed); t < at.depths && committed + t < first + block; ++t) {
          const int64_t node = at.anc[r * at.depths + t];
          if (node >= 0) s[lane * block + committed + t - first] = node_scores[(head * nodes + node) * width + lane];
        }
        v16 top = load(s + lane * block);  // the max is exact in any order
        for (int64_t j = kLanes; j < block; j += kLanes) {
          const v16 x = load(s + lane * block + j);
          top = x > top ? x : top;
        }
        float* best = block_top.data() + item * width + lane;
        for (int64_t l = 0; l < kLanes; ++l) *best = std::max(*best, top[l]);
      }
    }
  });

  std::vector<float> row_top(at.kv * width, kNegInf);  // per kv head and lane, over every block
  for (int64_t head = 0; head < at.kv; ++head)
    for (int64_t b = 0; b < nb; ++b)
      for (int64_t lane = 0; lane < width; ++lane)
        row_top[head * width + lane] = std::max(row_top[head * width + lane], block_top[(head * nb + b) * width + lane]);

  std::vector<float> block_sum(at.kv * nb * width, 0.f), block_acc(at.kv * nb * width * dim, 0.f);
  at::parallel_for(0, at.kv * nb, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> weights(width * block), widened_values;
    Held<T> held;
    Held<float> wide_held;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t head = item / nb, first = blocks[item % nb] * block;
      const float* s = scores.data() + item * width * block;
      for (int64_t lane = 0; lane < width; ++lane)
        exp_block(s + lane * block, row_top[head * width + lane], weights.data() + lane * block, block);
      float* sum = block_sum.data() + item * width;
      float* acc = block_acc.data() + item * width * dim;
      const int64_t chunks = dim / kLanes;
      held.clear();  // the positions of the block some row sees, in order
      for (int64_t j = 0; j < block; ++j)
        if (const int64_t row = at.shared(first + j, min_lowest); row >= 0) held.push_back({j, at.value(head, row)});
      auto value_lanes = [&](const auto& values) {
        for (int64_t lane0 = 0; lane0 < width; lane0 += kGroup) {  // kGroup lanes at a time, in registers
          const int64_t lanes = std::min(kGroup, width - lane0);
          const float* w[kGroup];
          float* out[kGroup];
          for (int64_t g = 0; g < lanes; ++g) {
            w[g] = weights.data() + (lane0 + g) * block;
            out[g] = acc + (lane0 + g) * dim;
          }
          if (chunks == 4)
            value_sums_of<4>(lanes, values, w, chunks, out, sum + lane0);
          else
            value_sums_of<0>(lanes, values, w, chunks, out, sum + lane0);
        }
      };
      if (kWidens<T> && width > kGroup) {  // several passes over the block's values: widen them once (exact)
        widened_values.resize(held.size() * dim);
        wide_held.clear();
        for (size_t i = 0; i < held.size(); ++i)
          wide_held.push_back({held[i].first, widen(held[i].second, widened_values.data() + i * dim, dim)});
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
          for (int64_t c = 0; c < chunks; ++c) store(out + c * kLanes, fma(w + v16{}, load(v + c * kLanes), load(out + c * kLanes)));
        }
      }
    }
  });

  at::Tensor result = at::empty({rows, at.heads, dim}, q.options());
  float* out = result.data_ptr<float>();
  at::parallel_for(0, at.kv * width, 1, [&](int64_t begin, int64_t end) {
    std::vector<double> total(dim);
    for (int64_t index = begin; index < end; ++index) {
      const int64_t head = index / width, lane = index % width;
      double weight = 0.0;
      std::fill(total.begin(), total.end(), 0.0);
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t item = head * nb + b;
        weight += block_sum[item * width + lane];
        const float* a = block_acc.data() + (item * width + lane) * dim;
        for (int64_t d = 0; d < dim; ++d) total[d] += a[d];
      }
      float* o = out + ((lane / group) * at.heads + head * group + lane % group) * dim;
      for (int64_t d = 0; d < dim; ++d) o[d] = static_cast<float>(total[d] / weight);
    }
  });
  return result;
}

}  // namespace

// q, sq: [R, H, D] float32; keys, values: [KV, N, D] (D contiguous), float32 or float16 (computed in
// float32); lowest: [R] first held cache row each row sees; anc: [R, T] node at each depth of each
// row's path (-1 past its own depth).
at::Tensor row_attention(const at::Tensor& q, const at::Tensor& sq, const at::Tensor& keys, const at::Tensor& values,
                         const at::Tensor& lowest, const at::Tensor& anc, int64_t sinks, int64_t stored,
                         int64_t offset, int64_t committed, double scaling, int64_t block) {
  TORCH_CHECK(q.dtype() == at::kFloat && sq.dtype() == at::kFloat && keys.dtype() == values.dtype() &&
              (keys.dtype() == at::kFloat || keys.dtype() == at::kHalf));
  TORCH_CHECK(q.is_contiguous() && sq.is_contiguous() && keys.stride(2) == 1 && values.stride(2) == 1);
  TORCH_CHECK(lowest.is_contiguous() && anc.is_contiguous() && lowest.dtype() == at::kLong &&
              anc.dtype() == at::kLong);
  TORCH_CHECK(q.size(2) % kLanes == 0 && q.size(2) <= kLanes * kMaxChunks && block % kLanes == 0 && q.size(1) % keys.size(0) == 0);
  if (keys.dtype() == at::kHalf)
    return attend<c10::Half>(q, sq, keys, values, lowest, anc, sinks, stored, offset, committed, scaling, block);
  return attend<float>(q, sq, keys, values, lowest, anc, sinks, stored, offset, committed, scaling, block);
}
