// MXNet's 2-bit and 1-bit quantisers, each fused with its residual update: the gradient and the
// residual are read once, the residual written once, the codes packed on the way.
#include "pack.h"

namespace gct::cpu {

void twobit_encode(const float* g, float* r, int32_t* words, int64_t n, float tau) {
    pack_blocks<2>(n, words, [g, r, tau](int64_t lo, int64_t hi, uint32_t* __restrict__ c) {
        const float t = tau;
        const float* __restrict__ gp = g;
        float* __restrict__ rp = r;
#pragma omp simd
        for (int64_t i = lo; i < hi; ++i) {
            const float a = gp[i] + rp[i];
            const bool up = a >= t, down = a <= -t;
            float sent = up ? t : 0.0f;
            sent = down ? -t : sent;
            rp[i] = a - sent;
            uint32_t code = up ? 3u : 0u;
            c[i - lo] = down ? 2u : code;
        }
    });
}

void twobit_decode(const int32_t* const* words, int p, float* out, int64_t n, float tau) {
    decode_sum<2>(words, p, out, n, [tau](const uint32_t* __restrict__ c, float* __restrict__ v, int64_t count) {
        const float t = tau;
#pragma omp simd
        for (int64_t j = 0; j < count; ++j) {
            const float up = c[j] == 3u ? t : 0.0f;
            v[j] = c[j] == 2u ? -t : up;
        }
    });
}

void onebit_encode(const float* g, float* r, int32_t* words, int64_t n, float threshold, float scale) {
    pack_blocks<1>(n, words, [g, r, threshold, scale](int64_t lo, int64_t hi, uint32_t* __restrict__ c) {
        const float th = threshold, s = scale;
        const float* __restrict__ gp = g;
        float* __restrict__ rp = r;
#pragma omp simd
        for (int64_t i = lo; i < hi; ++i) {
            const float a = gp[i] + rp[i];
            const bool bit = a > th;
            rp[i] = a - (bit ? s : -s);
            c[i - lo] = bit ? 1u : 0u;
        }
    });
}

void onebit_decode(const int32_t* const* words, int p, float* out, int64_t n, float scale) {
    decode_sum<1>(words, p, out, n, [scale](const uint32_t* __restrict__ c, float* __restrict__ v, int64_t count) {
        const float s = scale;
#pragma omp simd
        for (int64_t j = 0; j < count; ++j) v[j] = c[j] ? s : -s;
    });
}

}  // namespace gct::cpu
