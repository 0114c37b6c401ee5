// Selection for sparsifiers (DGC): the magnitude threshold from a sample without sorting
// (nth_element), one-pass ordered compaction of |v| >= threshold, and exact trimming of an
// over-full selection to its k largest. NaN ranks above every number, as in torch.topk.
#include <algorithm>
#include <cmath>

#include "common.h"

namespace gct::cpu {

namespace {
inline bool ranks_above(float a, float b) { return (std::isnan(a) && !std::isnan(b)) || a > b; }
inline bool ranks_equal(float a, float b) { return (std::isnan(a) && std::isnan(b)) || a == b; }
}  // namespace

void select_above(const float* v, int64_t n, float threshold, const Alloc<int64_t>& alloc) {
    const int nt = threads_for(n);
    std::vector<std::vector<int64_t>> parts(nt);
#pragma omp parallel num_threads(nt)
    {
        const int t = omp_get_thread_num();
        for (int64_t i = range_lo(n, t, nt), hi = range_lo(n, t + 1, nt); i < hi; ++i)
            if (std::fabs(v[i]) >= threshold) parts[t].push_back(i);
    }
    concat(parts, alloc);
}

float kth_largest_sampled(const float* v, const int64_t* sample, int64_t m, int64_t k) {
    std::vector<float> mags(m);
    for (int64_t j = 0; j < m; ++j) mags[j] = std::fabs(v[sample[j]]);
    std::nth_element(mags.begin(), mags.begin() + (k - 1), mags.end(), ranks_above);
    return mags[k - 1];
}

int64_t keep_largest(const float* v, int64_t* idx, int64_t m, int64_t k) {
    if (k >= m) return m;
    std::vector<float> mags(m);
    for (int64_t j = 0; j < m; ++j) mags[j] = std::fabs(v[idx[j]]);
    std::vector<float> order(mags);
    std::nth_element(order.begin(), order.begin() + (k - 1), order.end(), ranks_above);
    const float kth = order[k - 1];
    int64_t above = 0;
    for (int64_t j = 0; j < m; ++j) above += ranks_above(mags[j], kth);
    int64_t ties = k - above, out = 0;
    for (int64_t j = 0; j < m; ++j) {
        const bool take = ranks_above(mags[j], kth) || (ranks_equal(mags[j], kth) && ties-- > 0);
        if (take) idx[out++] = idx[j];
    }
    return out;
}

void dgc_accumulate(float* u, float* v, const float* g, int64_t n, float momentum) {
#pragma omp parallel for num_threads(threads_for(n)) schedule(static)
    for (int64_t i = 0; i < n; ++i) {
        const float ui = u[i] * momentum + g[i];
        u[i] = ui;
        v[i] = v[i] + ui;
    }
}

}  // namespace gct::cpu
