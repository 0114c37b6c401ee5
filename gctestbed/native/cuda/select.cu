// Selection for DGC on the GPU: the momentum-corrected accumulation, and the ordered compaction
// of |v| >= threshold (masks and per-block counts, a scan, ordered writes). The sampled threshold
// and the exact trim run as ATen ops on the device (native/bindings.cpp).
#include "common.cuh"

namespace gct::cuda {

namespace {

__global__ void select_mark(const float* __restrict__ v, int64_t n, float threshold, uint32_t* __restrict__ mask,
                            int32_t* __restrict__ counts) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x, end = round_up(n, 32);
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < end; i += stride)
        record_selection(i < n && fabsf(v[i]) >= threshold, i, mask, counts);
}

__global__ void select_write(int64_t n, const uint32_t* __restrict__ mask, const int64_t* __restrict__ offsets,
                             int64_t* __restrict__ out) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
        if (mask[i / 32] & (1u << (31 - i % 32))) out[selected_rank(i, mask, offsets)] = i;
}

__global__ void accumulate_kernel(float* __restrict__ u, float* __restrict__ v, const float* __restrict__ g, int64_t n,
                                  float momentum) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float ui = __fadd_rn(__fmul_rn(u[i], momentum), g[i]);
        u[i] = ui;
        v[i] = v[i] + ui;
    }
}

}  // namespace

void select_above(const float* v, int64_t n, float threshold, const Alloc<int64_t>& alloc, void* stream) {
    cudaStream_t s = as_stream(stream);
    if (!n) { alloc(0); return; }
    Scratch scratch(n, s);
    select_mark<<<blocks_for(n), kThreads, 0, s>>>(v, n, threshold, scratch.mask, scratch.counts);
    check(cudaGetLastError(), "select_mark");
    const int64_t total = scan_counts(scratch.counts, scratch.offsets, scratch.blocks, s);
    int64_t* out = alloc(total);
    if (total) select_write<<<blocks_for(n), kThreads, 0, s>>>(n, scratch.mask, scratch.offsets, out);
    check(cudaGetLastError(), "select_write");
}

void dgc_accumulate(float* u, float* v, const float* g, int64_t n, float momentum, void* stream) {
    if (n) accumulate_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(u, v, g, n, momentum);
    check(cudaGetLastError(), "dgc_accumulate");
}

}  // namespace gct::cuda
