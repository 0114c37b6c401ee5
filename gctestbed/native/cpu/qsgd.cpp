// QSGD: per chunk the L2 norm (accumulated in double) and each element's sign and stochastically
// rounded level, drawn from the counter-based hash so the result does not depend on threads.
// A chunk is read once from memory: its norm pass leaves it in cache for the quantise pass.
#include <cmath>

#include "pack.h"

namespace gct::cpu {

namespace {
// Codes of elements [lo, hi) of x, which share one chunk norm, into c[0, hi - lo).
void quantise_stretch(const float* __restrict__ x, int64_t lo, int64_t hi, float norm, float levels, uint32_t key,
                      uint32_t* __restrict__ c) {
    const float nrm = std::fmax(norm, 1.17549435e-38f);
#pragma omp simd
    for (int64_t j = lo; j < hi; ++j) {
        const float scaled = std::fabs(x[j]) / nrm * levels;
        const bool finite = scaled <= 3.40282347e38f;     // false for NaN and Inf: level 0
        const float lower = std::floor(finite ? scaled : 0.0f);
        const float up = uniform24(key, static_cast<uint64_t>(j)) < scaled - lower ? 1.0f : 0.0f;
        const float level = finite ? (lower + up < levels ? lower + up : levels) : 0.0f;
        c[j - lo] = static_cast<uint32_t>(level) << 1 | (x[j] < 0.0f ? 1u : 0u);
    }
}
}  // namespace

void qsgd_encode(const float* x, int64_t n, int64_t d, int s, int bits, uint32_t key, int32_t* words, float* norms) {
    const int64_t chunks = (n + d - 1) / d;
    const float levels = static_cast<float>(s);
#pragma omp parallel for num_threads(threads_for(n)) schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
        const int64_t lo = c * d, hi = std::min(n, lo + d);
        double sum = 0.0;
#pragma omp simd reduction(+ : sum)
        for (int64_t i = lo; i < hi; ++i) sum += static_cast<double>(x[i]) * x[i];
        norms[c] = static_cast<float>(std::sqrt(sum));
    }
    auto codes = [x, norms, d, levels, key](int64_t lo, int64_t hi, uint32_t* __restrict__ c) {
        for (int64_t i = lo; i < hi;) {                       // one stretch per chunk: one norm
            const int64_t end = std::min(hi, (i / d + 1) * d);
            quantise_stretch(x, i, end, norms[i / d], levels, key, c + (i - lo));
            i = end;
        }
    };
    switch (bits) {
        case 2: pack_blocks<2>(n, words, codes); break;
        case 4: pack_blocks<4>(n, words, codes); break;
        default: pack_blocks<8>(n, words, codes); break;
    }
}

// Code c of a chunk with norm `norm` stands for ((c & 1 ? -1 : 1) * (c >> 1) * norm) / levels, in
// that order (the reference's). 2- and 4-bit codes go through a table per chunk and payload, the
// same arithmetic done once per code rather than once per element.
static float qsgd_value(uint32_t code, float norm, float levels) {
    return (code & 1u ? -1.0f : 1.0f) * static_cast<float>(code >> 1) * norm / levels;
}

template <int Bits>
static void qsgd_decode_table(const int32_t* const* words, const float* const* norms, int p, float* out, int64_t n,
                              int64_t d, int s) {
    const float levels = static_cast<float>(s);
    decode_table<Bits>(words, p, out, n, d, [norms, d, levels](int q, int64_t i, float* t) {
        const float norm = norms[q][i / d];
#if defined(__AVX512F__)
        // every code's value in one multiply and one divide: the scalar arithmetic, 16 lanes wide
        const __m512 signed_levels = Bits == 4 ? _mm512_setr_ps(0, -0.0f, 1, -1, 2, -2, 3, -3, 4, -4, 5, -5, 6, -6, 7, -7)
                                               : _mm512_setr_ps(0, -0.0f, 1, -1, 0, -0.0f, 1, -1, 0, -0.0f, 1, -1, 0, -0.0f, 1, -1);
        _mm512_store_ps(t, _mm512_div_ps(_mm512_mul_ps(signed_levels, _mm512_set1_ps(norm)), _mm512_set1_ps(levels)));
#else
        for (uint32_t c = 0; c < (1u << Bits); ++c) t[c] = qsgd_value(c, norm, levels);
#endif
    });
}

static void qsgd_decode_8(const int32_t* const* words, const float* const* norms, int p, float* out, int64_t n,
                          int64_t d, int s) {
    const float levels = static_cast<float>(s);
    decode_blocks(n, out, [&](int64_t lo, int64_t hi, float* __restrict__ acc) {
        alignas(64) uint32_t c[kBlock];
        for (int q = 0; q < p; ++q) {
            unpack_block<8>(words[q], lo, hi, c);
            const float* nq = norms[q];
            for (int64_t i = lo; i < hi;) {
                const int64_t end = std::min(hi, (i / d + 1) * d);
                const float norm = nq[i / d];
#pragma omp simd
                for (int64_t j = i; j < end; ++j) {
                    const float value = qsgd_value(c[j - lo], norm, levels);
                    acc[j - lo] = q == 0 ? value : acc[j - lo] + value;
                }
                i = end;
            }
        }
    });
}

void qsgd_decode(const int32_t* const* words, const float* const* norms, int p, float* out, int64_t n, int64_t d,
                 int s, int bits) {
    switch (bits) {
        case 2: qsgd_decode_table<2>(words, norms, p, out, n, d, s); break;
        case 4: qsgd_decode_table<4>(words, norms, p, out, n, d, s); break;
        default: qsgd_decode_8(words, norms, p, out, n, d, s); break;
    }
}

}  // namespace gct::cpu
