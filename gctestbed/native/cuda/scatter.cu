// Sparse payloads (int32 index, float/half/bfloat16 value) of p ranks summed into one dense
// tensor on the GPU: one launch per payload (indices unique within it), in rank order.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common.cuh"

namespace gct::cuda {

namespace {

template <class V>
__device__ inline float to_float(V x);
template <> __device__ inline float to_float<float>(float x) { return x; }
template <> __device__ inline float to_float<__half>(__half x) { return __half2float(x); }
template <> __device__ inline float to_float<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }

template <class V>
__global__ void scatter_kernel(const int32_t* __restrict__ idx, const V* __restrict__ values, int64_t m,
                               float* __restrict__ out) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < m; j += stride)
        out[idx[j]] += to_float<V>(values[j]);
}

}  // namespace

void scatter_add(const int32_t* const* idx, const void* const* values, cpu::ValueType vt, const int64_t* counts,
                 int p, float* out, int64_t n, void* stream) {
    cudaStream_t s = as_stream(stream);
    check(cudaMemsetAsync(out, 0, n * sizeof(float), s), "scatter_add");
    for (int q = 0; q < p; ++q) {
        if (!counts[q]) continue;
        const int blocks = blocks_for(counts[q]);
        if (vt == cpu::ValueType::f32)
            scatter_kernel<float><<<blocks, kThreads, 0, s>>>(idx[q], static_cast<const float*>(values[q]), counts[q], out);
        else if (vt == cpu::ValueType::f16)
            scatter_kernel<__half><<<blocks, kThreads, 0, s>>>(idx[q], static_cast<const __half*>(values[q]), counts[q], out);
        else
            scatter_kernel<__nv_bfloat16><<<blocks, kThreads, 0, s>>>(idx[q], static_cast<const __nv_bfloat16*>(values[q]),
                                                                      counts[q], out);
    }
    check(cudaGetLastError(), "scatter_add");
}

}  // namespace gct::cuda
