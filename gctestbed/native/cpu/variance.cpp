// Variance-based compression: per element the variance estimate from micro-batch squares, the
// accumulations r and v, the send criterion, and v's reset or decay, in one pass; then the 4-bit
// codes of the (few) selected elements relative to the largest selected |r|.
#include <array>
#include <cmath>

#include "pack.h"
#include "sparse.h"

namespace gct::cpu {

namespace {
constexpr float kPow2[8] = {1.0f, 0.5f, 0.25f, 0.125f, 0.0625f, 0.03125f, 0.015625f, 0.0078125f};   // 2^-e, exact

// Exponent e in 0..7 with |x| ~ scale * 2^-e: the number of thresholds 2^(k+1/2) <= scale/|x|.
inline uint32_t exponent_of(float ratio) {
    static const float bounds[7] = {1.41421356f, 2.82842712f, 5.65685425f, 11.3137085f,
                                    22.627417f, 45.254834f, 90.50966799f};
    if (std::isnan(ratio)) return 7;
    uint32_t e = 0;
    for (float b : bounds) e += ratio >= b;
    return e;
}


constexpr uint32_t kNone = 0xFFFFFFFFu;   // not sent (indices are below 2^31)

// Per element: the variance of the mean gradient from the micro-batch squares, r += g, v += var,
// the send criterion, v reset (sent) or decayed; flag = the index where sent, else kNone.
void criterion_block(const float* __restrict__ g, const float* __restrict__ squares, float* __restrict__ r,
                     float* __restrict__ v, int64_t count, const VarianceParams& p, uint32_t first,
                     uint32_t* __restrict__ flag) {
    const float world = static_cast<float>(p.world), mm = static_cast<float>(p.m * p.m), m = static_cast<float>(p.m);
    const float m1 = static_cast<float>(p.m - 1), w2 = static_cast<float>(p.world * p.world);
    const float alpha = p.alpha, zeta = p.zeta, tau = p.tau;
    const bool hybrid = p.hybrid;
#pragma omp simd
    for (int64_t j = 0; j < count; ++j) {
        const float raw = g[j] * world;
        float var = squares[j] * mm - raw * m * raw;
        var = var < 0.0f ? 0.0f : var;
        var = var / m1 / m / w2;
        const float ri = r[j] + g[j], vi = v[j] + var;
        r[j] = ri;
        const bool send = vi * alpha < ri * ri && ri != 0.0f && (!hybrid || std::fabs(ri) >= tau);   // hybrid: both
        v[j] = send ? 0.0f : vi * zeta;
        flag[j] = send ? first + static_cast<uint32_t>(j) : kNone;
    }
}
}  // namespace

float variance_encode(const float* g, const float* squares, float* r, float* v, int64_t n, const VarianceParams& p,
                      const Alloc<int32_t>& idx_alloc, const Alloc<int32_t>& codes_alloc) {
    const int nt = threads_for(n);
    std::vector<std::vector<int32_t>> parts(nt);
#pragma omp parallel num_threads(nt)
    {
        const int t = omp_get_thread_num();
        const int64_t lo = range_lo(n, t, nt), hi = range_lo(n, t + 1, nt);
        alignas(64) uint32_t flag[kBlock];
        for (int64_t b = lo; b < hi; b += kBlock) {          // update a block, then collect what it sends
            const int64_t count = std::min(hi, b + kBlock) - b;
            criterion_block(g + b, squares + b, r + b, v + b, count, p, static_cast<uint32_t>(b), flag);
            for (int64_t j = 0; j < count; ++j)
                if (flag[j] != kNone) parts[t].push_back(static_cast<int32_t>(flag[j]));
        }
    }
    int64_t count = 0;
    int32_t* idx = nullptr;
    concat<int32_t>(parts, [&](int64_t total) { count = total; return idx = idx_alloc(total); });
    float scale = 0.0f;
    for (int64_t j = 0; j < count; ++j) scale = std::fmax(scale, std::fabs(r[idx[j]]));
    int32_t* words = codes_alloc(words_for(count, 4));
    pack_blocks<4>(count, words, [r, idx, scale](int64_t lo, int64_t hi, uint32_t* __restrict__ c) {
        for (int64_t j = lo; j < hi; ++j) {
            const float x = r[idx[j]];
            const uint32_t e = exponent_of(scale / std::fmax(std::fabs(x), 1.17549435e-38f));
            const bool neg = x < 0.0f;
            r[idx[j]] = x - ((neg ? -1.0f : 1.0f) * scale) * kPow2[e];
            c[j - lo] = (neg ? 8u : 0u) | e;
        }
    });
    return scale;
}

void variance_decode(const int32_t* const* idx, const int32_t* const* codes, const float* scales,
                     const int64_t* counts, int p, float* out, int64_t n) {
    std::vector<std::array<float, 16>> values(p);         // what each payload's 16 codes stand for
    for (int q = 0; q < p; ++q)
        for (uint32_t c = 0; c < 16; ++c) values[q][c] = ((c & 8u) ? -scales[q] : scales[q]) * kPow2[c & 7u];
    sparse_sum(p, counts, [idx, codes, &values](int q, int64_t j) {
        return std::pair<int64_t, float>(idx[q][j], values[q][code_at<4>(codes[q], j)]);
    }, out, n);
}

}  // namespace gct::cpu
