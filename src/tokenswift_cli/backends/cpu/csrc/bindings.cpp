// The Python module of the kernels (kernels.py builds it).
#include <torch/extension.h>

at::Tensor row_attention(const at::Tensor& q, const at::Tensor& sq, const at::Tensor& keys, const at::Tensor& values,
                         const at::Tensor& lowest, const at::Tensor& anc, int64_t sinks, int64_t stored,
                         int64_t offset, int64_t committed, double scaling, int64_t block);
at::Tensor q8_row_attention(const at::Tensor& q, const at::Tensor& sq, const at::Tensor& keys,
                            const at::Tensor& values, const at::Tensor& lowest, const at::Tensor& anc, int64_t sinks,
                            int64_t stored, int64_t offset, int64_t committed, double scaling, int64_t block,
                            const std::optional<at::Tensor>& mirror, const std::optional<at::Tensor>& mirror_state);
at::Tensor q4_products(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales, const at::Tensor& lows,
                       const std::optional<at::Tensor>& bias, int64_t n_out);
at::Tensor q8_products(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales, int64_t n_out);
int64_t target_draw(const at::Tensor& row, const at::Tensor& out, const at::Tensor& context,
                    const at::Tensor& suppress, const std::vector<at::Tensor>& banned, const at::Tensor& dry_table,
                    int64_t dry_range, int64_t dry_allowed, int64_t window, double penalty, double temperature,
                    int64_t top_k, double min_p, int64_t mode, double u, int64_t searched);
at::Tensor dense_row_products(const at::Tensor& x, const at::Tensor& w, const std::optional<at::Tensor>& bias);
at::Tensor dense_column_products(const at::Tensor& x, const at::Tensor& v);
at::Tensor block_products(const at::Tensor& x, const at::Tensor& weights, int64_t type,
                          const std::optional<at::Tensor>& bias);
at::Tensor split_counts(int64_t size, int64_t grain, int64_t fail_at);
void bind_decoder(pybind11::module& m);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("row_attention", &row_attention, "attention of new tokens over a KV cache, row by row (float32)");
  m.def("q8_row_attention", &q8_row_attention,
        "row_attention over 8-bit rows, with the rows' tiles kept across calls (or none)");
  m.def("q4_products", &q4_products, "4-bit weights times 8-bit activations, rows on their own (float32)",
        pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("q8_products", &q8_products, "8-bit weights times 8-bit activations, rows on their own (float32)",
        pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("dense_row_products", &dense_row_products, "x . w per row and output, one order on every CPU (float32)",
        pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("dense_column_products", &dense_column_products, "x @ v, k ascending, one order on every CPU (float32)",
        pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("block_products", &block_products, "a GGUF file's weight blocks times 8-bit activations, rows on their own",
        pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("target_draw", &target_draw, "the target's scores of one row of logits, and its argmax or draw (float32)");
  m.def("split_counts", &split_counts, "for the tests: the visits of each index by parallel.h's split",
        pybind11::call_guard<pybind11::gil_scoped_release>());
  bind_decoder(m);
}
