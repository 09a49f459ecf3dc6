// Products of a GGUF file's own weight blocks (blocks_legacy.h, blocks_k.h) with 8-bit activations, read
// in place: the weights are the file's, bit for bit; the activations are quantised per row and block of the
// format (32 or 256 inputs) to x ~ dx * xq, dx = max |x| / 127, xq = x * (1 / dx) rounded to nearest even.
// Per weight block the format gives exact integers (blocks.h); the float steps, compiled with
// -ffp-contract=off, are one order on every CPU: for blocks b = 0, 1, ... from y = +0,
//   y = y + (d_b * dx_b) * float(main_b), then (formats with minimums) y = y + (d2_b * dx_b) * float(second_b),
// then y + bias. A row's result depends on that row alone (its own quantisation, the same steps whatever
// the batch), so a verified tree gives plain decoding's bits; up to 4 rows share each block's unpacking.
#include <ATen/ATen.h>

#include "blocks_k.h"
#include "blocks_legacy.h"
#include "parallel.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

namespace {

constexpr int64_t kRowTile = 4;  // activation rows sharing one unpacked weight block
// A prefill's rows are taken this many at a time (their 8-bit levels stay in L2, ~0.4 MB at 1,536 inputs),
// each weight row read once per chunk.
constexpr int64_t kRowChunk = 256;
// A plain step reads each thread's weight rows as one stream: fetched this far ahead (non-temporal, as
// quantised_products.cpp's).
constexpr int64_t kFetchAhead = 4096;

// One row of activations at 8 bits: levels, a scale per block, and the levels' sums per 16 inputs.
struct Row8 {
  std::vector<int8_t> q;
  std::vector<float> dx;
  std::vector<int32_t> sums;
};

void quantise(const float* x, int64_t size, int64_t block, Row8& out) {
  out.q.resize(size);
  out.dx.resize(size / block);
  out.sums.resize(size / 16);
  for (int64_t b = 0; b < size / block; ++b) {
    const float* in = x + b * block;
    float amax = 0.f;
    for (int64_t i = 0; i < block; ++i) amax = std::max(amax, std::fabs(in[i]));
    const float dx = amax / 127.f, inverse = dx != 0.f ? 1.f / dx : 0.f;
    for (int64_t i = 0; i < block; ++i) {
      const float level = std::clamp(std::nearbyint(in[i] * inverse), -127.f, 127.f);  // nearest even
      out.q[b * block + i] = static_cast<int8_t>(level);
    }
    out.dx[b] = dx;
  }
  for (int64_t g = 0; g < size / 16; ++g) {
    int32_t sum = 0;
    for (int64_t i = 0; i < 16; ++i) sum += out.q[g * 16 + i];
    out.sums[g] = sum;
  }
}

// y[r] for one weight row and T activation rows.
template <typename F, int T>
void row_tile(const uint8_t* weights, const Row8* const* rows, int64_t blocks, float* y) {
  float acc[T];
  for (int r = 0; r < T; ++r) acc[r] = 0.f;
  const int8_t* x[T];
  const int32_t* sums[T];
  blocks::Sums s[T];
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block = weights + b * F::kBytes;
    for (int64_t line = 0; line < F::kBytes; line += 64) __builtin_prefetch(block + kFetchAhead + line, 0, 0);
    for (int r = 0; r < T; ++r) {
      x[r] = rows[r]->q.data() + b * F::kElements;
      sums[r] = rows[r]->sums.data() + b * (F::kElements / 16);
    }
    F::template sums<T>(block, x, sums, s);
    const float d = F::d(block);
    for (int r = 0; r < T; ++r) acc[r] = acc[r] + (d * rows[r]->dx[b]) * static_cast<float>(s[r].main);
    if constexpr (F::kSecond) {
      const float d2 = F::d2(block);
      for (int r = 0; r < T; ++r) acc[r] = acc[r] + (d2 * rows[r]->dx[b]) * static_cast<float>(s[r].second);
    }
  }
  for (int r = 0; r < T; ++r) y[r] = acc[r];
}

template <typename F>
void output_rows(const uint8_t* weights, int64_t row_bytes, const Row8* rows, int64_t count, int64_t n_out,
                 const float* bias, float* out, int64_t begin, int64_t end) {
  const int64_t blocks = row_bytes / F::kBytes;
  for (int64_t chunk = 0; chunk < count; chunk += kRowChunk) {
    const int64_t last = std::min(count, chunk + kRowChunk);
    for (int64_t o = begin; o < end; ++o) {
      const uint8_t* w = weights + o * row_bytes;
      for (int64_t r0 = chunk; r0 < last; r0 += kRowTile) {
        const Row8* tile[kRowTile];
        const int64_t n = std::min(kRowTile, last - r0);
        for (int64_t r = 0; r < n; ++r) tile[r] = rows + r0 + r;
        float y[kRowTile];
        switch (n) {
          case 1: row_tile<F, 1>(w, tile, blocks, y); break;
          case 2: row_tile<F, 2>(w, tile, blocks, y); break;
          case 3: row_tile<F, 3>(w, tile, blocks, y); break;
          default: row_tile<F, 4>(w, tile, blocks, y); break;
        }
        for (int64_t r = 0; r < n; ++r) out[(r0 + r) * n_out + o] = bias ? y[r] + bias[o] : y[r];
      }
    }
  }
}

// This thread's quantised rows, kept across calls (see quantised_products.cpp).
__attribute__((noinline)) std::vector<Row8>& quantised_rows() {
  static thread_local std::vector<Row8> rows;
  return rows;
}

template <typename F>
at::Tensor products(const at::Tensor& input, const at::Tensor& weights, const std::optional<at::Tensor>& bias) {
  const int64_t rows = input.size(0), size = input.size(1), n_out = weights.size(0), row_bytes = weights.size(1);
  TORCH_CHECK(row_bytes % F::kBytes == 0 && row_bytes / F::kBytes * F::kElements == size,
              "weight blocks of another width: ", row_bytes, " bytes a row for ", size, " inputs");
  const float* b = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == n_out);
    b = bias->data_ptr<float>();
  }
  std::vector<Row8>& quantised = quantised_rows();
  if (static_cast<int64_t>(quantised.size()) < rows) quantised.resize(rows);
  const float* in = input.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) quantise(in + r * size, size, F::kElements, quantised[r]);
  at::Tensor out = at::empty({rows, n_out}, input.options());
  const Row8* x = quantised.data();
  parallel::split(0, n_out, 16, [&](int64_t begin, int64_t end) {
    output_rows<F>(weights.data_ptr<uint8_t>(), row_bytes, x, rows, n_out, b, out.data_ptr<float>(), begin, end);
  });
  return out;
}

}  // namespace

// x [R, K] float32 times the weight rows `weights` [N, bytes per row] uint8 of GGUF block type `type` (ggml's
// numbering: 2 Q4_0, 3 Q4_1, 6 Q5_0, 7 Q5_1, 8 Q8_0, 12 Q4_K, 13 Q5_K, 14 Q6_K) -> [R, N] float32 (+ bias [N]).
at::Tensor block_products(const at::Tensor& x, const at::Tensor& weights, int64_t type,
                          const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "activations must be [rows, inputs] float32");
  TORCH_CHECK(weights.dim() == 2 && weights.scalar_type() == at::kByte && weights.is_contiguous(),
              "weights must be contiguous [outputs, bytes] uint8");
  const at::Tensor input = x.contiguous();
  switch (type) {
    case 2: return products<blocks::Q4_0>(input, weights, bias);
    case 3: return products<blocks::Q4_1>(input, weights, bias);
    case 6: return products<blocks::Q5_0>(input, weights, bias);
    case 7: return products<blocks::Q5_1>(input, weights, bias);
    case 8: return products<blocks::Q8_0>(input, weights, bias);
    case 12: return products<blocks::Q4_K>(input, weights, bias);
    case 13: return products<blocks::Q5_K>(input, weights, bias);
    case 14: return products<blocks::Q6_K>(input, weights, bias);
    default: TORCH_CHECK(false, "GGUF block type ", type, " has no kernel here");
  }
}
