// torch.ops.gctestbed.*: the schemas of the compressor kernels, their input checks and output
// allocation, and the choice between the CPU and the CUDA kernel by the tensors' device. Half and
// bfloat16 gradients are read as float32; residual memories must be contiguous float32.
#include <torch/library.h>
#include <ATen/ATen.h>

#include <cmath>
#include <vector>

#include "ops.h"

#ifdef GCTESTBED_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#define GCT_STREAM , static_cast<void*>(c10::cuda::getCurrentCUDAStream().stream())
#define GCT_CALL(x, fn, ...) (on_cuda(x) ? gct::cuda::fn(__VA_ARGS__ GCT_STREAM) : gct::cpu::fn(__VA_ARGS__))
constexpr bool kWithCuda = true;
#else
#define GCT_CALL(x, fn, ...) (on_cuda(x), gct::cpu::fn(__VA_ARGS__))
constexpr bool kWithCuda = false;
#endif

using at::Tensor;
using gct::words_for;

namespace {

// Whether x lives on a CUDA device; refuses devices this build has no kernels for.
bool on_cuda(const Tensor& x) {
    TORCH_CHECK(x.device().is_cpu() || (kWithCuda && x.is_cuda()), "gctestbed's kernels were built for CPU",
                kWithCuda ? " and CUDA" : "", " tensors, not ", x.device().str());
    return x.is_cuda();
}

// Refuses a payload whose indices fall outside the dense tensor (a corrupt or foreign payload).
void check_indices(const Tensor& idx, int64_t numel, const char* what) {
    if (idx.numel() == 0) return;
    auto [lo, hi] = at::aminmax(idx);
    TORCH_CHECK(lo.item<int64_t>() >= 0 && hi.item<int64_t>() < numel, what, " fall outside 0..", numel - 1);
}

Tensor floats(const Tensor& t) { return t.to(at::kFloat).contiguous(); }

void check_memory(const Tensor& memory, const Tensor& like, const char* what) {
    TORCH_CHECK(memory.scalar_type() == at::kFloat && memory.is_contiguous() && memory.numel() == like.numel() &&
                    memory.device() == like.device(),
                what, " must be a contiguous float32 tensor of the gradient's size and device");
}

Tensor ints(const Tensor& t, int64_t at_least, const char* what) {
    TORCH_CHECK(t.scalar_type() == at::kInt, what, " must be int32");
    TORCH_CHECK(t.numel() >= at_least, what, " holds ", t.numel(), " words, fewer than the ", at_least, " needed");
    return t.contiguous();
}

std::vector<Tensor> word_lists(at::TensorList words, int64_t numel, int bits, std::vector<const int32_t*>& ptrs) {
    TORCH_CHECK(!words.empty(), "at least one payload is needed");
    TORCH_CHECK(numel >= 0, "numel must be 0 or more");
    std::vector<Tensor> kept;
    for (const Tensor& w : words) {
        kept.push_back(ints(w, words_for(numel, bits), "packed words"));
        ptrs.push_back(kept.back().data_ptr<int32_t>());
    }
    return kept;
}

// The decoded result: written into `out` when given (the caller's buffer: no allocation), else new.
Tensor dense_out(const Tensor& like, int64_t numel, const std::optional<Tensor>& out) {
    if (!out.has_value()) return at::empty({numel}, like.options().dtype(at::kFloat));
    TORCH_CHECK(out->scalar_type() == at::kFloat && out->is_contiguous() && out->numel() == numel &&
                    out->device() == like.device(),
                "out must be a contiguous float32 tensor of ", numel, " elements on ", like.device().str());
    return *out;
}

template <class T>
gct::Alloc<T> alloc_into(Tensor& out, const at::TensorOptions& options) {
    return [&out, options](int64_t n) {
        out = at::empty({n}, options);
        return out.template data_ptr<T>();
    };
}

// Packed codes of a gradient whose kernel also updates a residual memory in place.
template <class Kernel>
Tensor encode_with_residual(const Tensor& grad, Tensor& residual, int bits, Kernel kernel) {
    Tensor g = floats(grad);
    check_memory(residual, g, "residual");
    Tensor words = at::empty({words_for(g.numel(), bits)}, g.options().dtype(at::kInt));
    kernel(g, words);
    return words;
}

// The sum of p packed payloads, decoded into `out` (or a new tensor).
template <class Kernel>
Tensor decode_packed(at::TensorList words, int64_t numel, int bits, const std::optional<Tensor>& out, Kernel kernel) {
    std::vector<const int32_t*> ptrs;
    auto kept = word_lists(words, numel, bits, ptrs);
    Tensor result = dense_out(kept[0], numel, out);
    kernel(ptrs, result);
    return result;
}

Tensor twobit_encode(const Tensor& grad, Tensor& residual, double tau) {
    return encode_with_residual(grad, residual, 2, [&](const Tensor& g, Tensor& words) {
        GCT_CALL(g, twobit_encode, g.data_ptr<float>(), residual.data_ptr<float>(), words.data_ptr<int32_t>(),
                 g.numel(), static_cast<float>(tau));
    });
}

Tensor twobit_decode(at::TensorList words, int64_t numel, double tau, const std::optional<Tensor>& out) {
    return decode_packed(words, numel, 2, out, [&](const std::vector<const int32_t*>& ptrs, Tensor& result) {
        GCT_CALL(result, twobit_decode, ptrs.data(), static_cast<int>(ptrs.size()), result.data_ptr<float>(), numel,
                 static_cast<float>(tau));
    });
}

Tensor onebit_encode(const Tensor& grad, Tensor& residual, double threshold, double scale) {
    return encode_with_residual(grad, residual, 1, [&](const Tensor& g, Tensor& words) {
        GCT_CALL(g, onebit_encode, g.data_ptr<float>(), residual.data_ptr<float>(), words.data_ptr<int32_t>(),
                 g.numel(), static_cast<float>(threshold), static_cast<float>(scale));
    });
}

Tensor onebit_decode(at::TensorList words, int64_t numel, double scale, const std::optional<Tensor>& out) {
    return decode_packed(words, numel, 1, out, [&](const std::vector<const int32_t*>& ptrs, Tensor& result) {
        GCT_CALL(result, onebit_decode, ptrs.data(), static_cast<int>(ptrs.size()), result.data_ptr<float>(), numel,
                 static_cast<float>(scale));
    });
}

Tensor sign_pack(const Tensor& x) {
    Tensor f = floats(x);
    Tensor words = at::empty({words_for(f.numel(), 1)}, f.options().dtype(at::kInt));
    GCT_CALL(f, sign_pack, f.data_ptr<float>(), words.data_ptr<int32_t>(), f.numel());
    return words;
}

Tensor sign_unpack(const Tensor& words, int64_t numel, double scale) {
    Tensor w = ints(words, words_for(numel, 1), "packed words");
    Tensor out = dense_out(w, numel, std::nullopt);
    GCT_CALL(w, sign_unpack, w.data_ptr<int32_t>(), out.data_ptr<float>(), numel, static_cast<float>(scale));
    return out;
}

Tensor sign_vote(at::TensorList words, int64_t numel, double scale, const std::optional<Tensor>& out) {
    return decode_packed(words, numel, 1, out, [&](const std::vector<const int32_t*>& ptrs, Tensor& result) {
        GCT_CALL(result, sign_vote, ptrs.data(), static_cast<int>(ptrs.size()), result.data_ptr<float>(), numel,
                 static_cast<float>(scale));
    });
}

Tensor threshold_encode(const Tensor& grad, Tensor& residual, double tau) {
    Tensor g = floats(grad);
    check_memory(residual, g, "residual");
    TORCH_CHECK(g.numel() < (int64_t(1) << 31), "threshold indexes elements with 31 bits: at most 2**31 - 1 elements");
    Tensor words;
    GCT_CALL(g, threshold_encode, g.data_ptr<float>(), residual.data_ptr<float>(), g.numel(), static_cast<float>(tau),
             alloc_into<int32_t>(words, g.options().dtype(at::kInt)));
    return words;
}

Tensor threshold_decode(at::TensorList words, int64_t numel, double tau, const std::optional<Tensor>& out) {
    TORCH_CHECK(!words.empty(), "at least one payload is needed");
    std::vector<Tensor> kept;
    std::vector<const int32_t*> ptrs;
    std::vector<int64_t> counts;
    for (const Tensor& w : words) {
        kept.push_back(ints(w, 0, "threshold words"));
        check_indices(kept.back().bitwise_and(0x7FFFFFFF), numel, "threshold words' indices");
        ptrs.push_back(kept.back().data_ptr<int32_t>());
        counts.push_back(w.numel());
    }
    Tensor result = dense_out(kept[0], numel, out);
    GCT_CALL(result, threshold_decode, ptrs.data(), counts.data(), static_cast<int>(ptrs.size()), result.data_ptr<float>(),
             numel, static_cast<float>(tau));
    return result;
}

Tensor select_above(const Tensor& v, double threshold) {
    Tensor f = floats(v), idx;
    GCT_CALL(f, select_above, f.data_ptr<float>(), f.numel(), static_cast<float>(threshold),
             alloc_into<int64_t>(idx, f.options().dtype(at::kLong)));
    return idx;
}

// DGC's selection (see gctestbed/compress/dgc.py, sampled_threshold_select): threshold = the
// k_sample-th largest |v| of the sample; halve it while far too few are selected; trim to the
// exact k largest (ties to the lower index) when far too many are.
Tensor dgc_select(const Tensor& v, const Tensor& sample, int64_t k_sample, int64_t k) {
    Tensor f = floats(v);
    Tensor s = sample.to(at::kLong).contiguous();
    TORCH_CHECK(k_sample >= 1 && k_sample <= s.numel(), "k_sample must be in 1..", s.numel());
    TORCH_CHECK(k >= 1, "k must be at least 1");
    check_indices(s, f.numel(), "sample indices");
    float threshold;
    if (f.is_cuda()) {
        threshold = std::get<0>(at::topk(f.index_select(0, s).abs(), k_sample))[k_sample - 1].item<float>();
    } else {
        threshold = gct::cpu::kth_largest_sampled(f.data_ptr<float>(), s.data_ptr<int64_t>(), s.numel(), k_sample);
    }
    Tensor idx = select_above(f, threshold);
    for (int i = 0; i < 4; ++i) {
        if (idx.numel() >= 0.8 * static_cast<double>(k) || !(threshold > 0.0f)) break;
        threshold /= 2;
        idx = select_above(f, threshold);
    }
    if (idx.numel() > 1.3 * static_cast<double>(k)) {
        if (f.is_cuda()) {
            Tensor mags = f.index_select(0, idx).abs();
            Tensor kth = std::get<0>(at::topk(mags, k))[k - 1];
            Tensor above = mags > kth, tie = mags == kth;
            Tensor need = k - above.sum();
            idx = idx.masked_select(above.logical_or(tie.logical_and(tie.cumsum(0) <= need)));
        } else {
            idx = idx.narrow(0, 0, gct::cpu::keep_largest(f.data_ptr<float>(), idx.data_ptr<int64_t>(), idx.numel(), k))
                      .clone();
        }
    }
    return idx;
}

void dgc_accumulate(Tensor& u, Tensor& v, const Tensor& grad, double momentum) {
    Tensor g = floats(grad);
    check_memory(u, g, "velocity");
    check_memory(v, g, "accumulation");
    GCT_CALL(g, dgc_accumulate, u.data_ptr<float>(), v.data_ptr<float>(), g.data_ptr<float>(), g.numel(),
             static_cast<float>(momentum));
}

Tensor scatter_add(at::TensorList indices, at::TensorList values, int64_t numel, const std::optional<Tensor>& out) {
    TORCH_CHECK(!indices.empty() && indices.size() == values.size(), "one index and one value tensor per payload");
    const at::ScalarType vt = values[0].scalar_type();
    TORCH_CHECK(vt == at::kFloat || vt == at::kHalf || vt == at::kBFloat16, "values must be float32, float16 or bfloat16");
    std::vector<Tensor> kept;
    std::vector<const int32_t*> idx;
    std::vector<const void*> vals;
    std::vector<int64_t> counts;
    for (size_t q = 0; q < indices.size(); ++q) {
        TORCH_CHECK(indices[q].scalar_type() == at::kInt, "indices must be int32");
        TORCH_CHECK(values[q].scalar_type() == vt, "all payloads' values must have one dtype");
        TORCH_CHECK(indices[q].numel() == values[q].numel(), "payload ", q, " has ", indices[q].numel(),
                    " indices but ", values[q].numel(), " values");
        kept.push_back(indices[q].contiguous());
        kept.push_back(values[q].contiguous());
        check_indices(kept[kept.size() - 2], numel, "sparse indices");
        idx.push_back(kept[kept.size() - 2].data_ptr<int32_t>());
        vals.push_back(kept.back().data_ptr());
        counts.push_back(indices[q].numel());
    }
    const auto type = vt == at::kFloat ? gct::cpu::ValueType::f32
                      : vt == at::kHalf ? gct::cpu::ValueType::f16 : gct::cpu::ValueType::bf16;
    Tensor result = dense_out(kept[0], numel, out);
    GCT_CALL(result, scatter_add, idx.data(), vals.data(), type, counts.data(), static_cast<int>(idx.size()),
             result.data_ptr<float>(), numel);
    return result;
}

std::tuple<Tensor, Tensor, Tensor> variance_encode(const Tensor& grad, const Tensor& squares, Tensor& r, Tensor& v,
                                                   double alpha, double zeta, double tau, int64_t microbatches,
                                                   int64_t world, bool hybrid) {
    Tensor g = floats(grad), sq = floats(squares);
    TORCH_CHECK(sq.numel() == g.numel(), "squares must match the gradient's size");
    check_memory(r, g, "accumulated gradient");
    check_memory(v, g, "accumulated variance");
    TORCH_CHECK(microbatches >= 2 && world >= 1, "microbatches must be at least 2 and world at least 1");
    TORCH_CHECK(g.numel() < (int64_t(1) << 31), "variance indexes elements with int32: at most 2**31 - 1 elements");
    const gct::cpu::VarianceParams p{static_cast<float>(alpha), static_cast<float>(zeta), static_cast<float>(tau),
                                     static_cast<int>(microbatches), static_cast<int>(world), hybrid};
    Tensor idx, codes;
    const auto opts = g.options().dtype(at::kInt);
    const float scale = GCT_CALL(g, variance_encode, g.data_ptr<float>(), sq.data_ptr<float>(), r.data_ptr<float>(),
                                 v.data_ptr<float>(), g.numel(), p, alloc_into<int32_t>(idx, opts),
                                 alloc_into<int32_t>(codes, opts));
    return {idx, codes, at::full({1}, scale, g.options().dtype(at::kFloat))};
}

Tensor variance_decode(at::TensorList indices, at::TensorList codes,
                       at::TensorList scales, int64_t numel, const std::optional<Tensor>& out) {
    TORCH_CHECK(!indices.empty() && indices.size() == codes.size() && codes.size() == scales.size(),
                "one index, code and scale tensor per payload");
    std::vector<Tensor> kept;
    std::vector<const int32_t*> idx, cod;
    std::vector<int64_t> counts;
    for (size_t q = 0; q < indices.size(); ++q) {
        kept.push_back(ints(indices[q], 0, "indices"));
        check_indices(kept.back(), numel, "variance indices");
        idx.push_back(kept.back().data_ptr<int32_t>());
        counts.push_back(indices[q].numel());
        kept.push_back(ints(codes[q], words_for(counts.back(), 4), "codes"));
        cod.push_back(kept.back().data_ptr<int32_t>());
        TORCH_CHECK(scales[q].numel() == 1, "one scale per payload");
    }
    Tensor scale = at::cat(scales).to(at::kFloat).cpu();
    Tensor result = dense_out(kept[0], numel, out);
    GCT_CALL(result, variance_decode, idx.data(), cod.data(), scale.data_ptr<float>(), counts.data(),
             static_cast<int>(idx.size()), result.data_ptr<float>(), numel);
    return result;
}

void check_qsgd(int64_t levels, int64_t bucket_size, int64_t bits) {
    TORCH_CHECK(levels >= 1 && levels <= 127, "levels must be 1..127");
    TORCH_CHECK(bucket_size >= 1, "bucket_size must be at least 1");
    TORCH_CHECK(bits == 2 || bits == 4 || bits == 8, "bits must be 2, 4 or 8");
    TORCH_CHECK((int64_t(1) << (bits - 1)) > levels, levels, " levels do not fit in ", bits, " bits");
}

std::tuple<Tensor, Tensor> qsgd_encode(const Tensor& x, int64_t levels, int64_t bucket_size, int64_t bits, int64_t key) {
    check_qsgd(levels, bucket_size, bits);
    Tensor f = floats(x);
    const int64_t n = f.numel();
    Tensor words = at::empty({words_for(n, static_cast<int>(bits))}, f.options().dtype(at::kInt));
    Tensor norms = at::empty({(n + bucket_size - 1) / bucket_size}, f.options());
    GCT_CALL(f, qsgd_encode, f.data_ptr<float>(), n, bucket_size, static_cast<int>(levels), static_cast<int>(bits),
             static_cast<uint32_t>(key), words.data_ptr<int32_t>(), norms.data_ptr<float>());
    return {words, norms};
}

Tensor qsgd_decode(at::TensorList words, at::TensorList norms, int64_t numel, int64_t levels,
                   int64_t bucket_size, int64_t bits, const std::optional<Tensor>& out) {
    check_qsgd(levels, bucket_size, bits);
    TORCH_CHECK(words.size() == norms.size(), "one norms tensor per payload");
    std::vector<const int32_t*> ptrs;
    auto kept = word_lists(words, numel, static_cast<int>(bits), ptrs);
    std::vector<Tensor> kept_norms;
    std::vector<const float*> norm_ptrs;
    for (const Tensor& n : norms) {
        kept_norms.push_back(floats(n));
        TORCH_CHECK(kept_norms.back().numel() >= (numel + bucket_size - 1) / bucket_size, "too few norms");
        norm_ptrs.push_back(kept_norms.back().data_ptr<float>());
    }
    Tensor result = dense_out(kept[0], numel, out);
    GCT_CALL(result, qsgd_decode, ptrs.data(), norm_ptrs.data(), static_cast<int>(ptrs.size()), result.data_ptr<float>(),
             numel, bucket_size, static_cast<int>(levels), static_cast<int>(bits));
    return result;
}

}  // namespace

TORCH_LIBRARY(gctestbed, m) {
    m.def("twobit_encode(Tensor grad, Tensor(a!) residual, float tau) -> Tensor", &twobit_encode);
    m.def("twobit_decode(Tensor[] words, int numel, float tau, Tensor(o!)? out=None) -> Tensor", &twobit_decode);
    m.def("onebit_encode(Tensor grad, Tensor(a!) residual, float threshold, float scale) -> Tensor", &onebit_encode);
    m.def("onebit_decode(Tensor[] words, int numel, float scale, Tensor(o!)? out=None) -> Tensor", &onebit_decode);
    m.def("sign_pack(Tensor x) -> Tensor", &sign_pack);
    m.def("sign_unpack(Tensor words, int numel, float scale) -> Tensor", &sign_unpack);
    m.def("sign_vote(Tensor[] words, int numel, float scale, Tensor(o!)? out=None) -> Tensor", &sign_vote);
    m.def("threshold_encode(Tensor grad, Tensor(a!) residual, float tau) -> Tensor", &threshold_encode);
    m.def("threshold_decode(Tensor[] words, int numel, float tau, Tensor(o!)? out=None) -> Tensor", &threshold_decode);
    m.def("select_above(Tensor v, float threshold) -> Tensor", &select_above);
    m.def("dgc_select(Tensor v, Tensor sample, int k_sample, int k) -> Tensor", &dgc_select);
    m.def("dgc_accumulate(Tensor(a!) u, Tensor(b!) v, Tensor grad, float momentum) -> ()", &dgc_accumulate);
    m.def("scatter_add(Tensor[] indices, Tensor[] values, int numel, Tensor(o!)? out=None) -> Tensor", &scatter_add);
    m.def("variance_encode(Tensor grad, Tensor squares, Tensor(a!) r, Tensor(b!) v, float alpha, float zeta, "
          "float tau, int microbatches, int world, bool hybrid) -> (Tensor, Tensor, Tensor)", &variance_encode);
    m.def("variance_decode(Tensor[] indices, Tensor[] codes, Tensor[] scales, int numel, Tensor(o!)? out=None) -> Tensor", &variance_decode);
    m.def("qsgd_encode(Tensor x, int levels, int bucket_size, int bits, int key) -> (Tensor, Tensor)", &qsgd_encode);
    m.def("qsgd_decode(Tensor[] words, Tensor[] norms, int numel, int levels, int bucket_size, int bits, Tensor(o!)? out=None) -> Tensor",
          &qsgd_decode);
}
