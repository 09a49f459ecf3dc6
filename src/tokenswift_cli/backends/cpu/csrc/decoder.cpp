// The decoder layers of a llama-family model with 4-bit weights, float32 activations, on a CPU, in one
// call per forward (native_decoder.py). Each step is the operation the Python lean forward runs
// (target.py: the model's RMSNorm, its 4-bit products, SiLU), on the same kernels in the same order
// (ATen's, and quantised_products.cpp's for the products), or, for the elementwise steps (the rotary
// embedding, the cache writes), the same roundings written out (compiled with -ffp-contract=off: every
// product and sum rounded on its own, as ATen's elementwise kernels do). So it gives the modules' bits
// and sheds only their per-operation Python cost, which was a third of a plain step.
#include <pybind11/stl.h>
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <type_traits>
#include <vector>

at::Tensor row_attention(const at::Tensor& q, const at::Tensor& sq, const at::Tensor& keys, const at::Tensor& values,
                         const at::Tensor& lowest, const at::Tensor& anc, int64_t sinks, int64_t stored,
                         int64_t offset, int64_t committed, double scaling, int64_t block);
at::Tensor q8_row_attention(const at::Tensor& q, const at::Tensor& sq, const at::Tensor& keys,
                            const at::Tensor& values, const at::Tensor& lowest, const at::Tensor& anc, int64_t sinks,
                            int64_t stored, int64_t offset, int64_t committed, double scaling, int64_t block,
                            const std::optional<at::Tensor>& mirror, const std::optional<at::Tensor>& mirror_state);

at::Tensor q4_products(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales, const at::Tensor& lows,
                       const std::optional<at::Tensor>& bias, int64_t n_out);

at::Tensor block_products(const at::Tensor& x, const at::Tensor& weights, int64_t type,
                          const std::optional<at::Tensor>& bias);

// One linear layer, float32 inputs and outputs, an optional bias: 4-bit (int4.py's Int4Linear) or a GGUF
// tensor's own blocks (blocks.py's BlockLinear, `block_type` ggml's number of its format).
struct Projection {
  at::Tensor packed, scales, lows;  // 4-bit: levels, scales, offsets; blocks: the rows' bytes in `packed`
  std::optional<at::Tensor> bias;
  int64_t outputs, block_type = -1;
  Projection(at::Tensor packed, at::Tensor scales, at::Tensor lows, std::optional<at::Tensor> bias, int64_t outputs)
      : packed(std::move(packed)), scales(std::move(scales)), lows(std::move(lows)), bias(std::move(bias)),
        outputs(outputs) {}
  static Projection blocks(at::Tensor rows, int64_t type, std::optional<at::Tensor> bias) {
    Projection p(rows, at::Tensor(), at::Tensor(), std::move(bias), rows.size(0));
    p.block_type = type;
    return p;
  }

  at::Tensor operator()(const at::Tensor& x) const {
    if (block_type >= 0) return block_products(x, packed, block_type, bias);
    return q4_products(x, packed, scales, lows, bias, outputs);
  }
};

// Layers that read the same input: one fused product, or the parts side by side (q/k/v, gate/up).
struct Parts {
  std::vector<Projection> parts;
  at::Tensor operator()(const at::Tensor& x) const {
    if (parts.size() == 1) return parts[0](x);
    std::vector<at::Tensor> outs;
    for (const Projection& part : parts) outs.push_back(part(x));
    return at::cat(outs, 1);
  }
};

struct Layer {
  at::Tensor input_norm, post_norm;  // RMSNorm weights
  double input_eps, post_eps;
  Parts qkv;
  Projection o;
  Parts gate_up;
  Projection down;
  Layer(at::Tensor input_norm, double input_eps, std::vector<Projection> qkv, Projection o, at::Tensor post_norm,
        double post_eps, std::vector<Projection> gate_up, Projection down)
      : input_norm(std::move(input_norm)), post_norm(std::move(post_norm)), input_eps(input_eps), post_eps(post_eps),
        qkv{std::move(qkv)}, o(std::move(o)), gate_up{std::move(gate_up)}, down(std::move(down)) {}
};

namespace {

// LlamaRMSNorm / Qwen2RMSNorm.forward in float32, `weight * (x * rsqrt(x.pow(2).mean(-1) + eps))`, into
// `out`. Only the mean sums in an order of its own: ATen's (at::mean_out); every other step rounds once
// per element, written out (x * x is pow(x, 2); 1 / sqrt is rsqrt, both exact IEEE operations). The ~20
// small ATen operations a layer this replaces cost ~0.4 ms of a plain step in dispatch and allocation.
void rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, at::Tensor& squares, at::Tensor& variance,
              at::Tensor& out) {
  const int64_t rows = x.size(0), width = x.size(1);
  const float *in = x.data_ptr<float>(), *w = weight.data_ptr<float>();
  float *sq = squares.data_ptr<float>(), *o = out.data_ptr<float>();
  for (int64_t i = 0; i < rows * width; ++i) sq[i] = in[i] * in[i];
  at::mean_out(variance, squares, {-1}, true);
  const float* var = variance.data_ptr<float>();
  const float epsilon = static_cast<float>(eps);  // a Python float added to a float32 tensor: rounded to float32
  for (int64_t r = 0; r < rows; ++r) {
    const float scale = 1.f / std::sqrt(var[r] + epsilon);
    for (int64_t i = 0; i < width; ++i) o[r * width + i] = w[i] * (in[r * width + i] * scale);
  }
}

// x += y, element by element (both [rows, width], contiguous).
void add_into(at::Tensor& x, const at::Tensor& y) {
  float* a = x.data_ptr<float>();
  const float* b = y.data_ptr<float>();
  for (int64_t i = 0; i < x.numel(); ++i) a[i] = a[i] + b[i];
}

// q * cos + rotate_half(q) * sin for one head (transformers' apply_rotary_pos_emb), each product and
// the sum rounded once.
inline void rotate(const float* x, const float* cos, const float* sin, float* out, int64_t dim) {
  const int64_t half = dim / 2;
  for (int64_t i = 0; i < half; ++i) out[i] = x[i] * cos[i] + (-x[i + half]) * sin[i];
  for (int64_t i = half; i < dim; ++i) out[i] = x[i] * cos[i] + x[i - half] * sin[i];
}

// A key or value row into the cache: float32 as computed, or float16 rounded to nearest even, as
// torch's `copy_` rounds (the Python forward's cache writes), or 8-bit (below).
template <typename T>
inline void put(const float* x, T* out, int64_t dim) {
  for (int64_t i = 0; i < dim; ++i) out[i] = static_cast<T>(x[i]);
}

// An 8-bit row (kv_rows.pack): per 32 values the scale s = max |x| / 127 and the levels round(x / s) (to
// nearest even, as torch.round), clamped to +-127; the row's levels, then its float32 scales.
struct Q8Row {
  uint8_t byte;
};
inline void put(const float* x, Q8Row* out, int64_t dim) {
  constexpr int64_t group = 32;
  int8_t* levels = reinterpret_cast<int8_t*>(out);
  for (int64_t g = 0; g < dim / group; ++g) {
    float top = 0.f;
    for (int64_t i = g * group; i < (g + 1) * group; ++i) top = std::max(top, std::fabs(x[i]));
    const float scale = top / 127.f, divisor = scale > 0.f ? scale : 1.f;
    for (int64_t i = g * group; i < (g + 1) * group; ++i)
      levels[i] = static_cast<int8_t>(std::clamp(std::nearbyint(x[i] / divisor), -127.f, 127.f));
    std::memcpy(levels + dim + g * static_cast<int64_t>(sizeof(float)), &scale, sizeof(float));
  }
}

template <typename T>
T* rows_of(const at::Tensor& cache) {
  if constexpr (std::is_same_v<T, Q8Row>)
    return reinterpret_cast<Q8Row*>(cache.data_ptr<uint8_t>());
  else
    return cache.data_ptr<T>();
}

template <typename T>
void write_kv(const float* row, const float* cos, const float* sin, const at::Tensor& k_cache, const at::Tensor& v_cache,
              int64_t position, int64_t kv_heads, int64_t dim, int64_t q_width) {
  float rotated[256];
  T *ko = rows_of<T>(k_cache), *vo = rows_of<T>(v_cache);
  for (int64_t h = 0; h < kv_heads; ++h) {
    rotate(row + q_width + h * dim, cos, sin, rotated, dim);
    put(rotated, ko + h * k_cache.stride(0) + position * k_cache.stride(1), dim);
    put(row + q_width + kv_heads * dim + h * dim, vo + h * v_cache.stride(0) + position * v_cache.stride(1), dim);
  }
}

}  // namespace

struct Decoder {
  std::vector<Layer> layers;
  int64_t heads, kv_heads, dim, intermediate;
  double scaling;
  Decoder(std::vector<Layer> layers, int64_t heads, int64_t kv_heads, int64_t dim, int64_t intermediate,
          double scaling)
      : layers(std::move(layers)), heads(heads), kv_heads(kv_heads), dim(dim), intermediate(intermediate),
        scaling(scaling) {}

  // x [q, hidden] -> x after every layer. cos/sin [q, dim] at the tokens' positions, sink_cos/sink_sin
  // where the sinks are scored (a context window); keys/values per layer [kv, capacity, dim] with
  // room for the q new rows after `stored`; the rest is row_attention.RowLayout. The rotated query of
  // row `capture_row` (if >= 0) goes to capture[layer] [heads, dim]. An 8-bit cache's layers may come
  // with their tiles and the tiles' state (q8_attention.cpp; an empty tensor where a layer has none).
  at::Tensor forward(at::Tensor x, const at::Tensor& cos, const at::Tensor& sin, const std::optional<at::Tensor>& sink_cos,
                     const std::optional<at::Tensor>& sink_sin, const std::vector<at::Tensor>& keys,
                     const std::vector<at::Tensor>& values, int64_t stored, const at::Tensor& lowest,
                     const at::Tensor& anc, int64_t sinks, int64_t offset, int64_t committed, int64_t block,
                     int64_t capture_row, const std::optional<at::Tensor>& capture,
                     const std::vector<at::Tensor>& tiles, const std::vector<at::Tensor>& tile_states) const {
    TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && cos.is_contiguous() && sin.is_contiguous());
    TORCH_CHECK(keys.size() == layers.size() && values.size() == layers.size());
    const int64_t rows = x.size(0), q_width = heads * dim;
    const bool sink_queries = sinks > 0 && sink_cos.has_value();
    for (const Layer& layer : layers)
      TORCH_CHECK(layer.input_norm.scalar_type() == at::kFloat && layer.post_norm.scalar_type() == at::kFloat &&
                  layer.input_norm.is_contiguous() && layer.post_norm.is_contiguous());
    x = x.contiguous().clone();  // the residual stream, added to in place (the caller's x stays as it was)
    const int64_t width = x.size(1);
    at::Tensor squares = at::empty({rows, width}, x.options()), normed = at::empty({rows, width}, x.options());
    at::Tensor variance = at::empty({rows, 1}, x.options()), hidden = at::empty({rows, intermediate}, x.options());
    at::Tensor query = at::empty({rows, heads, dim}, x.options());
    at::Tensor sink_query = sink_queries ? at::empty({rows, heads, dim}, x.options()) : query;
    const float *c = cos.data_ptr<float>(), *s = sin.data_ptr<float>();
    const float* sc = sink_queries ? sink_cos->data_ptr<float>() : nullptr;
    const float* ss = sink_queries ? sink_sin->data_ptr<float>() : nullptr;
    for (size_t index = 0; index < layers.size(); ++index) {
      const Layer& layer = layers[index];
      rms_norm(x, layer.input_norm, layer.input_eps, squares, variance, normed);
      const at::Tensor projected = layer.qkv(normed).contiguous();
      const at::Tensor& k_cache = keys[index];
      const at::Tensor& v_cache = values[index];
      TORCH_CHECK(k_cache.stride(2) == 1 && v_cache.stride(2) == 1 && k_cache.size(1) >= stored + rows);
      TORCH_CHECK(k_cache.scalar_type() == v_cache.scalar_type() && dim <= 256);
      const at::ScalarType stored_as = k_cache.scalar_type();
      TORCH_CHECK(stored_as == at::kHalf || stored_as == at::kFloat || (stored_as == at::kByte && dim % 32 == 0),
                  "a float32, float16 or 8-bit cache");
      const float* p = projected.data_ptr<float>();
      float *qo = query.data_ptr<float>(), *sqo = sink_query.data_ptr<float>();
      for (int64_t r = 0; r < rows; ++r) {
        const float* row = p + r * projected.stride(0);
        for (int64_t h = 0; h < heads; ++h) {
          rotate(row + h * dim, c + r * dim, s + r * dim, qo + (r * heads + h) * dim, dim);
          if (sink_queries) rotate(row + h * dim, sc + r * dim, ss + r * dim, sqo + (r * heads + h) * dim, dim);
        }
        if (stored_as == at::kHalf)
          write_kv<c10::Half>(row, c + r * dim, s + r * dim, k_cache, v_cache, stored + r, kv_heads, dim, q_width);
        else if (stored_as == at::kByte)
          write_kv<Q8Row>(row, c + r * dim, s + r * dim, k_cache, v_cache, stored + r, kv_heads, dim, q_width);
        else
          write_kv<float>(row, c + r * dim, s + r * dim, k_cache, v_cache, stored + r, kv_heads, dim, q_width);
      }
      if (capture_row >= 0 && capture) (*capture)[index].copy_(query[capture_row]);
      const at::Tensor held_keys = k_cache.narrow(1, 0, stored + rows), held_values = v_cache.narrow(1, 0, stored + rows);
      const bool tiled = stored_as == at::kByte && index < tiles.size() && tiles[index].numel() > 0;
      const at::Tensor attended =
          (tiled ? q8_row_attention(query, sink_query, held_keys, held_values, lowest, anc, sinks, stored, offset,
                                    committed, scaling, block, tiles[index], tile_states[index])
                 : row_attention(query, sink_query, held_keys, held_values, lowest, anc, sinks, stored, offset,
                                 committed, scaling, block))
              .view({rows, q_width});
      add_into(x, layer.o(attended).contiguous());
      rms_norm(x, layer.post_norm, layer.post_eps, squares, variance, normed);
      const at::Tensor gate_up = layer.gate_up(normed).contiguous();
      at::silu_out(hidden, gate_up.narrow(1, 0, intermediate));  // ATen's: its exp is its own
      float* h = hidden.data_ptr<float>();
      const float* g = gate_up.data_ptr<float>();
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < intermediate; ++i) h[r * intermediate + i] = h[r * intermediate + i] * g[r * 2 * intermediate + intermediate + i];
      add_into(x, layer.down(hidden).contiguous());
    }
    return x;
  }
};

void bind_decoder(pybind11::module& m) {
  namespace py = pybind11;
  py::class_<Projection>(m, "Projection");
  m.def("Int4", [](at::Tensor packed, at::Tensor scales, at::Tensor lows, std::optional<at::Tensor> bias,
                   int64_t outputs) { return Projection(packed, scales, lows, bias, outputs); });
  m.def("Blocks", &Projection::blocks);
  py::class_<Layer>(m, "Layer")
      .def(py::init<at::Tensor, double, std::vector<Projection>, Projection, at::Tensor, double,
                    std::vector<Projection>, Projection>());
  py::class_<Decoder>(m, "Decoder")
      .def(py::init<std::vector<Layer>, int64_t, int64_t, int64_t, int64_t, double>())
      // Touches no Python object: other threads (the live panel) run meanwhile.
      .def("forward", &Decoder::forward, py::call_guard<py::gil_scoped_release>(),
           "every decoder layer of one forward (float32, 4-bit or GGUF block weights, CPU)");
}
