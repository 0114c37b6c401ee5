// QSGD on the GPU: one warp per chunk computes its norm (squares summed in double, lanes in a
// fixed order), then one thread per element draws its rounding from the counter-based hash and
// the codes are packed across lanes; decoding sums p payloads per element.
#include "common.cuh"

namespace gct::cuda {

namespace {

__global__ void qsgd_norms(const float* __restrict__ x, int64_t n, int64_t d, float* __restrict__ norms) {
    const int64_t chunks = (n + d - 1) / d;
    const int lane = threadIdx.x & 31;
    const int64_t warps = int64_t(gridDim.x) * blockDim.x / 32;
    for (int64_t c = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; c < chunks; c += warps) {
        const int64_t lo = c * d, hi = lo + d < n ? lo + d : n;
        double sum = 0.0;
        for (int64_t i = lo + lane; i < hi; i += 32) sum += static_cast<double>(x[i]) * x[i];
#pragma unroll
        for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_down_sync(0xFFFFFFFFu, sum, offset);
        if (lane == 0) norms[c] = static_cast<float>(sqrt(sum));
    }
}

template <int Bits>
__global__ void qsgd_quantise(const float* __restrict__ x, int64_t n, int64_t d, float levels, uint32_t key,
                              const float* __restrict__ norms, int32_t* __restrict__ words) {
    constexpr int per = 32 / Bits;
    const int64_t stride = int64_t(gridDim.x) * blockDim.x, end = round_up(n, 32);
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < end; i += stride) {
        uint32_t code = 0;
        if (i < n) {
            const float scaled = fabsf(x[i]) / fmaxf(norms[i / d], 1.17549435e-38f) * levels;
            const bool finite = scaled <= 3.40282347e38f;
            const float lower = floorf(finite ? scaled : 0.0f);
            const float up = uniform24(key, static_cast<uint64_t>(i)) < scaled - lower ? 1.0f : 0.0f;
            const float level = finite ? (lower + up < levels ? lower + up : levels) : 0.0f;
            code = static_cast<uint32_t>(level) << 1 | (x[i] < 0.0f ? 1u : 0u);
        }
        const uint32_t word = pack_lanes<Bits>(code);
        if ((threadIdx.x % per) == 0 && i < n) words[i / per] = static_cast<int32_t>(word);
    }
}

struct Payloads {
    const int32_t* words[kMaxPayloads];
    const float* norms[kMaxPayloads];
    int size;
};

template <int Bits>
__global__ void qsgd_dequantise(Payloads p, float* __restrict__ out, int64_t n, int64_t d, float levels, bool accumulate) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        float acc = accumulate ? out[i] : 0.0f;
        for (int q = 0; q < p.size; ++q) {
            const uint32_t c = code_at<Bits>(p.words[q], i);
            const float value = (c & 1u ? -1.0f : 1.0f) * static_cast<float>(c >> 1) * p.norms[q][i / d] / levels;
            acc = (q == 0 && !accumulate) ? value : acc + value;
        }
        out[i] = acc;
    }
}

}  // namespace

void qsgd_encode(const float* x, int64_t n, int64_t d, int s, int bits, uint32_t key, int32_t* words, float* norms,
                 void* stream) {
    if (!n) return;
    cudaStream_t st = as_stream(stream);
    const int64_t chunks = (n + d - 1) / d;
    qsgd_norms<<<blocks_for(chunks * 32), kThreads, 0, st>>>(x, n, d, norms);
    const float levels = static_cast<float>(s);
    if (bits == 2) qsgd_quantise<2><<<blocks_for(n), kThreads, 0, st>>>(x, n, d, levels, key, norms, words);
    else if (bits == 4) qsgd_quantise<4><<<blocks_for(n), kThreads, 0, st>>>(x, n, d, levels, key, norms, words);
    else qsgd_quantise<8><<<blocks_for(n), kThreads, 0, st>>>(x, n, d, levels, key, norms, words);
    check(cudaGetLastError(), "qsgd_encode");
}

void qsgd_decode(const int32_t* const* words, const float* const* norms, int p, float* out, int64_t n, int64_t d, int s,
                 int bits, void* stream) {
    if (!n) return;
    cudaStream_t st = as_stream(stream);
    const float levels = static_cast<float>(s);
    for (int first = 0; first < p; first += kMaxPayloads) {
        Payloads list{};
        list.size = p - first < kMaxPayloads ? p - first : kMaxPayloads;
        for (int q = 0; q < list.size; ++q) list.words[q] = words[first + q], list.norms[q] = norms[first + q];
        const bool acc = first > 0;
        if (bits == 2) qsgd_dequantise<2><<<blocks_for(n), kThreads, 0, st>>>(list, out, n, d, levels, acc);
        else if (bits == 4) qsgd_dequantise<4><<<blocks_for(n), kThreads, 0, st>>>(list, out, n, d, levels, acc);
        else qsgd_dequantise<8><<<blocks_for(n), kThreads, 0, st>>>(list, out, n, d, levels, acc);
    }
    check(cudaGetLastError(), "qsgd_decode");
}

}  // namespace gct::cuda
