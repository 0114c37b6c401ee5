// MXNet's 2-bit and 1-bit quantisers on the GPU, each fused with its residual update: one thread
// per element, codes packed across the lanes that share a word.
#include "common.cuh"

namespace gct::cuda {

namespace {

__global__ void twobit_encode_kernel(const float* __restrict__ g, float* __restrict__ r, int32_t* __restrict__ words,
                                     int64_t n, float tau) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x, end = round_up(n, 32);
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < end; i += stride) {
        uint32_t code = 0;
        if (i < n) {
            const float a = g[i] + r[i];
            const bool up = a >= tau, down = a <= -tau;
            r[i] = a - (up ? tau : down ? -tau : 0.0f);
            code = up ? 3u : down ? 2u : 0u;
        }
        const uint32_t word = pack_lanes<2>(code);
        if ((threadIdx.x & 15) == 0 && i < n) words[i / 16] = static_cast<int32_t>(word);
    }
}

__global__ void onebit_encode_kernel(const float* __restrict__ g, float* __restrict__ r, int32_t* __restrict__ words,
                                     int64_t n, float threshold, float scale) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x, end = round_up(n, 32);
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < end; i += stride) {
        bool bit = false;
        if (i < n) {
            const float a = g[i] + r[i];
            bit = a > threshold;
            r[i] = a - (bit ? scale : -scale);
        }
        const uint32_t word = ballot_word(bit);
        if ((threadIdx.x & 31) == 0 && i < n) words[i / 32] = static_cast<int32_t>(word);
    }
}

template <int Bits>
__global__ void decode_kernel(List<const int32_t*> words, float* __restrict__ out, int64_t n, float tau_or_scale,
                              bool accumulate) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        float acc = accumulate ? out[i] : 0.0f;
        for (int q = 0; q < words.size; ++q) {
            const uint32_t c = code_at<Bits>(words.item[q], i);
            float value;
            if (Bits == 2) value = c == 3u ? tau_or_scale : c == 2u ? -tau_or_scale : 0.0f;
            else value = c ? tau_or_scale : -tau_or_scale;
            acc = (q == 0 && !accumulate) ? value : acc + value;
        }
        out[i] = acc;
    }
}

template <int Bits>
void decode(const int32_t* const* words, int p, float* out, int64_t n, float value, void* stream) {
    for (int first = 0; first < p; first += kMaxPayloads) {
        List<const int32_t*> list{};
        list.size = p - first < kMaxPayloads ? p - first : kMaxPayloads;
        for (int q = 0; q < list.size; ++q) list.item[q] = words[first + q];
        if (n) decode_kernel<Bits><<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(list, out, n, value, first > 0);
    }
    check(cudaGetLastError(), "decode");
}

}  // namespace

void twobit_encode(const float* g, float* r, int32_t* words, int64_t n, float tau, void* stream) {
    if (n) twobit_encode_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(g, r, words, n, tau);
    check(cudaGetLastError(), "twobit_encode");
}

void twobit_decode(const int32_t* const* words, int p, float* out, int64_t n, float tau, void* stream) {
    decode<2>(words, p, out, n, tau, stream);
}

void onebit_encode(const float* g, float* r, int32_t* words, int64_t n, float threshold, float scale, void* stream) {
    if (n) onebit_encode_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(g, r, words, n, threshold, scale);
    check(cudaGetLastError(), "onebit_encode");
}

void onebit_decode(const int32_t* const* words, int p, float* out, int64_t n, float scale, void* stream) {
    decode<1>(words, p, out, n, scale, stream);
}

}  // namespace gct::cuda
