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

template <int Bits>
static void qsgd_decode_bits(const int32_t* const* words, const float* const* norms, int p, float* out, int64_t n,
                             int64_t d, int s) {
    const float levels = static_cast<float>(s);
    const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for num_threads(threads_for(n)) schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
        alignas(64) uint32_t c[kBlock];
        const int64_t lo = b * kBlock, hi = std::min(n, lo + kBlock);
        float* __restrict__ dst = out + lo;
        for (int q = 0; q < p; ++q) {
            unpack_block<Bits>(words[q], lo, hi, c);
            const float* nq = norms[q];
            for (int64_t i = lo; i < hi;) {
                const int64_t end = std::min(hi, (i / d + 1) * d);
                const float norm = nq[i / d];
#pragma omp simd
                for (int64_t j = i; j < end; ++j) {
                    const uint32_t code = c[j - lo];
                    const float value = (code & 1u ? -1.0f : 1.0f) * static_cast<float>(code >> 1) * norm / levels;
                    dst[j - lo] = q == 0 ? value : dst[j - lo] + value;
                }
                i = end;
            }
        }
    }
}

void qsgd_decode(const int32_t* const* words, const float* const* norms, int p, float* out, int64_t n, int64_t d,
                 int s, int bits) {
    switch (bits) {
        case 2: qsgd_decode_bits<2>(words, norms, p, out, n, d, s); break;
        case 4: qsgd_decode_bits<4>(words, norms, p, out, n, d, s); break;
        default: qsgd_decode_bits<8>(words, norms, p, out, n, d, s); break;
    }
}

}  // namespace gct::cpu
