// Sign bits: pack (x >= 0 is 1, so NaN packs as 0, i.e. -1), unpack to +-scale, majority vote.
#include "pack.h"

namespace gct::cpu {

void sign_pack(const float* x, int32_t* words, int64_t n) {
    pack_blocks<1>(n, words, [x](int64_t lo, int64_t hi, uint32_t* __restrict__ c) {
        const float* __restrict__ xp = x;
#pragma omp simd
        for (int64_t i = lo; i < hi; ++i) c[i - lo] = xp[i] >= 0.0f ? 1u : 0u;
    });
}

void sign_unpack(const int32_t* words, float* out, int64_t n, float scale) {
    const int32_t* one[1] = {words};
    decode_sum<1>(one, 1, out, n, [scale](const uint32_t* __restrict__ c, float* __restrict__ v, int64_t count) {
        const float s = scale;
#pragma omp simd
        for (int64_t j = 0; j < count; ++j) v[j] = c[j] ? s : -s;
    });
}

void sign_vote(const int32_t* const* words, int p, float* out, int64_t n, float scale) {
    const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for num_threads(threads_for(n)) schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
        alignas(64) int32_t ones[kBlock] = {0};
        const int64_t lo = b * kBlock, hi = std::min(n, lo + kBlock), count = hi - lo;
        const int64_t nw = (count + 31) / 32;
        for (int q = 0; q < p; ++q) {
            const int32_t* in = words[q] + lo / 32;
            for (int64_t w = 0; w < nw; ++w) {
                const uint32_t word = static_cast<uint32_t>(in[w]);
                int32_t* ow = ones + w * 32;
#pragma omp simd
                for (int j = 0; j < 32; ++j) ow[j] += static_cast<int32_t>((word >> code_shift<1>(j)) & 1u);
            }
        }
        const float s = scale;
        float* __restrict__ dst = out + lo;
#pragma omp simd
        for (int64_t j = 0; j < count; ++j) {
            const int32_t votes = 2 * ones[j] - p;
            const float up = votes > 0 ? s : 0.0f;
            dst[j] = votes < 0 ? -s : up;
        }
    }
}

}  // namespace gct::cpu
