// Strom's threshold method: selection, compaction into sign|index words and the residual update
// in one pass over the gradient and residual; decoding scatters +-tau per payload.
#include <cmath>

#include "pack.h"
#include "sparse.h"

namespace gct::cpu {

namespace {
// a = g + r; where |a| >= tau: flag 1 (a >= 0) or 2 (a < 0) and r = a -+ tau; elsewhere flag 0, r = a.
void select_block(const float* __restrict__ g, float* __restrict__ r, int64_t count, float tau,
                  uint8_t* __restrict__ flag) {
#pragma omp simd
    for (int64_t j = 0; j < count; ++j) {
        const float a = g[j] + r[j];
        const bool sel = std::fabs(a) >= tau, neg = a < 0.0f;
        r[j] = a - (sel ? (neg ? -tau : tau) : 0.0f);
        flag[j] = sel ? (neg ? 2 : 1) : 0;
    }
}
}  // namespace

void threshold_encode(const float* g, float* r, int64_t n, float tau, const Alloc<int32_t>& alloc) {
    const int nt = threads_for(n);
    std::vector<std::vector<int32_t>> parts(nt);
#pragma omp parallel num_threads(nt)
    {
        const int t = omp_get_thread_num();
        const int64_t lo = range_lo(n, t, nt), hi = range_lo(n, t + 1, nt);
        alignas(64) uint8_t flag[kBlock + 8] = {0};
        for (int64_t b = lo; b < hi; b += kBlock) {          // update a block, then collect its few words
            const int64_t count = std::min(hi, b + kBlock) - b;
            select_block(g + b, r + b, count, tau, flag);
            for (int64_t j = 0; j < count; j += 8) {          // eight flags at a time: most are all zero
                uint64_t eight;
                std::memcpy(&eight, flag + j, 8);
                if (!eight) continue;
                for (int64_t k = j; k < std::min(count, j + 8); ++k)
                    if (flag[k])
                        parts[t].push_back(static_cast<int32_t>(static_cast<uint32_t>(b + k) |
                                                                (flag[k] == 2 ? 0x80000000u : 0u)));
            }
        }
    }
    concat(parts, alloc);
}

void threshold_decode(const int32_t* const* words, const int64_t* counts, int p, float* out, int64_t n, float tau) {
    sparse_sum(p, counts, [words, tau](int q, int64_t j) {
        const uint32_t word = static_cast<uint32_t>(words[q][j]);
        return std::pair<int64_t, float>(word & 0x7FFFFFFFu, (word >> 31) ? -tau : tau);
    }, out, n);
}

}  // namespace gct::cpu
