// The host's memory read rate, the ceiling of a decode step on the CPU (each token reads every
// weight once): threads sum disjoint parts of a buffer far larger than the caches, with 256-bit
// loads where the CPU has AVX2, and the best of several passes is reported.
//
//   asynct_cpu_memory_rate [MiB = 1024] [threads = thread_limit(): ASYNCT_THREADS caps it] [passes = 10]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "core/parallel.h"

#if defined(__x86_64__)
#include <immintrin.h>
__attribute__((target("avx2"))) static float sum_avx2(const float* p, std::size_t n) {
  __m256 a = _mm256_setzero_ps(), b = a, c = a, d = a;
  for (std::size_t i = 0; i + 32 <= n; i += 32) {
    a = _mm256_add_ps(a, _mm256_load_ps(p + i));
    b = _mm256_add_ps(b, _mm256_load_ps(p + i + 8));
    c = _mm256_add_ps(c, _mm256_load_ps(p + i + 16));
    d = _mm256_add_ps(d, _mm256_load_ps(p + i + 24));
  }
  float out[8];
  _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(a, b), _mm256_add_ps(c, d)));
  return out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
}
#endif

static float sum_plain(const float* p, std::size_t n) {
  float s[8] = {};
  for (std::size_t i = 0; i < n; i += 8)
    for (int k = 0; k < 8; ++k) s[k] += p[i + std::size_t(k)];
  return s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}

int main(int argc, char** argv) {
  const std::size_t mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1024;
  const unsigned threads = argc > 2 ? unsigned(std::atoi(argv[2])) : asynct::thread_limit();
  const int passes = argc > 3 ? std::atoi(argv[3]) : 10;
  if (mib < 1 || threads < 1 || passes < 1) {
    std::fprintf(stderr, "usage: %s [MiB >= 1] [threads >= 1] [passes >= 1]\n", argv[0]);
    return 2;
  }
  const std::size_t n = mib << 18;  // floats
  float* buffer = static_cast<float*>(std::aligned_alloc(64, n * sizeof(float)));
  if (!buffer) {
    std::fprintf(stderr, "cannot allocate %zu MiB\n", mib);
    return 1;
  }
  std::memset(buffer, 0, n * sizeof(float));
#if defined(__x86_64__)
  const bool avx2 = __builtin_cpu_supports("avx2");
#else
  const bool avx2 = false;
#endif
  double best = 0.0;
  std::vector<float> sums(threads);
  for (int pass = 0; pass < passes; ++pass) {
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    const std::size_t part = n / threads / 32 * 32;
    for (unsigned t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        const float* p = buffer + std::size_t(t) * part;
#if defined(__x86_64__)
        sums[t] = avx2 ? sum_avx2(p, part) : sum_plain(p, part);
#else
        sums[t] = sum_plain(p, part);
#endif
      });
    for (std::thread& t : pool) t.join();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, double(part) * threads * sizeof(float) / seconds / 1e9);
  }
  std::printf("memory read rate: %.1f GB/s (%zu MiB, %u threads, best of %d passes%s; checksum %g)\n", best, mib, threads,
              passes, avx2 ? ", AVX2 loads" : "", double(sums[0]));
  std::free(buffer);
  return 0;
}
