// Sign bits on the GPU: pack with a warp ballot, unpack to +-scale, majority vote over p payloads.
#include "common.cuh"

namespace gct::cuda {

namespace {

__global__ void sign_pack_kernel(const float* __restrict__ x, int32_t* __restrict__ words, int64_t n) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x, end = round_up(n, 32);
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < end; i += stride) {
        const uint32_t word = ballot_word(i < n && x[i] >= 0.0f);
        if ((threadIdx.x & 31) == 0 && i < n) words[i / 32] = static_cast<int32_t>(word);
    }
}

__global__ void sign_unpack_kernel(const int32_t* __restrict__ words, float* __restrict__ out, int64_t n, float scale) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = code_at<1>(words, i) ? scale : -scale;
}

// ones[i] counts the 1 bits of element i over the payloads of this launch (and earlier ones,
// carried in `carry`); the last launch turns the count into the vote.
__global__ void sign_vote_kernel(List<const int32_t*> words, int32_t* __restrict__ carry, float* __restrict__ out,
                                 int64_t n, int p, float scale, bool first, bool last) {
    const int64_t stride = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        int ones = first ? 0 : carry[i];
        for (int q = 0; q < words.size; ++q) ones += static_cast<int>(code_at<1>(words.item[q], i));
        if (last) {
            const int votes = 2 * ones - p;
            out[i] = votes > 0 ? scale : votes < 0 ? -scale : 0.0f;
        } else {
            carry[i] = ones;
        }
    }
}

}  // namespace

void sign_pack(const float* x, int32_t* words, int64_t n, void* stream) {
    if (n) sign_pack_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(x, words, n);
    check(cudaGetLastError(), "sign_pack");
}

void sign_unpack(const int32_t* words, float* out, int64_t n, float scale, void* stream) {
    if (n) sign_unpack_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(words, out, n, scale);
    check(cudaGetLastError(), "sign_unpack");
}

void sign_vote(const int32_t* const* words, int p, float* out, int64_t n, float scale, void* stream) {
    if (!n) return;
    cudaStream_t s = as_stream(stream);
    int32_t* carry = nullptr;
    if (p > kMaxPayloads) check(cudaMallocAsync(reinterpret_cast<void**>(&carry), n * 4, s), "sign_vote scratch");
    for (int first = 0; first < p; first += kMaxPayloads) {
        List<const int32_t*> list{};
        list.size = p - first < kMaxPayloads ? p - first : kMaxPayloads;
        for (int q = 0; q < list.size; ++q) list.item[q] = words[first + q];
        sign_vote_kernel<<<blocks_for(n), kThreads, 0, s>>>(list, carry, out, n, p, scale, first == 0,
                                                           first + list.size == p);
    }
    if (carry) cudaFreeAsync(carry, s);
    check(cudaGetLastError(), "sign_vote");
}

}  // namespace gct::cuda
