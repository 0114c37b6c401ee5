// Block-wise bit packing for the CPU kernels. A kernel computes the codes of a block of elements
// into a small local array (a contiguous, vectorisable loop that may also update a residual),
// and the block is packed with an OR reduction per word: each element is read once.
#pragma once
#include <algorithm>

#include "common.h"

namespace gct::cpu {

// Elements per block: a multiple of every code width's per-word count, small enough for L1.
constexpr int64_t kBlock = 1024;

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

// out[i] = sum over payloads q, in order, of values(codes of payload q)[i]. values(c, v, count)
// turns count codes into floats.
template <int Bits, class Values>
void decode_sum(const int32_t* const* words, int p, float* out, int64_t n, Values values) {
    const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for num_threads(threads_for(n)) schedule(static)
    for (int64_t b = 0; b < blocks; ++b) {
        alignas(64) uint32_t c[kBlock];
        alignas(64) float v[kBlock];
        const int64_t lo = b * kBlock, hi = std::min(n, lo + kBlock), count = hi - lo;
        float* __restrict__ dst = out + lo;
        unpack_block<Bits>(words[0], lo, hi, c);
        values(c, dst, count);
        for (int q = 1; q < p; ++q) {
            unpack_block<Bits>(words[q], lo, hi, c);
            values(c, v, count);
#pragma omp simd
            for (int64_t j = 0; j < count; ++j) dst[j] += v[j];
        }
    }
}

}  // namespace gct::cpu
