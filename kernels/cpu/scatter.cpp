// Sparse payloads (int32 index, float/half/bfloat16 value) of p ranks summed into one dense
// tensor. Indices are unique within a payload, so each payload is scattered in parallel without
// atomics, and payloads are added in rank order (the reference's order of summation).
#include "common.h"

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
    std::memset(out, 0, n * sizeof(float));
    for (int q = 0; q < p; ++q) {
        const int32_t* iq = idx[q];
        const int64_t m = counts[q];
        if (vt == ValueType::f32) {
            const float* v = static_cast<const float*>(values[q]);
#pragma omp parallel for num_threads(threads_for(m)) schedule(static)
            for (int64_t j = 0; j < m; ++j) out[iq[j]] += v[j];
        } else {
            const uint16_t* v = static_cast<const uint16_t*>(values[q]);
            const bool half = vt == ValueType::f16;
#pragma omp parallel for num_threads(threads_for(m)) schedule(static)
            for (int64_t j = 0; j < m; ++j) out[iq[j]] += half ? half_to_float(v[j]) : bf16_to_float(v[j]);
        }
    }
}

}  // namespace gct::cpu
