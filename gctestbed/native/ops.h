// The pointer-level interface of gctestbed's compressor kernels, one declaration per kernel and
// device. bindings.cpp turns torch tensors into these calls; the kernels themselves know nothing
// of torch, so the CUDA files compile with a bare nvcc.
//
// Bit layout (shared with gctestbed/compress/bitpack.py): MXNet's. k-bit codes, 8/k to a byte,
// the first code in the byte's most significant bits, bytes in memory order; the payload is a
// whole number of 4-byte words (32/k codes each), the last padded with zero codes.
#pragma once
#include <cstdint>
#include <functional>

#if defined(__CUDACC__)
#define GCT_HOST_DEVICE __host__ __device__
#else
#define GCT_HOST_DEVICE
#endif

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the kernels write payload bytes through 32-bit words: little-endian hosts only");

namespace gct {

// The bit of a 32-bit payload word (read little-endian) where code j of the word (0 <= j < 32/Bits)
// starts: byte j / (8/Bits), first code of a byte highest. MXNet's 2-bit masks 0xc0, 0x30, 0x0c,
// 0x03 are codes 0..3 of byte 0, at bits 6, 4, 2, 0.
template <int Bits>
GCT_HOST_DEVICE constexpr int code_shift(int j) {
    return Bits * (j ^ (8 / Bits - 1));      // = 8 * (j / (8/Bits)) + Bits * (8/Bits - 1 - j % (8/Bits))
}

// Allocates the output of a kernel whose size is known only after it ran (compaction).
template <class T> using Alloc = std::function<T*(int64_t)>;

// A 32-bit hash of (key, i): the random stream of stochastic rounding. Counter-based, so every
// element's draw is the same whatever the thread count or device; gctestbed/compress/quantize.py
// computes the same numbers in torch.
GCT_HOST_DEVICE inline uint32_t hash32(uint32_t key, uint64_t i) {
    uint32_t x = (static_cast<uint32_t>(i) * 0x9E3779B1u) ^ key;
    x ^= x >> 16; x *= 0x7FEB352Du;
    x ^= x >> 15; x *= 0x846CA68Bu;
    x ^= x >> 16;
    return x;
}

// Uniform in [0, 1) with 24 random bits, exactly representable in float.
GCT_HOST_DEVICE inline float uniform24(uint32_t key, uint64_t i) {
    return static_cast<float>(hash32(key, i) >> 8) * (1.0f / 16777216.0f);
}

inline int64_t words_for(int64_t n, int bits) { int per = 32 / bits; return (n + per - 1) / per; }

namespace cpu {
// MXNet 2-bit with residual: a = g + r; code 11 (a >= tau), 10 (a <= -tau), else 00; r = a - decoded.
// Payload bytes identical to MXNet's quantize_2bit (and 1-bit's to its quantize_1bit).
void twobit_encode(const float* g, float* r, int32_t* words, int64_t n, float tau);
// out = sum over p payloads of the decoded values (+tau, -tau, 0), in payload order.
void twobit_decode(const int32_t* const* words, int p, float* out, int64_t n, float tau);
// 1 bit with residual: a = g + r; bit = a > threshold; r = a - (bit ? scale : -scale).
void onebit_encode(const float* g, float* r, int32_t* words, int64_t n, float threshold, float scale);
void onebit_decode(const int32_t* const* words, int p, float* out, int64_t n, float scale);
// Sign bits (x >= 0), their +-scale values, and the majority vote over p payloads.
void sign_pack(const float* x, int32_t* words, int64_t n);
void sign_unpack(const int32_t* words, float* out, int64_t n, float scale);
void sign_vote(const int32_t* const* words, int p, float* out, int64_t n, float scale);
// Strom: a = g + r; |a| >= tau -> word (sign << 31 | index), r = a -+ tau; else r = a.
void threshold_encode(const float* g, float* r, int64_t n, float tau, const Alloc<int32_t>& alloc);
void threshold_decode(const int32_t* const* words, const int64_t* counts, int p, float* out, int64_t n, float tau);
// Indices (ascending) of |v| >= threshold.
void select_above(const float* v, int64_t n, float threshold, const Alloc<int64_t>& alloc);
// The value of the k-th largest |v[sample[j]]| (NaN counts as largest).
float kth_largest_sampled(const float* v, const int64_t* sample, int64_t m, int64_t k);
// Of the ascending indices idx (count m), keep the k with the largest |v|, ties to the lower index.
int64_t keep_largest(const float* v, int64_t* idx, int64_t m, int64_t k);
// DGC momentum correction and accumulation: u = u * momentum + g; v = v + u.
void dgc_accumulate(float* u, float* v, const float* g, int64_t n, float momentum);
// out += each payload's values at its indices (values of type float, half or bfloat16 bits).
enum class ValueType { f32, f16, bf16 };
void scatter_add(const int32_t* const* idx, const void* const* values, ValueType vt, const int64_t* counts, int p,
                 float* out, int64_t n);
// Variance-based: see gctestbed/compress/variance.py. Selected indices go to alloc; returns the
// scale (largest selected |r|) and writes 4-bit codes through codes_alloc.
struct VarianceParams { float alpha, zeta, tau; int m, world; bool hybrid; };
float variance_encode(const float* g, const float* squares, float* r, float* v, int64_t n, const VarianceParams& p,
                      const Alloc<int32_t>& idx_alloc, const Alloc<int32_t>& codes_alloc);
void variance_decode(const int32_t* const* idx, const int32_t* const* codes, const float* scales,
                     const int64_t* counts, int p, float* out, int64_t n);
// QSGD: per chunk of d, norm (fp32, accumulated in double), level = floor(|x|/norm*s) + (u < frac),
// code = level << 1 | sign, packed at `bits` per code.
void qsgd_encode(const float* x, int64_t n, int64_t d, int s, int bits, uint32_t key, int32_t* words, float* norms);
void qsgd_decode(const int32_t* const* words, const float* const* norms, int p, float* out, int64_t n, int64_t d,
                 int s, int bits);
}  // namespace cpu

namespace cuda {
// The same kernels on a CUDA stream (cudaStream_t passed as void*). Compaction kernels count
// first and call alloc once they know the size.
void twobit_encode(const float* g, float* r, int32_t* words, int64_t n, float tau, void* stream);
void twobit_decode(const int32_t* const* words, int p, float* out, int64_t n, float tau, void* stream);
void onebit_encode(const float* g, float* r, int32_t* words, int64_t n, float threshold, float scale, void* stream);
void onebit_decode(const int32_t* const* words, int p, float* out, int64_t n, float scale, void* stream);
void sign_pack(const float* x, int32_t* words, int64_t n, void* stream);
void sign_unpack(const int32_t* words, float* out, int64_t n, float scale, void* stream);
void sign_vote(const int32_t* const* words, int p, float* out, int64_t n, float scale, void* stream);
void threshold_encode(const float* g, float* r, int64_t n, float tau, const Alloc<int32_t>& alloc, void* stream);
void threshold_decode(const int32_t* const* words, const int64_t* counts, int p, float* out, int64_t n, float tau,
                      void* stream);
void select_above(const float* v, int64_t n, float threshold, const Alloc<int64_t>& alloc, void* stream);
void dgc_accumulate(float* u, float* v, const float* g, int64_t n, float momentum, void* stream);
void scatter_add(const int32_t* const* idx, const void* const* values, cpu::ValueType vt, const int64_t* counts,
                 int p, float* out, int64_t n, void* stream);
float variance_encode(const float* g, const float* squares, float* r, float* v, int64_t n,
                      const cpu::VarianceParams& p, const Alloc<int32_t>& idx_alloc,
                      const Alloc<int32_t>& codes_alloc, void* stream);
void variance_decode(const int32_t* const* idx, const int32_t* const* codes, const float* scales,
                     const int64_t* counts, int p, float* out, int64_t n, void* stream);
void qsgd_encode(const float* x, int64_t n, int64_t d, int s, int bits, uint32_t key, int32_t* words, float* norms,
                 void* stream);
void qsgd_decode(const int32_t* const* words, const float* const* norms, int p, float* out, int64_t n, int64_t d,
                 int s, int bits, void* stream);
}  // namespace cuda
}  // namespace gct
