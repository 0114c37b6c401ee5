// Variance-based compression on the GPU: pass 1 updates r and v and marks what is sent; after a
// scan the indices are written in order; the scale is the largest sent |r| (atomicMax on its
// bits: non-negative floats order as their bit patterns); then each sent element gets its 4-bit
// code, packed across lanes, and keeps its quantisation error in r.
#include <cstring>

#include "common.cuh"

namespace gct::cuda {

namespace {

__device__ inline uint32_t exponent_of(float ratio) {
    const float bounds[7] = {1.41421356f, 2.82842712f, 5.65685425f, 11.3137085f, 22.627417f, 45.254834f, 90.50966799f};
    if (isnan(ratio)) return 7;
    uint32_t e = 0;
#pragma unroll
    for (int k = 0; k < 7; ++k) e += ratio >= bounds[k];
    return e;
}

__global__ void variance_mark(const float* __restrict__ g, const float* __restrict__ squares, float* __restrict__ r,
                              float* __restrict__ v, int64_t n, cpu::VarianceParams p, uint32_t* __restrict__ mask,
                              int32_t* __restrict__ counts) {
    const float world = static_cast<float>(p.world), mm = static_cast<float>(p.m * p.m), m = static_cast<float>(p.m);
    const float m1 = static_cast<float>(p.m - 1), w2 = static_cast<float>(p.world * p.world);
    const int64_t stride = int64_t(gridDim.x) * blockDim.x, end = round_up(n, 32);
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < end; i += stride) {
        bool send = false;
        if (i < n) {
            const float raw = g[i] * world;
            float var = squares[i] * mm - raw * m * raw;
            var = var < 0.0f ? 0.0f : var;
            var = var / m1 / m / w2;
            const float ri = r[i] + g[i], vi = v[i] + var;
            r[i] = ri;
            send = vi * p.alpha < ri * ri && ri != 0.0f && (!p.hybrid || fabsf(ri) >= p.tau);   // hybrid: both
            v[i] = send ? 0.0f : vi * p.zeta;
        }
        record_selection(send, i, mask, counts);
    }
}

__global__ void variance_write(int64_t n, const uint32_t* __restrict__ mask, const int64_t* __restrict__ offsets,
                               const float* __restrict__ r, int32_t* __restrict__ idx, unsigned int* __restrict__ scale_bits) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
        if (mask[i / 32] & (1u << (31 - i % 32))) {
            idx[selected_rank(i, mask, offsets)] = static_cast<int32_t>(i);
            atomicMax(scale_bits, __float_as_uint(fabsf(r[i])));
        }
}

__global__ void variance_codes(const int32_t* __restrict__ idx, int64_t count, float* __restrict__ r, float scale,
                               int32_t* __restrict__ words) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x, end = round_up(count, 32);
    for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < end; j += stride) {
        uint32_t code = 0;
        if (j < count) {
            const float x = r[idx[j]];
            const uint32_t e = exponent_of(scale / fmaxf(fabsf(x), 1.17549435e-38f));
            const bool neg = x < 0.0f;
            r[idx[j]] = x - ((neg ? -1.0f : 1.0f) * scale) * ldexpf(1.0f, -static_cast<int>(e));
            code = (neg ? 8u : 0u) | e;
        }
        const uint32_t word = pack_lanes<4>(code);
        if ((threadIdx.x & 7) == 0 && j < count) words[j / 8] = static_cast<int32_t>(word);
    }
}

__global__ void variance_scatter(const int32_t* __restrict__ idx, const int32_t* __restrict__ codes, int64_t count,
                                 float scale, float* __restrict__ out) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < count; j += stride) {
        const uint32_t c = code_at<4>(codes, j);
        out[idx[j]] += ((c & 8u) ? -scale : scale) * ldexpf(1.0f, -static_cast<int>(c & 7u));
    }
}

}  // namespace

float variance_encode(const float* g, const float* squares, float* r, float* v, int64_t n, const cpu::VarianceParams& p,
                      const Alloc<int32_t>& idx_alloc, const Alloc<int32_t>& codes_alloc, void* stream) {
    cudaStream_t s = as_stream(stream);
    if (!n) { idx_alloc(0); codes_alloc(0); return 0.0f; }
    Scratch scratch(n, s);
    variance_mark<<<blocks_for(n), kThreads, 0, s>>>(g, squares, r, v, n, p, scratch.mask, scratch.counts);
    check(cudaGetLastError(), "variance_mark");
    const int64_t total = scan_counts(scratch.counts, scratch.offsets, scratch.blocks, s);
    int32_t* idx = idx_alloc(total);
    unsigned int* scale_bits = reinterpret_cast<unsigned int*>(scratch.aux);
    check(cudaMemsetAsync(scale_bits, 0, sizeof(unsigned int), s), "variance scale");
    if (total) variance_write<<<blocks_for(n), kThreads, 0, s>>>(n, scratch.mask, scratch.offsets, r, idx, scale_bits);
    unsigned int bits = 0;
    check(cudaMemcpyAsync(&bits, scale_bits, sizeof(bits), cudaMemcpyDeviceToHost, s), "variance scale");
    check(cudaStreamSynchronize(s), "variance scale");
    float scale;
    memcpy(&scale, &bits, sizeof(scale));
    int32_t* words = codes_alloc(words_for(total, 4));
    if (total) variance_codes<<<blocks_for(total), kThreads, 0, s>>>(idx, total, r, scale, words);
    check(cudaGetLastError(), "variance_codes");
    return scale;
}

void variance_decode(const int32_t* const* idx, const int32_t* const* codes, const float* scales, const int64_t* counts,
                     int p, float* out, int64_t n, void* stream) {
    cudaStream_t s = as_stream(stream);
    check(cudaMemsetAsync(out, 0, n * sizeof(float), s), "variance_decode");
    for (int q = 0; q < p; ++q)
        if (counts[q]) variance_scatter<<<blocks_for(counts[q]), kThreads, 0, s>>>(idx[q], codes[q], counts[q], scales[q], out);
    check(cudaGetLastError(), "variance_decode");
}

}  // namespace gct::cuda
