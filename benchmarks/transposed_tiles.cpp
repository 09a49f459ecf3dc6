// Would a cache of keys stored as transposed float16 tiles (dimension-major, 16 positions) make a plain
// step's scores cheaper? Today's path (widen 16 keys, then per query lane 16 dot products folded by fold16)
// against broadcast products over such a tile for the 3 lanes of a KV head at once (fold's adds): checks the
// scores have the same bits, times both over 30 layers' keys (from memory) or one layer's (in cache), each
// with the next tile prefetched. Issue 41; the result is in benchmarks/record/performance.md (2026-11-28).
//
//   g++ -O3 -march=native -ffp-contract=off -std=c++17 $(python -c "import torch.utils.cpp_extension as c; \
//     print(' '.join('-I' + p for p in c.include_paths()))") -Isrc/tokenswift_cli/backends/cpu/csrc \
//     benchmarks/transposed_tiles.cpp -o /tmp/transposed_tiles && /tmp/transposed_tiles 30 && /tmp/transposed_tiles 1
#include "simd.h"
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>
using namespace simd;
using Half = c10::Half;

inline v16 fold16(const v16* a) {
  v16 l1[8], l2[4], l3[2];
  for (int i = 0; i < 8; ++i)
    l1[i] = __builtin_shufflevector(a[2 * i], a[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
            __builtin_shufflevector(a[2 * i], a[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  for (int i = 0; i < 4; ++i)
    l2[i] = __builtin_shufflevector(l1[2 * i], l1[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
            __builtin_shufflevector(l1[2 * i], l1[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  for (int i = 0; i < 2; ++i)
    l3[i] = __builtin_shufflevector(l2[2 * i], l2[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
            __builtin_shufflevector(l2[2 * i], l2[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
  return __builtin_shufflevector(l3[0], l3[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
         __builtin_shufflevector(l3[0], l3[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}
constexpr int C = 4, D = 64, G = 3;

__attribute__((noinline)) void today(const Half* key0, const float* const* q, float* tile, float scale, float* out) {
  const float* keys[16];
  for (int l = 0; l < 16; ++l) {
    for (int c = 0; c < C; ++c) store(tile + l * D + c * 16, load(key0 + l * D + c * 16));
    keys[l] = tile + l * D;
  }
  for (int g = 0; g < G; ++g) {
    v16 qc[C], parts[16];
    for (int c = 0; c < C; ++c) qc[c] = load(q[g] + c * 16);
    for (int l = 0; l < 16; ++l) {
      v16 a = load(keys[l]) * qc[0];
      for (int c = 1; c < C; ++c) a = fma(load(keys[l] + c * 16), qc[c], a);
      parts[l] = a;
    }
    store(out + g * 16, fold16(parts) * scale);
  }
}

// tile: [D][16] float16, tile[d * 16 + l] = key l's dimension d
__attribute__((noinline)) void tiled(const Half* tile, const float* const* q, float scale, float* out) {
  auto partials = [&](int i, v16* a) {
    const v16 k0 = load(tile + i * 16);
    for (int g = 0; g < G; ++g) a[g] = splat(q[g][i]) * k0;
    for (int c = 1; c < C; ++c) {
      const v16 k = load(tile + (c * 16 + i) * 16);
      for (int g = 0; g < G; ++g) a[g] = fma(splat(q[g][c * 16 + i]), k, a[g]);
    }
  };
  v16 l2[4][G];
  for (int i = 0; i < 4; ++i) {
    v16 a[G], b[G], c[G], d[G];
    partials(i, a);
    partials(i + 8, b);
    for (int g = 0; g < G; ++g) a[g] = a[g] + b[g];
    partials(i + 4, c);
    partials(i + 12, d);
    for (int g = 0; g < G; ++g) l2[i][g] = a[g] + (c[g] + d[g]);
  }
  for (int g = 0; g < G; ++g) store(out + g * 16, ((l2[0][g] + l2[2][g]) + (l2[1][g] + l2[3][g])) * scale);
}

int main(int argc, char** argv) {
  const int N = 4096, KV = 3, L = argc > 1 ? atoi(argv[1]) : 30;  // layers' worth of distinct memory
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  std::vector<Half> keys((size_t)L * KV * N * D), tiles(keys.size());
  for (auto& k : keys) k = Half(nd(rng));
  for (size_t t = 0; t < keys.size() / (16 * D); ++t)  // transposed copy
    for (int l = 0; l < 16; ++l)
      for (int d = 0; d < D; ++d) tiles[t * 16 * D + d * 16 + l] = keys[t * 16 * D + l * D + d];
  std::vector<float> qs(G * D), tile(16 * D), a(16 * G), b(16 * G);
  for (auto& x : qs) x = nd(rng);
  const float* q[G] = {qs.data(), qs.data() + D, qs.data() + 2 * D};
  size_t mismatch = 0;
  for (size_t t = 0; t < keys.size() / (16 * D); ++t) {
    today(keys.data() + t * 16 * D, q, tile.data(), 0.125f, a.data());
    tiled(tiles.data() + t * 16 * D, q, 0.125f, b.data());
    for (int i = 0; i < 16 * G; ++i) mismatch += a[i] != b[i];
  }
  printf("mismatched scores: %zu of %zu\n", mismatch, keys.size() / D * G);
  double best[2] = {1e9, 1e9};
  float sink = 0;
  for (int rep = 0; rep < 40; ++rep)
    for (int which = 0; which < 2; ++which) {
      auto t0 = std::chrono::steady_clock::now();
      for (size_t t = 0; t < keys.size() / (16 * D); ++t) {
        const char* next = reinterpret_cast<const char*>((which == 0 ? keys.data() : tiles.data()) + (t + 1) * 16 * D);
        for (int byte = 0; byte < 16 * D * 2; byte += 64) __builtin_prefetch(next + byte, 0, 3);
        if (which == 0) today(keys.data() + t * 16 * D, q, tile.data(), 0.125f, a.data());
        else tiled(tiles.data() + t * 16 * D, q, 0.125f, a.data());
        sink += a[t % 48];
      }
      double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      best[which] = std::min(best[which], ms);
    }
  printf("scores of a 4K step's %d layers: today %.2f ms, transposed tiles %.2f ms (%.2fx) %g\n", L, best[0], best[1],
         best[1] / best[0], sink);
}
