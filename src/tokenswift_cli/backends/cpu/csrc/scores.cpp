// The target's scores and draw for one row of logits in a few passes over the vocabulary: what
// sampling/distribution.py's `scored` and `choose` compute with torch ops, rule by rule, bit for bit.
//
// Every value is computed by the same float32 operations as there (a division by the temperature, a
// product or a quotient by the penalty, a difference with DRY's amount), so the scores are the same
// bits; the sums that the torch path rounds in its own order (min-p's softmax) are only compared
// against a margin here: a score too close to min-p's cut to be sure of its side is handed back to
// the torch code (kMinPUnsettled), as is any row with a NaN or +inf (kUnhandled). The draw is
// `_draw_kept`'s arithmetic in the same order (libm's exp, sums left to right), which returns a token
// only where the full CDF's would be the same; else kUndrawn, and the caller inverts the full CDF.
// The loops are plain C++ that the compiler vectorises for the machine (-march=native), but for the
// scans, written for AVX-512 and AVX2 (and portably): none of them rounds anything.
#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <queue>
#include <vector>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kUndrawn = -1, kMinPUnsettled = -2, kUnhandled = -3;
constexpr float kInf = std::numeric_limits<float>::infinity();
// min-p: a score whose distance d to the max is within this of log(min_p) (in nats, i.e. a relative
// difference of probabilities) is left to torch's softmax. Its p / p_max is within 1e-6 of exp(d)
// (tests/test_sampling_fused.py checks it; 1.3e-7 measured), its cut within an ulp or two of min_p's.
constexpr double kMinPMargin = 1e-5;

// Bit l set when p[l] - base >= t in float32 (never for a NaN), for 16 lanes.
inline uint32_t at_least16(const float* p, float base, float t) {
#if defined(__AVX512F__)
  const __m512 d = _mm512_sub_ps(_mm512_loadu_ps(p), _mm512_set1_ps(base));
  return _mm512_cmp_ps_mask(d, _mm512_set1_ps(t), _CMP_GE_OQ);
#elif defined(__AVX2__)
  const __m256 b = _mm256_set1_ps(base), v = _mm256_set1_ps(t);
  const __m256 lo = _mm256_sub_ps(_mm256_loadu_ps(p), b), hi = _mm256_sub_ps(_mm256_loadu_ps(p + 8), b);
  return uint32_t(_mm256_movemask_ps(_mm256_cmp_ps(lo, v, _CMP_GE_OQ))) |
         uint32_t(_mm256_movemask_ps(_mm256_cmp_ps(hi, v, _CMP_GE_OQ))) << 8;
#else
  uint32_t bits = 0;
  for (int l = 0; l < 16; ++l) bits |= uint32_t(p[l] - base >= t) << l;
  return bits;
#endif
}

// The indices i (ascending) with x[i] - base >= t, up to `cap` of them (one more tells that there are more).
void indices_at_least(const float* x, int64_t n, float base, float t, int64_t cap, std::vector<int64_t>& out) {
  out.clear();
  int64_t i = 0;
  for (; i + 16 <= n && (int64_t)out.size() <= cap; i += 16) {
    for (uint32_t bits = at_least16(x + i, base, t); bits; bits &= bits - 1) out.push_back(i + __builtin_ctz(bits));
  }
  for (; i < n && (int64_t)out.size() <= cap; ++i)
    if (x[i] - base >= t) out.push_back(i);
}

// y[i] = -inf where m[i] (GCC leaves this select in scalar code: written out per machine).
void ban(float* y, const bool* m, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
  for (; i + 16 <= n; i += 16) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(m + i));
    _mm512_mask_storeu_ps(y + i, _mm_test_epi8_mask(b, b), _mm512_set1_ps(-kInf));
  }
#elif defined(__AVX2__)
  for (; i + 8 <= n; i += 8) {
    const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(m + i)));
    const __m256i on = _mm256_cmpgt_epi32(b, _mm256_setzero_si256());
    _mm256_maskstore_ps(y + i, on, _mm256_set1_ps(-kInf));
  }
#endif
  for (; i < n; ++i)
    if (m[i]) y[i] = -kInf;
}

// The max of x, and whether x holds a NaN or +inf (then the max is not used).
float max_of(const float* x, int64_t n, bool& bad) {
  float best = -kInf;
  int64_t i = 0;
#if defined(__AVX512F__)
  __m512 m = _mm512_set1_ps(-kInf);
  __mmask16 odd = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    odd |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(v, _mm512_set1_ps(kInf), _CMP_EQ_OQ);
    m = _mm512_max_ps(m, v);
  }
  best = _mm512_reduce_max_ps(m);
  bad = odd != 0;
#elif defined(__AVX2__)
  __m256 m = _mm256_set1_ps(-kInf);
  __m256 odd = _mm256_setzero_ps();
  const __m256 inf = _mm256_set1_ps(kInf);
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    odd = _mm256_or_ps(odd, _mm256_or_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q), _mm256_cmp_ps(v, inf, _CMP_EQ_OQ)));
    m = _mm256_max_ps(m, v);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  for (float lane : lanes) best = std::max(best, lane);
  bad = _mm256_movemask_ps(odd) != 0;
#else
  bad = false;
#endif
  for (; i < n; ++i) {
    bad |= std::isnan(x[i]) || x[i] == kInf;
    best = std::max(best, x[i]);
  }
  return best;
}

// `distribution._draw_kept`: the inverse CDF at u over the kept scores, or kUndrawn where it might
// not be the full CDF's token.
int64_t draw_kept(const float* scores, const std::vector<int64_t>& kept, double u) {
  const int64_t n = kept.size();
  double top = -std::numeric_limits<double>::infinity();
  for (int64_t k : kept) top = std::max(top, (double)scores[k]);
  std::vector<double> cdf(n);
  double total = 0.0;
  for (int64_t j = 0; j < n; ++j) total += cdf[j] = std::exp((double)scores[kept[j]] - top);
  const double scale = 1.0 / total;
  double running = 0.0;
  for (int64_t j = 0; j < n; ++j) cdf[j] = running += cdf[j] * scale;
  const double target = u * cdf[n - 1];
  const int64_t k = std::min<int64_t>(std::lower_bound(cdf.begin(), cdf.end(), target) - cdf.begin(), n - 1);
  const double below = k > 0 ? cdf[k - 1] : 0.0;
  const double rounding = (double)(8 * (n + 2)) * std::numeric_limits<double>::epsilon() * cdf[n - 1];
  return below + rounding < target && target < cdf[k] - rounding ? kept[k] : kUndrawn;
}

// Scratch per thread, sized to the vocabulary: DRY's amount per token (zero but where set) and the
// stamp of the call that last listed a token among the ones to fix up. Returned by a call GCC cannot see
// into: a reference to a thread_local from a shared library is re-derived at each use (a call to
// __tls_get_addr, per token of the window in the loops below).
struct Scratch {
  std::vector<float> dry;
  std::vector<uint32_t> stamp;
  uint32_t epoch = 0;
  std::vector<int64_t> fix, kept;
};

__attribute__((noinline)) Scratch& scratch(int64_t vocab) {
  thread_local Scratch s;
  if ((int64_t)s.dry.size() < vocab) {
    s.dry.assign(vocab, 0.0f);
    s.stamp.assign(vocab, 0);
  }
  if (s.epoch >= UINT32_MAX - 2) {  // a call takes two stamps: before they wrap, none may look current
    std::fill(s.stamp.begin(), s.stamp.end(), 0);
    s.epoch = 0;
  }
  ++s.epoch;
  return s;
}

// `distribution.dry_penalties` (its max per token) into s.dry, listing the tokens in s.fix.
void dry_amounts(const int64_t* ctx, int64_t n, int64_t allowed, const float* table, int64_t table_size,
                 Scratch& s) {
  if (n < 2) return;
  const int64_t last = ctx[n - 1], reach = std::min<int64_t>(64, n - 1);
  for (int64_t end = 0; end + 1 < n; ++end) {
    if (ctx[end] != last) continue;
    int64_t length = 0;  // tokens up to `end` that match the ones up to the context's end
    while (length < reach && end - length >= 0 && ctx[end - length] == ctx[n - 1 - length]) ++length;
    if (length < allowed || length >= table_size) continue;
    const int64_t token = ctx[end + 1];
    if (s.stamp[token] != s.epoch) {
      s.stamp[token] = s.epoch;
      s.fix.push_back(token);
    }
    s.dry[token] = std::max(s.dry[token], table[length]);
  }
}

// The k-th largest score (duplicates counted), as torch.topk's last value.
float kth_largest(const float* x, int64_t n, int64_t k) {
  std::priority_queue<float, std::vector<float>, std::greater<float>> heap;
  for (int64_t i = 0; i < n; ++i) {
    if ((int64_t)heap.size() < k) {
      heap.push(x[i]);
    } else if (x[i] > heap.top()) {
      heap.pop();
      heap.push(x[i]);
    }
  }
  return heap.top();
}

bool ids_below(const int64_t* ids, int64_t n, int64_t vocab) {
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= vocab) return false;
  return true;
}

}  // namespace

// row: [V] float32 logits; out: [V] float32 (written); context: [n] int64 (the path's last tokens);
// suppress: [s] int64; banned: bool [V] masks; dry_table: [65] float32 (empty: no DRY), read over the
// last `dry_range` tokens; penalty over the last `window` (0: none); temperature (0: none); top_k (0:
// none); min_p (0: none); mode 0: the scores only, 1: their argmax, 2: the draw at u over at most
// `searched` kept tokens. Returns the token, or one of the codes above (then `out` holds the scores
// before min-p for kMinPUnsettled, the final scores for kUndrawn and mode 0, nothing for kUnhandled).
int64_t target_draw(const at::Tensor& row, const at::Tensor& out, const at::Tensor& context,
                    const at::Tensor& suppress, const std::vector<at::Tensor>& banned, const at::Tensor& dry_table,
                    int64_t dry_range, int64_t dry_allowed, int64_t window, double penalty, double temperature,
                    int64_t top_k, double min_p, int64_t mode, double u, int64_t searched) {
  TORCH_CHECK(row.dtype() == at::kFloat && out.dtype() == at::kFloat && row.is_contiguous() && out.is_contiguous());
  TORCH_CHECK(context.dtype() == at::kLong && suppress.dtype() == at::kLong && dry_table.dtype() == at::kFloat);
  TORCH_CHECK(context.is_contiguous() && suppress.is_contiguous() && dry_table.is_contiguous());
  const int64_t vocab = row.numel(), n = context.numel();
  TORCH_CHECK(out.numel() == vocab);
  const float* x = row.data_ptr<float>();
  float* y = out.data_ptr<float>();
  const int64_t* ctx = context.data_ptr<int64_t>();
  std::vector<const bool*> masks;
  for (const at::Tensor& mask : banned) {
    TORCH_CHECK(mask.dtype() == at::kBool && mask.is_contiguous() && mask.numel() == vocab);
    masks.push_back(mask.data_ptr<bool>());
  }
  if (!ids_below(ctx, n, vocab) || !ids_below(suppress.data_ptr<int64_t>(), suppress.numel(), vocab))
    return kUnhandled;  // torch's indexing raises its own error
  const float t = (float)temperature, p = (float)penalty;  // torch rounds a Python float to the tensor's dtype

  // Every score, as if neither DRY nor the penalty touched it: divided by the temperature, -inf where banned.
  if (t != 0.0f) {
    for (int64_t i = 0; i < vocab; ++i) y[i] = x[i] / t;
  } else {
    std::copy(x, x + vocab, y);
  }
  for (const bool* m : masks) ban(y, m, vocab);

  // The tokens DRY or the penalty touch, recomputed in the torch path's order.
  Scratch& s = scratch(vocab);
  s.fix.clear();
  if (dry_table.numel() > 0) {
    const int64_t span = std::min(n, dry_range);
    dry_amounts(ctx + n - span, span, dry_allowed, dry_table.data_ptr<float>(), dry_table.numel(), s);
  }
  const int64_t dry_listed = s.fix.size();
  const uint32_t dry_epoch = s.epoch;
  if (window > 0) {
    ++s.epoch;  // the call's second stamp: the window's tokens (DRY's keep the first)
    for (int64_t i = std::max<int64_t>(0, n - window); i < n; ++i) {
      const int64_t token = ctx[i];
      if (s.stamp[token] != s.epoch) {
        if (s.stamp[token] != dry_epoch) s.fix.push_back(token);
        s.stamp[token] = s.epoch;
      }
    }
  }
  for (size_t j = 0; j < s.fix.size(); ++j) {
    const int64_t token = s.fix[j];
    bool masked = false;
    for (const bool* m : masks) masked |= m[token];
    float v = x[token];
    if (j < (size_t)dry_listed) v = v - s.dry[token];
    if (window > 0 && s.stamp[token] == s.epoch) v = v < 0 ? v * p : v / p;
    if (t != 0.0f) v = v / t;
    s.dry[token] = 0.0f;
    if (!masked) y[token] = v;
  }
  const int64_t* sup = suppress.data_ptr<int64_t>();
  for (int64_t i = 0; i < suppress.numel(); ++i) y[sup[i]] = -kInf;

  bool bad = false;
  const float top = max_of(y, vocab, bad);
  if (bad) return kUnhandled;
  if (mode == 1) {
    return std::find(y, y + vocab, top) - y;  // the first max, as torch's argmax
  }
  if (top_k > 0 && top_k < vocab) {
    const float kth = kth_largest(y, vocab, top_k);
    for (int64_t i = 0; i < vocab; ++i) y[i] = y[i] < kth ? -kInf : y[i];
  }
  std::vector<int64_t>& kept = s.kept;
  bool listed = false;
  if (min_p > 0) {
    if (top == -kInf || min_p < 1e-30) return kMinPUnsettled;
    const double cut = std::log(min_p);
    // Candidates: every score whose distance to the max (as torch's softmax rounds it) may reach the cut.
    const float lowest = std::nextafter((float)(cut - kMinPMargin), -kInf);
    indices_at_least(y, vocab, top, lowest, vocab, kept);
    int64_t held = 0;
    for (int64_t i : kept) {
      const double d = (double)(y[i] - top);  // the difference torch's softmax takes, in float32
      if (d >= cut - kMinPMargin && d <= cut + kMinPMargin) return kMinPUnsettled;
      if (d > cut) kept[held++] = i;
    }
    kept.resize(held);
    std::vector<float> values(held);
    for (int64_t j = 0; j < held; ++j) values[j] = y[kept[j]];
    std::fill(y, y + vocab, -kInf);
    for (int64_t j = 0; j < held; ++j) y[kept[j]] = values[j];
    listed = true;
  }
  if (mode != 2) return kUndrawn;
  if (!listed) indices_at_least(y, vocab, 0.0f, -std::numeric_limits<float>::max(), searched, kept);
  if (kept.empty() || (int64_t)kept.size() > searched) return kUndrawn;
  return draw_kept(y, kept, u);
}
