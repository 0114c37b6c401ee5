// Sparse payloads of p ranks -- (index, value) entries -- summed into one dense tensor, in payload
// order per element (the reference's order of summation), for every sparse decoder: top-k and DGC
// (scatter_add), Strom's threshold, variance-based.
//
// Every encoder of gctestbed sends its indices in ascending order. Then each block of the output
// is summed in L1 -- zeroed, every payload's entries that fall in it added, streamed out once --
// and the output costs one pass over memory, where a memset followed by scattered adds costs the
// memset's pass plus a cache miss per entry. Payloads out of order are summed by scattering.
#pragma once
#include "common.h"

namespace gct::cpu {

namespace detail {

// The first j in [0, m) with index(j) >= target, by bisection (any order: a wrong answer on
// unordered indices is caught by sum_in_blocks' checks).
template <class Index>
int64_t first_at_or_after(Index index, int64_t m, int64_t target) {
    int64_t lo = 0, hi = m;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (index(mid) < target) lo = mid + 1; else hi = mid;
    }
    return lo;
}

// The blocked sum; false (and out to be rewritten) if some payload's entries are not grouped by
// block in ascending order.
template <class Entry>
bool sum_in_blocks(int p, const int64_t* counts, Entry entry, float* out, int64_t n) {
    const int64_t blocks = (n + kBlock - 1) / kBlock;
    const int nt = threads_for(n);
    // starts[t * p + q]: payload q's first entry at or after thread t's first element
    std::vector<int64_t> starts((nt + 1) * p);
    for (int t = 0; t <= nt; ++t)
        for (int q = 0; q < p; ++q)
            starts[t * p + q] = t == nt ? counts[q]
                                        : first_at_or_after([&](int64_t j) { return entry(q, j).first; }, counts[q],
                                                            blocks * t / nt * kBlock);
    for (int t = 0; t < nt; ++t)
        for (int q = 0; q < p; ++q)
            if (starts[t * p + q] > starts[(t + 1) * p + q]) return false;
    bool ordered = true;
#pragma omp parallel num_threads(nt) reduction(&& : ordered)
    {
        const int t = omp_get_thread_num();
        std::vector<int64_t> cursor(starts.begin() + t * p, starts.begin() + (t + 1) * p);
        const int64_t* end = starts.data() + (t + 1) * p;
        alignas(64) float acc[kBlock];
        for (int64_t b = blocks * t / nt; b < blocks * (t + 1) / nt; ++b) {
            const int64_t lo = b * kBlock, hi = std::min(n, lo + kBlock);
            std::fill(acc, acc + (hi - lo), 0.0f);
            for (int q = 0; q < p; ++q) {
                int64_t j = cursor[q];
                for (; j < end[q]; ++j) {
                    const auto [i, v] = entry(q, j);
                    if (i >= hi) break;
                    if (i < lo) { ordered = false; continue; }
                    acc[i - lo] += v;
                }
                cursor[q] = j;
            }
            stream_store(out + lo, acc, hi - lo);
        }
        stream_fence();
        for (int q = 0; q < p; ++q) ordered = ordered && cursor[q] == end[q];
    }
    return ordered;
}

}  // namespace detail

// out[i] = sum over payloads q (in order) of the values of q's entries at index i; entry(q, j)
// gives payload q's j-th entry as {index, value}. Indices must lie in [0, n) (the bindings check).
template <class Entry>
void sparse_sum(int p, const int64_t* counts, Entry entry, float* out, int64_t n) {
    if (detail::sum_in_blocks(p, counts, entry, out, n)) return;
    std::memset(out, 0, n * sizeof(float));
    for (int q = 0; q < p; ++q) {
#pragma omp parallel for num_threads(threads_for(counts[q])) schedule(static)
        for (int64_t j = 0; j < counts[q]; ++j) {
            const auto [i, v] = entry(q, j);
            out[i] += v;
        }
    }
}

}  // namespace gct::cpu
