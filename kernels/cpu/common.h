// Helpers shared by the CPU kernels: the OpenMP cut-off and ordered compaction.
#pragma once
#include <omp.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "../ops.h"

namespace gct::cpu {

// Below this many elements a kernel runs on one thread: a parallel region costs microseconds.
constexpr int64_t kParallelMin = 1 << 16;

inline int threads_for(int64_t n) { return n >= kParallelMin ? omp_get_max_threads() : 1; }

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

}  // namespace gct::cpu
