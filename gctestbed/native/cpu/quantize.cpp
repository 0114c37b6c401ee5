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
    decode_table<2>(words, p, out, n, n, [tau](int, int64_t, float* t) {    // 00, 01 -> 0; 10 -> -tau; 11 -> +tau
        t[0] = 0.0f, t[1] = 0.0f, t[2] = -tau, t[3] = tau;
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
#if defined(__AVX512F__)
    // each payload's 16 bits of a group are a mask choosing +scale or -scale: a blend and an add per
    // payload; mask bit k is element k ^ 7 (a byte's first code is its top bit), put right once
    for_blocks(n, [&](int64_t lo, int64_t hi) {
        const __m512 up = _mm512_set1_ps(scale), down = _mm512_set1_ps(-scale);
        const __m512i reverse = _mm512_setr_epi32(7, 6, 5, 4, 3, 2, 1, 0, 15, 14, 13, 12, 11, 10, 9, 8);
        int64_t j = for_payloads(p, [&](auto fixed) {
            constexpr int P = decltype(fixed)::value;
            const int count = P ? P : p;
            int64_t i = lo;
            for (; i + 16 <= hi; i += 16) {
                const int half = 16 * static_cast<int>((i / 16) & 1);
                __m512 sum = _mm512_mask_blend_ps(static_cast<__mmask16>(static_cast<uint32_t>(words[0][i / 32]) >> half), down, up);
                for (int q = 1; q < count; ++q)
                    sum = _mm512_add_ps(sum, _mm512_mask_blend_ps(
                        static_cast<__mmask16>(static_cast<uint32_t>(words[q][i / 32]) >> half), down, up));
                store16(out + i, _mm512_permutexvar_ps(reverse, sum));
            }
            return i;
        });
        for (; j < hi; ++j) {
            float sum = code_at<1>(words[0], j) ? scale : -scale;
            for (int q = 1; q < p; ++q) sum += code_at<1>(words[q], j) ? scale : -scale;
            out[j] = sum;
        }
    });
#else
    decode_table<1>(words, p, out, n, n, [scale](int, int64_t, float* t) { t[0] = -scale, t[1] = scale; });
#endif
}

}  // namespace gct::cpu
