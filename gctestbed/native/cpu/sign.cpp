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

// Bits to +-scale: MXNet's 1-bit decoding of a single payload.
void sign_unpack(const int32_t* words, float* out, int64_t n, float scale) {
    const int32_t* one[1] = {words};
    onebit_decode(one, 1, out, n, scale);
}

namespace {
#if defined(__AVX512F__)
// Bit-sliced counting: planes[k] holds bit k of each element's count of set bits so far, 512
// elements to a register (bit b of 32-bit lane w: element 32 w + b's code); adding a payload's
// bits is a ripple of ANDs and XORs over the planes.
inline void add_bits(__m512i* planes, int m, __m512i carry) {
    for (int k = 0; k < m; ++k) {
        const __m512i t = _mm512_and_si512(planes[k], carry);
        planes[k] = _mm512_xor_si512(planes[k], carry);
        carry = t;
    }
}

// Bits set where the count held in planes (m of them, bit 0 first) exceeds the constant K.
inline __m512i count_above(const __m512i* planes, int m, int K) {
    __m512i above = _mm512_setzero_si512(), equal = _mm512_set1_epi32(-1);
    for (int k = m - 1; k >= 0; --k) {
        if ((K >> k) & 1) {
            equal = _mm512_and_si512(equal, planes[k]);
        } else {
            above = _mm512_or_si512(above, _mm512_and_si512(equal, planes[k]));
            equal = _mm512_andnot_si512(planes[k], equal);
        }
    }
    return above;
}
#endif
}  // namespace

// One element's vote, as the reference takes it.
inline float vote_of(const int32_t* const* words, int p, int64_t j, float scale) {
    int32_t ones = 0;
    for (int q = 0; q < p; ++q) ones += static_cast<int32_t>(code_at<1>(words[q], j));
    const int32_t votes = 2 * ones - p;
    return votes > 0 ? scale : votes < 0 ? -scale : 0.0f;
}

#if defined(__AVX512F__)
// The votes of [j, hi) from the 512-element stretches on: M planes of counts (p < 2^M) in
// registers; each 16 results come from two masked moves, a mask's bit k being element k ^ 7 of its
// 16 (the first code of a byte is its top bit), which one permute puts right. Returns where it stopped.
template <int M>
int64_t vote_sliced(const int32_t* const* words, int p, float* out, int64_t j, int64_t hi, float scale) {
    const __m512 up = _mm512_set1_ps(scale), down = _mm512_set1_ps(-scale);
    const __m512i reverse = _mm512_setr_epi32(7, 6, 5, 4, 3, 2, 1, 0, 15, 14, 13, 12, 11, 10, 9, 8);
    alignas(64) uint32_t above[16], below[16];
    for (; j + 512 <= hi; j += 512) {
        __m512i planes[M];
        for (int k = 0; k < M; ++k) planes[k] = _mm512_setzero_si512();
        for (int q = 0; q < p; ++q) add_bits(planes, M, _mm512_loadu_si512(words[q] + j / 32));
        _mm512_store_si512(above, count_above(planes, M, p / 2));                          // 2 ones > p
        _mm512_store_si512(below, _mm512_andnot_si512(count_above(planes, M, (p + 1) / 2 - 1),
                                                      _mm512_set1_epi32(-1)));             // 2 ones < p
        for (int g = 0; g < 32; ++g) {
            const __mmask16 a = static_cast<__mmask16>(above[g / 2] >> (16 * (g % 2)));
            const __mmask16 b = static_cast<__mmask16>(below[g / 2] >> (16 * (g % 2)));
            const __m512 v = _mm512_mask_mov_ps(_mm512_maskz_mov_ps(a, up), b, down);
            store16(out + j + 16 * g, _mm512_permutexvar_ps(reverse, v));
        }
    }
    return j;
}
#endif

// +scale where more payloads have the bit set than not, -scale where fewer, 0 on a tie. With
// AVX-512 (and fewer than 256 payloads) the counts are bit-sliced, 512 elements at a time.
void sign_vote(const int32_t* const* words, int p, float* out, int64_t n, float scale) {
    for_blocks(n, [&](int64_t lo, int64_t hi) {
        int64_t j = lo;
#if defined(__AVX512F__)
        switch (p < 2 ? 1 : p < 4 ? 2 : p < 8 ? 3 : p < 16 ? 4 : p < 32 ? 5 : p < 64 ? 6 : p < 128 ? 7 : p < 256 ? 8 : 0) {
            case 1: j = vote_sliced<1>(words, p, out, j, hi, scale); break;
            case 2: j = vote_sliced<2>(words, p, out, j, hi, scale); break;
            case 3: j = vote_sliced<3>(words, p, out, j, hi, scale); break;
            case 4: j = vote_sliced<4>(words, p, out, j, hi, scale); break;
            case 5: j = vote_sliced<5>(words, p, out, j, hi, scale); break;
            case 6: j = vote_sliced<6>(words, p, out, j, hi, scale); break;
            case 7: j = vote_sliced<7>(words, p, out, j, hi, scale); break;
            case 8: j = vote_sliced<8>(words, p, out, j, hi, scale); break;
            default: break;
        }
#endif
        for (; j < hi; ++j) out[j] = vote_of(words, p, j, scale);
    });
}

}  // namespace gct::cpu
