// Sparse payloads (int32 index, float/half/bfloat16 value) of p ranks summed into one dense
// tensor (sparse.h), payloads added in rank order (the reference's order of summation).
#include "sparse.h"

namespace gct::cpu {

static float half_to_float(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu, mant = h & 0x3FFu, bits;
    if (exp == 0x1Fu) {
        bits = sign | 0x7F800000u | (mant << 13);                     // Inf, NaN
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (mant << 13);            // normal
    } else if (mant == 0) {
        bits = sign;                                                  // zero
    } else {                                                          // subnormal: normalise
        int e = -1;
        do { ++e; mant <<= 1; } while (!(mant & 0x400u));
        bits = sign | ((112u - e) << 23) | ((mant & 0x3FFu) << 13);
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

static float bf16_to_float(uint16_t b) {
    const uint32_t bits = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

void scatter_add(const int32_t* const* idx, const void* const* values, ValueType vt, const int64_t* counts, int p,
                 float* out, int64_t n) {
    if (vt == ValueType::f32) {
        sparse_sum(p, counts, [idx, values](int q, int64_t j) {
            return std::pair<int64_t, float>(idx[q][j], static_cast<const float*>(values[q])[j]);
        }, out, n);
    } else {
        const bool half = vt == ValueType::f16;
        sparse_sum(p, counts, [idx, values, half](int q, int64_t j) {
            const uint16_t v = static_cast<const uint16_t*>(values[q])[j];
            return std::pair<int64_t, float>(idx[q][j], half ? half_to_float(v) : bf16_to_float(v));
        }, out, n);
    }
}

}  // namespace gct::cpu
