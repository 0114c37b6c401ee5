// Helpers shared by the CPU kernels: the OpenMP cut-off, ordered compaction, and the streaming
// stores and block loop of the decoders.
#pragma once
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX512F__) || defined(__AVX__) || defined(__SSE2__)
#include <immintrin.h>
#endif

#include "../ops.h"

namespace gct::cpu {

// Below this many elements a kernel runs on one thread: a parallel region costs microseconds.
constexpr int64_t kParallelMin = 1 << 16;

// Elements per block: a multiple of every code width's per-word count, small enough for L1.
constexpr int64_t kBlock = 1024;

inline int threads_for(int64_t n) { return n >= kParallelMin ? omp_get_max_threads() : 1; }

// Writes count floats from a buffer in cache to dst with non-temporal stores where the CPU has
// them: a decoder's output goes to memory without its lines being read first (a plain store
// reads every line it writes), so an output written once costs one pass over memory, not two.
inline void stream_store(float* __restrict__ dst, const float* __restrict__ src, int64_t count) {
    int64_t j = 0;
#if defined(__AVX512F__)
    for (; j < count && (reinterpret_cast<uintptr_t>(dst + j) & 63); ++j) dst[j] = src[j];
    for (; j + 16 <= count; j += 16) _mm512_stream_ps(dst + j, _mm512_loadu_ps(src + j));
#elif defined(__AVX__)
    for (; j < count && (reinterpret_cast<uintptr_t>(dst + j) & 31); ++j) dst[j] = src[j];
    for (; j + 8 <= count; j += 8) _mm256_stream_ps(dst + j, _mm256_loadu_ps(src + j));
#endif
    for (; j < count; ++j) dst[j] = src[j];
}

// After a thread's last stream_store: its streamed lines are visible to the other threads.
inline void stream_fence() {
#if defined(__SSE2__) || defined(__AVX__)
    _mm_sfence();
#endif
}

// Ordered compaction: each of nt threads collects what it selects from its contiguous range
// [n*t/nt, n*(t+1)/nt) into parts[t] (reading the input once); concat then copies the parts, in
// range order, into alloc(total).
inline int64_t range_lo(int64_t n, int t, int nt) { return n * t / nt; }

template <class T>
void concat(const std::vector<std::vector<T>>& parts, const Alloc<T>& alloc) {
    const int nt = static_cast<int>(parts.size());
    int64_t total = 0;
    std::vector<int64_t> offset(nt);
    for (int t = 0; t < nt; ++t) { offset[t] = total; total += static_cast<int64_t>(parts[t].size()); }
    T* out = alloc(total);
#pragma omp parallel for num_threads(nt) schedule(static, 1)
    for (int t = 0; t < nt; ++t)
        if (!parts[t].empty()) std::memcpy(out + offset[t], parts[t].data(), parts[t].size() * sizeof(T));
}

// body(lo, hi) for every block [lo, hi) of n elements, in parallel; every thread fences its
// streamed stores before the region ends.
template <class Body>
void for_blocks(int64_t n, Body body) {
    const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel num_threads(threads_for(n))
    {
#pragma omp for schedule(static)
        for (int64_t b = 0; b < blocks; ++b) body(b * kBlock, std::min(n, b * kBlock + kBlock));
        stream_fence();
    }
}

// body(lo, hi, acc) for every block [lo, hi) of n elements, in parallel; body fills acc[0, hi - lo)
// (a buffer in L1) with the block's result, which is then streamed to out[lo, hi).
template <class Body>
void decode_blocks(int64_t n, float* out, Body body) {
    for_blocks(n, [&](int64_t lo, int64_t hi) {
        alignas(64) float acc[kBlock];
        body(lo, hi, acc);
        stream_store(out + lo, acc, hi - lo);
    });
}

#if defined(__AVX512F__)
// Stores 16 floats at dst (64-byte aligned: streamed past the caches).
inline void store16(float* dst, __m512 v) {
    if (reinterpret_cast<uintptr_t>(dst) & 63) _mm512_storeu_ps(dst, v);
    else _mm512_stream_ps(dst, v);
}
#endif

}  // namespace gct::cpu
