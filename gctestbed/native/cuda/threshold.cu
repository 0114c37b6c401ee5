// Strom's threshold method on the GPU: pass 1 updates the residual and records which elements
// cross +-tau (and their signs) as bit masks with per-block counts; after a scan of the counts,
// pass 2 writes the sign|index words in ascending order. Decoding scatters +-tau per payload.
#include "common.cuh"

namespace gct::cuda {

namespace {

__global__ void threshold_mark(const float* __restrict__ g, float* __restrict__ r, int64_t n, float tau,
                               uint32_t* __restrict__ mask, uint32_t* __restrict__ neg_mask, int32_t* __restrict__ counts) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x, end = round_up(n, 32);
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < end; i += stride) {
        bool sel = false, neg = false;
        if (i < n) {
            const float a = g[i] + r[i];
            sel = fabsf(a) >= tau;
            neg = a < 0.0f;
            r[i] = a - (sel ? (neg ? -tau : tau) : 0.0f);
        }
        const uint32_t negs = __brev(__ballot_sync(0xFFFFFFFFu, neg));
        if ((threadIdx.x & 31) == 0) neg_mask[i / 32] = negs;
        record_selection(sel, i, mask, counts);
    }
}

__global__ void threshold_write(int64_t n, const uint32_t* __restrict__ mask, const uint32_t* __restrict__ neg_mask,
                                const int64_t* __restrict__ offsets, int32_t* __restrict__ out) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        const uint32_t bit = 1u << (31 - i % 32);
        if (mask[i / 32] & bit)
            out[selected_rank(i, mask, offsets)] =
                static_cast<int32_t>(static_cast<uint32_t>(i) | ((neg_mask[i / 32] & bit) ? 0x80000000u : 0u));
    }
}

__global__ void threshold_scatter(const int32_t* __restrict__ words, int64_t m, float* __restrict__ out, float tau) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < m; j += stride) {
        const uint32_t w = static_cast<uint32_t>(words[j]);
        out[w & 0x7FFFFFFFu] += (w >> 31) ? -tau : tau;
    }
}

}  // namespace

void threshold_encode(const float* g, float* r, int64_t n, float tau, const Alloc<int32_t>& alloc, void* stream) {
    cudaStream_t s = as_stream(stream);
    if (!n) { alloc(0); return; }
    Scratch scratch(n, s);
    threshold_mark<<<blocks_for(n), kThreads, 0, s>>>(g, r, n, tau, scratch.mask, scratch.aux, scratch.counts);
    check(cudaGetLastError(), "threshold_mark");
    const int64_t total = scan_counts(scratch.counts, scratch.offsets, scratch.blocks, s);
    int32_t* out = alloc(total);
    if (total) threshold_write<<<blocks_for(n), kThreads, 0, s>>>(n, scratch.mask, scratch.aux, scratch.offsets, out);
    check(cudaGetLastError(), "threshold_write");
}

void threshold_decode(const int32_t* const* words, const int64_t* counts, int p, float* out, int64_t n, float tau,
                      void* stream) {
    cudaStream_t s = as_stream(stream);
    check(cudaMemsetAsync(out, 0, n * sizeof(float), s), "threshold_decode");
    for (int q = 0; q < p; ++q)   // one payload at a time: unique indices within it, rank order across
        if (counts[q]) threshold_scatter<<<blocks_for(counts[q]), kThreads, 0, s>>>(words[q], counts[q], out, tau);
    check(cudaGetLastError(), "threshold_decode");
}

}  // namespace gct::cuda
