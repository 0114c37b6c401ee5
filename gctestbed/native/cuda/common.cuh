// Helpers shared by the CUDA kernels: launch shapes, warp-level bit packing, payload lists passed
// by value, and the two-pass ordered compaction (per-block counts, a scan, ordered writes).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "../ops.h"

namespace gct::cuda {

constexpr int kThreads = 256;
constexpr int kMaxPayloads = 32;   // payload pointers per launch; more are added in further launches

inline cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

inline void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

inline int blocks_for(int64_t n, int threads = kThreads) {
    int64_t b = (n + threads - 1) / threads;
    return static_cast<int>(b < 1 ? 1 : (b > 65535 * 8 ? 65535 * 8 : b));
}

__host__ __device__ inline int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// OR of `value` over the group of 32/Bits consecutive lanes that share one word; the group's
// first lane gets the word. Each lane contributes its code shifted to its place (ops.h, code_shift).
template <int Bits>
__device__ inline uint32_t pack_lanes(uint32_t code) {
    constexpr int per = 32 / Bits;
    const int lane = threadIdx.x & 31;
    uint32_t word = code << code_shift<Bits>(lane % per);
#pragma unroll
    for (int offset = per / 2; offset > 0; offset /= 2) word |= __shfl_xor_sync(0xFFFFFFFFu, word, offset);
    return word;
}

// A warp's 1-bit codes as a payload word: lane j's bit at code_shift<1>(j) (a ballot has it at bit j).
__device__ inline uint32_t ballot_word(bool bit) {
    return __byte_perm(__brev(__ballot_sync(0xFFFFFFFFu, bit)), 0, 0x0123);
}

template <int Bits>
__device__ inline uint32_t code_at(const int32_t* words, int64_t i) {
    constexpr int per = 32 / Bits;
    return (static_cast<uint32_t>(words[i / per]) >> code_shift<Bits>(static_cast<int>(i % per))) & ((1u << Bits) - 1);
}

template <class T>
struct List {
    T item[kMaxPayloads];
    int64_t count[kMaxPayloads];
    float scale[kMaxPayloads];
    int size;
};

// Element i of a compaction of n elements, with selection mask words (bit 31 - j for element
// 32w + j) and per-block counts: blocks of kCompactBlock elements.
constexpr int kCompactBlock = 1024;

// Exclusive scan of per-block counts on the host (a few thousand blocks), returning the total;
// offsets go back to the device.
inline int64_t scan_counts(const int32_t* counts_dev, int64_t* offsets_dev, int64_t blocks, cudaStream_t stream) {
    std::vector<int32_t> counts(blocks);
    std::vector<int64_t> offsets(blocks);
    check(cudaMemcpyAsync(counts.data(), counts_dev, blocks * sizeof(int32_t), cudaMemcpyDeviceToHost, stream), "copy counts");
    check(cudaStreamSynchronize(stream), "count selection");
    int64_t total = 0;
    for (int64_t b = 0; b < blocks; ++b) { offsets[b] = total; total += counts[b]; }
    check(cudaMemcpyAsync(offsets_dev, offsets.data(), blocks * sizeof(int64_t), cudaMemcpyHostToDevice, stream), "copy offsets");
    check(cudaStreamSynchronize(stream), "copy offsets");
    return total;
}

// Scratch for a compaction: selection masks, per-block counts and offsets, freed with the stream.
struct Scratch {
    uint32_t* mask = nullptr;
    uint32_t* aux = nullptr;     // a second mask (e.g. signs)
    int32_t* counts = nullptr;
    int64_t* offsets = nullptr;
    int64_t blocks = 0;
    cudaStream_t stream;
    Scratch(int64_t n, cudaStream_t s) : blocks((n + kCompactBlock - 1) / kCompactBlock), stream(s) {
        const int64_t words = (n + 31) / 32 + 1;
        check(cudaMallocAsync(reinterpret_cast<void**>(&mask), words * 4, s), "scratch");
        check(cudaMallocAsync(reinterpret_cast<void**>(&aux), words * 4, s), "scratch");
        check(cudaMallocAsync(reinterpret_cast<void**>(&counts), (blocks + 1) * 4, s), "scratch");
        check(cudaMallocAsync(reinterpret_cast<void**>(&offsets), (blocks + 1) * 8, s), "scratch");
        check(cudaMemsetAsync(counts, 0, (blocks + 1) * 4, s), "scratch");
    }
    ~Scratch() {
        cudaFreeAsync(mask, stream);
        cudaFreeAsync(aux, stream);
        cudaFreeAsync(counts, stream);
        cudaFreeAsync(offsets, stream);
    }
};

// Records a warp's selection bits: mask word for 32 consecutive elements, and adds its count to
// the element block's counter. Every lane of the warp must call it (i rounded up to 32).
__device__ inline void record_selection(bool sel, int64_t i, uint32_t* mask, int32_t* counts) {
    const uint32_t ballot = __ballot_sync(0xFFFFFFFFu, sel);
    if ((threadIdx.x & 31) == 0) {
        mask[i / 32] = __brev(ballot);   // element 32w + j at bit 31 - j
        if (ballot) atomicAdd(&counts[i / kCompactBlock], __popc(ballot));
    }
}

// Position of selected element i among the selected ones: its block's offset plus the selected
// elements before it in its block (popcounts of the block's mask words).
__device__ inline int64_t selected_rank(int64_t i, const uint32_t* mask, const int64_t* offsets) {
    const int64_t block = i / kCompactBlock, first_word = block * (kCompactBlock / 32), word = i / 32;
    int64_t rank = offsets[block];
    for (int64_t w = first_word; w < word; ++w) rank += __popc(mask[w]);
    const int j = static_cast<int>(i % 32);
    return rank + (j ? __popc(mask[word] >> (32 - j)) : 0);
}

}  // namespace gct::cuda
