// What the two attention kernels share (row_attention.cpp: float caches; q8_attention.cpp: 8-bit rows):
// the weights of a block, the 16 x 16 transposition of tiles, and the float64 sum over a row's blocks.
#pragma once

#include <ATen/ATen.h>

#include "simd.h"

#include <algorithm>
#include <cstdint>
#include <limits>

namespace row_blocks {

// exp(x - top) for x <= top (scores minus their block's max), 0 for -inf, 16 lanes at a time (`n` a
// multiple of 16): every weight by the same instructions.
void exp_block(const float* scores, float top, float* out, int64_t n);

// The largest of `n` floats (`n` a multiple of 16): exact in any order.
inline float block_max(const float* x, int64_t n) {
  simd::v16 best = simd::load(x);
  for (int64_t j = simd::kLanes; j < n; j += simd::kLanes) {
    const simd::v16 y = simd::load(x + j);
    best = y > best ? y : best;
  }
  float m = best[0];
  for (int64_t l = 1; l < simd::kLanes; ++l) m = std::max(m, best[l]);
  return m;
}

// A lane's scores in a block turned into its weights in place (`exp_block` of them minus their max; all 0
// where the lane sees none of the block); returns that max.
inline float weights_of(float* scores, int64_t n) {
  const float top = block_max(scores, n);
  if (top == -std::numeric_limits<float>::infinity())
    std::fill(scores, scores + n, 0.f);
  else
    exp_block(scores, top, scores, n);
  return top;
}

// out [rows, heads, dim]: each lane's blocks (kv head, block, lane: their top, weight sum and weighted
// values), in block order and float64, each scaled by exp(its top - the lane's top).
at::Tensor combine(const float* block_top, const float* block_sum, const float* block_acc, int64_t rows,
                   int64_t heads, int64_t kv, int64_t width, int64_t nb, int64_t dim, const at::TensorOptions& options);

// The 16 x 16 block `r` (16 vectors of 16 lanes) transposed in place: step h swaps the off-diagonal
// h x h blocks of every 2h x 2h block; the four steps make (i, c) <- (c, i). Moves bits only.
template <typename V>
inline void transpose16(V* r) {
  for (int i = 0; i < 16; ++i)
    if (!(i & 8)) {
      const V a = r[i], b = r[i + 8];
      r[i] = __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
      r[i + 8] = __builtin_shufflevector(a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    }
  for (int i = 0; i < 16; ++i)
    if (!(i & 4)) {
      const V a = r[i], b = r[i + 4];
      r[i] = __builtin_shufflevector(a, b, 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27);
      r[i + 4] = __builtin_shufflevector(a, b, 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
    }
  for (int i = 0; i < 16; ++i)
    if (!(i & 2)) {
      const V a = r[i], b = r[i + 2];
      r[i] = __builtin_shufflevector(a, b, 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29);
      r[i + 2] = __builtin_shufflevector(a, b, 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31);
    }
  for (int i = 0; i < 16; i += 2) {
    const V a = r[i], b = r[i + 1];
    r[i] = __builtin_shufflevector(a, b, 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30);
    r[i + 1] = __builtin_shufflevector(a, b, 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31);
  }
}

}  // namespace row_blocks
