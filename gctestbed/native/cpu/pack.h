// Block-wise bit packing for the CPU kernels. A kernel computes the codes of a block of elements
// into a small local array (a contiguous, vectorisable loop that may also update a residual),
// and the block is packed with an OR reduction per word: each element is read once.
#pragma once
#include <algorithm>
#include <type_traits>

#include "common.h"

namespace gct::cpu {

template <int Bits>
inline uint32_t code_at(const int32_t* words, int64_t i) {
    constexpr int per = 32 / Bits;
    return (static_cast<uint32_t>(words[i / per]) >> code_shift<Bits>(static_cast<int>(i % per))) & ((1u << Bits) - 1);
}

// Packs codes(lo, hi, c) -- which writes the codes of elements [lo, hi) to c[0, hi - lo) --
// block by block into words, in MXNet's layout (ops.h, code_shift).
template <int Bits, class Codes>
void pack_blocks(int64_t n, int32_t* words, Codes codes) {
    constexpr int per = 32 / Bits;
    const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for num_threads(threads_for(n)) schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
        alignas(64) uint32_t c[kBlock];
        const int64_t lo = b * kBlock, count = std::min(n, lo + kBlock) - lo;
        codes(lo, lo + count, c);
        const int64_t nw = (count + per - 1) / per;
        for (int64_t i = count; i < nw * per; ++i) c[i] = 0;
        int32_t* out = words + lo / per;
        for (int64_t w = 0; w < nw; ++w) {
            uint32_t word = 0;
            const uint32_t* cw = c + w * per;
#pragma omp simd reduction(| : word)
            for (int j = 0; j < per; ++j) word |= cw[j] << code_shift<Bits>(j);
            out[w] = static_cast<int32_t>(word);
        }
    }
}

// Unpacks the codes of elements [lo, hi) of a packed array into c[0, hi - lo); lo is a multiple of kBlock.
template <int Bits>
inline void unpack_block(const int32_t* words, int64_t lo, int64_t hi, uint32_t* __restrict__ c) {
    constexpr int per = 32 / Bits;
    const int32_t* in = words + lo / per;
    const int64_t nw = (hi - lo + per - 1) / per;
    for (int64_t w = 0; w < nw; ++w) {
        const uint32_t word = static_cast<uint32_t>(in[w]);
        uint32_t* cw = c + w * per;
#pragma omp simd
        for (int j = 0; j < per; ++j) cw[j] = (word >> code_shift<Bits>(j)) & ((1u << Bits) - 1);
    }
}

// fn(std::integral_constant<int, P>) with P = p for p of 1 to 8 (loops over payloads then unroll),
// P = 0 for more (fn takes the count at run time).
template <class Fn>
auto for_payloads(int p, Fn fn) {
    switch (p) {
        case 1: return fn(std::integral_constant<int, 1>());
        case 2: return fn(std::integral_constant<int, 2>());
        case 3: return fn(std::integral_constant<int, 3>());
        case 4: return fn(std::integral_constant<int, 4>());
        case 5: return fn(std::integral_constant<int, 5>());
        case 6: return fn(std::integral_constant<int, 6>());
        case 7: return fn(std::integral_constant<int, 7>());
        case 8: return fn(std::integral_constant<int, 8>());
        default: return fn(std::integral_constant<int, 0>());
    }
}

#if defined(__AVX512F__)
// The codes of the 16 elements [i, i + 16) of a payload, one per 32-bit lane, shifted down to bit
// 0; a lane may keep bits of later codes above its own (index a table that repeats every 2^Bits
// entries, or mask). i is a multiple of 16 and i + 16 <= the payload's element count.
template <int Bits>
inline __m512i codes16(const int32_t* words, int64_t i) {
    if constexpr (Bits == 8) {
        return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(words) + i / 16));
    } else if constexpr (Bits == 4) {            // two words of 8 codes: lanes 0-7 from the first
        const __m512i pair = _mm512_castsi128_si512(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(words + i / 8)));
        const __m512i which = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
        const __m512i shifts = _mm512_setr_epi32(4, 0, 12, 8, 20, 16, 28, 24, 4, 0, 12, 8, 20, 16, 28, 24);
        return _mm512_srlv_epi32(_mm512_permutexvar_epi32(which, pair), shifts);
    } else if constexpr (Bits == 2) {            // one word of 16 codes
        const __m512i shifts = _mm512_setr_epi32(6, 4, 2, 0, 14, 12, 10, 8, 22, 20, 18, 16, 30, 28, 26, 24);
        return _mm512_srlv_epi32(_mm512_set1_epi32(words[i / 16]), shifts);
    } else {                                     // half a word of 32 codes
        const __m512i low = _mm512_setr_epi32(7, 6, 5, 4, 3, 2, 1, 0, 15, 14, 13, 12, 11, 10, 9, 8);
        const __m512i high = _mm512_setr_epi32(23, 22, 21, 20, 19, 18, 17, 16, 31, 30, 29, 28, 27, 26, 25, 24);
        return _mm512_srlv_epi32(_mm512_set1_epi32(words[i / 32]), (i & 16) ? high : low);
    }
}
#endif

// out[i] = sum over payloads q, in order, of a value looked up by the code of element i:
// table(q, i, t) writes the values of codes 0 .. 2^Bits - 1 of payload q into t, and the table
// must hold for the ``span`` elements of i's stretch ([i / span * span, ...)). Codes of at most 4
// bits: with AVX-512 a table of 16 lanes (the values repeated) turns 16 codes into values with one
// permute, the p payloads are summed in a register, and each 16 sums are streamed out.
template <int Bits, class Table>
void decode_table(const int32_t* const* words, int p, float* out, int64_t n, int64_t span, Table table) {
    static_assert(Bits <= 4, "decode_table looks codes up in a table of 16 entries");
    constexpr int kCodes = 1 << Bits;
    const size_t stride = 16 * static_cast<size_t>(p) + 16;          // a thread's tables, 64-byte aligned
    std::vector<float> scratch(stride * omp_get_max_threads());
    for_blocks(n, [&](int64_t lo, int64_t hi) {
        float* mine = scratch.data() + stride * omp_get_thread_num();
        float* t = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(mine) + 63) & ~uintptr_t(63));
        auto one = [&](int64_t j) {                 // element j, as the reference sums it
            float sum = t[code_at<Bits>(words[0], j)];
            for (int q = 1; q < p; ++q) sum += t[16 * q + code_at<Bits>(words[q], j)];
            out[j] = sum;
        };
        for (int64_t s = lo; s < hi;) {
            const int64_t e = std::min(hi, (s / span + 1) * span);      // one table per payload here
            for (int q = 0; q < p; ++q) {
                table(q, s, t + 16 * q);
                for (int c = kCodes; c < 16; ++c) t[16 * q + c] = t[16 * q + c % kCodes];
            }
            int64_t j = s;
#if defined(__AVX512F__)
            for (; j < e && j % 16; ++j) one(j);
            j = for_payloads(p, [&](auto fixed) {          // the payload loop unrolled for up to 8
                constexpr int P = decltype(fixed)::value;
                const int count = P ? P : p;
                int64_t i = j;
                for (; i + 16 <= e; i += 16) {
                    __m512 sum = _mm512_permutexvar_ps(codes16<Bits>(words[0], i), _mm512_load_ps(t));
                    for (int q = 1; q < count; ++q)
                        sum = _mm512_add_ps(sum, _mm512_permutexvar_ps(codes16<Bits>(words[q], i), _mm512_load_ps(t + 16 * q)));
                    store16(out + i, sum);
                }
                return i;
            });
#endif
            for (; j < e; ++j) one(j);
            s = e;
        }
    });
}

}  // namespace gct::cpu
