// Batch-1 decode kernels for the host CPU, written once on at::vec::Vectorized and compiled per vector ISA
// (AVX2, AVX-512, the scalar default), the build picking the ISA with -DCPU_CAPABILITY_*.
//
// A decode step reads every weight once and does two flops per weight: it is memory-bound, so each kernel is
// built around streaming the weight rows once at full width: bf16 (or fp32) rows are loaded a vector at a
// time, widened to fp32 in registers and multiplied into an fp32 activation vector that stays in L1.
// Everything between the weight reads stays in fp32 registers / small stack buffers; only what the model keeps
// (the residual stream, the KV cache, the logits) is rounded to the model dtype.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>
#include <ATen/cpu/vec/functional.h>

#include <cmath>
#include <vector>

using at::vec::Vectorized;
using fVec = Vectorized<float>;

namespace {

// dot(w[0:k], h[0:k]) with w in the model dtype, h fp32.
inline float dot_row(const float* w, const float* h, int64_t k) {
  constexpr int64_t L = fVec::size();
  fVec acc0(0.f), acc1(0.f);
  int64_t i = 0;
  for (; i + 2 * L <= k; i += 2 * L) {
    acc0 = at::vec::fmadd(fVec::loadu(w + i), fVec::loadu(h + i), acc0);
    acc1 = at::vec::fmadd(fVec::loadu(w + i + L), fVec::loadu(h + i + L), acc1);
  }
  float s = at::vec::vec_reduce_all<float>([](fVec& a, fVec& b) { return a + b; }, acc0 + acc1);
  for (; i < k; i++) s += w[i] * h[i];
  return s;
}

inline float dot_row(const at::BFloat16* w, const float* h, int64_t k) {
  using bVec = Vectorized<at::BFloat16>;
  constexpr int64_t L = bVec::size();  // 2 fp32 vectors' worth
  constexpr int64_t F = fVec::size();
  fVec acc0(0.f), acc1(0.f);
  int64_t i = 0;
  for (; i + L <= k; i += L) {
    auto [lo, hi] = at::vec::convert_to_float<at::BFloat16>(bVec::loadu(w + i));
    acc0 = at::vec::fmadd(lo, fVec::loadu(h + i), acc0);
    acc1 = at::vec::fmadd(hi, fVec::loadu(h + i + F), acc1);
  }
  float s = at::vec::vec_reduce_all<float>([](fVec& a, fVec& b) { return a + b; }, acc0 + acc1);
  for (; i < k; i++) s += static_cast<float>(w[i]) * h[i];
  return s;
}

template <typename T>
inline float to_f(T v) { return static_cast<float>(v); }

// Rows per parallel task: enough bytes that a task outweighs handing it out.
inline int64_t grain(int64_t k) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(k, 1)); }

// y[n] = W[n, :] . h for n in [0, N) (W row-major [N, K], contiguous)
template <typename T>
void matvec(const T* w, const float* h, float* y, int64_t n, int64_t k) {
  at::parallel_for(0, n, grain(k), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; r++) y[r] = dot_row(w + r * k, h, k);
  });
}

template <typename T>
void rmsnorm(const float* x, const T* w, float* out, int64_t n, float eps) {
  float ss = 0.f;
  for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
  const float r = 1.f / std::sqrt(ss / n + eps);
  for (int64_t i = 0; i < n; i++) out[i] = static_cast<float>(static_cast<T>(x[i] * r)) * to_f(w[i]);
}

template <typename T>
inline float rnd(float v) { return static_cast<float>(static_cast<T>(v)); }  // round to the model dtype

template <typename T>
void rope(float* v, const T* cos, const T* sin, int64_t d) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; i++) {
    const float a = v[i], b = v[i + half];
    v[i] = a * to_f(cos[i]) - b * to_f(sin[i]);
    v[i + half] = b * to_f(cos[i + half]) + a * to_f(sin[i + half]);
  }
}

struct Layer {
  at::Tensor in_norm, wq, wk, wv, wo, post_norm, gate, up, down, k_cache, v_cache;
};

template <typename T>
const T* ptr(const at::Tensor& t) { return t.data_ptr<T>(); }

// One decode step through every layer and the LM head; x (dim) is the embedded token, logits out (vocab).
template <typename T>
void decode_step(const T* x_in, int64_t pos, const T* cos, const T* sin, const std::vector<Layer>& layers,
                 const T* final_norm, const T* lm_head, T* logits, int64_t dim, int64_t vocab, int64_t n_heads,
                 int64_t n_kv, float eps) {
  const int64_t d = layers[0].wq.size(0) / n_heads;
  const int64_t ffn = layers[0].gate.size(0);
  const int64_t s_len = layers[0].k_cache.size(2);
  const int64_t group = n_heads / n_kv;
  const float scale = 1.f / std::sqrt(static_cast<float>(d));
  std::vector<float> x(dim), h(dim), qkv((n_heads + 2 * n_kv) * d), att(n_heads * d), act(ffn), y(dim);
  std::vector<float> tmp(std::max(ffn, vocab));
  for (int64_t i = 0; i < dim; i++) x[i] = to_f(x_in[i]);
  for (const Layer& L : layers) {
    rmsnorm(x.data(), ptr<T>(L.in_norm), h.data(), dim, eps);
    for (int64_t i = 0; i < dim; i++) h[i] = rnd<T>(h[i]);
    // Q, K and V rows in one parallel pass over the three weights
    const int64_t nq = n_heads * d, nk = n_kv * d;
    const T *wq = ptr<T>(L.wq), *wk = ptr<T>(L.wk), *wv = ptr<T>(L.wv);
    at::parallel_for(0, nq + 2 * nk, grain(dim), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; r++) {
        const T* w = r < nq ? wq + r * dim : r < nq + nk ? wk + (r - nq) * dim : wv + (r - nq - nk) * dim;
        qkv[r] = rnd<T>(dot_row(w, h.data(), dim));
      }
    });
    float* q = qkv.data();
    float* k = q + nq;
    float* v = k + nk;
    for (int64_t hh = 0; hh < n_heads; hh++) rope(q + hh * d, cos, sin, d);
    for (int64_t hh = 0; hh < n_kv; hh++) rope(k + hh * d, cos, sin, d);
    T* kc = L.k_cache.data_ptr<T>();  // (1, n_kv, S, d)
    T* vc = L.v_cache.data_ptr<T>();
    for (int64_t hh = 0; hh < n_kv; hh++)
      for (int64_t i = 0; i < d; i++) {
        kc[(hh * s_len + pos) * d + i] = static_cast<T>(k[hh * d + i]);
        vc[(hh * s_len + pos) * d + i] = static_cast<T>(v[hh * d + i]);
      }
    // attention of each query head over the filled cache positions 0..pos
    at::parallel_for(0, n_heads, 1, [&](int64_t b, int64_t e) {
      std::vector<float> p(pos + 1), qh(d);
      for (int64_t hh = b; hh < e; hh++) {
        const int64_t g = hh / group;
        for (int64_t i = 0; i < d; i++) qh[i] = rnd<T>(q[hh * d + i]);
        float mx = -INFINITY;
        for (int64_t j = 0; j <= pos; j++) {
          p[j] = rnd<T>(dot_row(kc + (g * s_len + j) * d, qh.data(), d)) * scale;
          mx = std::max(mx, p[j]);
        }
        float sum = 0.f;
        for (int64_t j = 0; j <= pos; j++) sum += (p[j] = std::exp(p[j] - mx));
        float* o = att.data() + hh * d;
        std::fill(o, o + d, 0.f);
        for (int64_t j = 0; j <= pos; j++) {
          const float pj = rnd<T>(p[j] / sum);
          const T* vr = vc + (g * s_len + j) * d;
          for (int64_t i = 0; i < d; i++) o[i] += pj * to_f(vr[i]);
        }
        for (int64_t i = 0; i < d; i++) o[i] = rnd<T>(o[i]);
      }
    });
    matvec(ptr<T>(L.wo), att.data(), y.data(), dim, nq);
    for (int64_t i = 0; i < dim; i++) x[i] = rnd<T>(x[i] + rnd<T>(y[i]));
    rmsnorm(x.data(), ptr<T>(L.post_norm), h.data(), dim, eps);
    for (int64_t i = 0; i < dim; i++) h[i] = rnd<T>(h[i]);
    const T *wg = ptr<T>(L.gate), *wu = ptr<T>(L.up);
    at::parallel_for(0, ffn, grain(2 * dim), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; r++) {
        const float g = rnd<T>(dot_row(wg + r * dim, h.data(), dim));
        const float u = rnd<T>(dot_row(wu + r * dim, h.data(), dim));
        act[r] = rnd<T>(rnd<T>(g / (1.f + std::exp(-g))) * u);
      }
    });
    matvec(ptr<T>(L.down), act.data(), y.data(), dim, ffn);
    for (int64_t i = 0; i < dim; i++) x[i] = rnd<T>(x[i] + rnd<T>(y[i]));
  }
  rmsnorm(x.data(), final_norm, h.data(), dim, eps);
  for (int64_t i = 0; i < dim; i++) h[i] = rnd<T>(h[i]);
  matvec(lm_head, h.data(), tmp.data(), vocab, dim);
  for (int64_t i = 0; i < vocab; i++) logits[i] = static_cast<T>(tmp[i]);
}

void check(bool ok, const std::string& what) { TORCH_CHECK(ok, "nativelab decode kernel: ", what); }

// The model dtypes the kernels are built for: bf16 and fp32.
template <typename F>
void dispatch(at::ScalarType t, F&& f) {
  if (t == at::kBFloat16) {
    f(at::BFloat16(0.f));
  } else {
    check(t == at::kFloat, "dtype must be bfloat16 or float32");
    f(0.f);
  }
}

int64_t read_pos(const at::Tensor& pos) {
  check(pos.numel() == 1, "pos must hold one position (batch-1, one-token decode)");
  return pos.scalar_type() == at::kInt ? pos.data_ptr<int32_t>()[0] : pos.data_ptr<int64_t>()[0];
}

}  // namespace

// y (N) = W (N, K) @ h (K): a matrix-vector product, fp32 accumulation, result in W's dtype.
void matvec_out(const at::Tensor& w, const at::Tensor& h, at::Tensor& y) {
  check(w.dim() == 2 && w.is_contiguous() && h.is_contiguous() && y.is_contiguous(), "contiguous W (N, K), h, y");
  check(h.numel() == w.size(1) && y.numel() == w.size(0), "shapes: W (N, K), h (K), y (N)");
  check(w.scalar_type() == y.scalar_type(), "y must have W's dtype");
  const int64_t n = w.size(0), k = w.size(1);
  at::Tensor hf = h.to(at::kFloat).contiguous();
  std::vector<float> out(n);
  dispatch(w.scalar_type(), [&](auto zero) {
    using scalar_t = decltype(zero);
    matvec(w.data_ptr<scalar_t>(), hf.data_ptr<float>(), out.data(), n, k);
    scalar_t* yp = y.data_ptr<scalar_t>();
    for (int64_t i = 0; i < n; i++) yp[i] = static_cast<scalar_t>(out[i]);
  });
}

void transformer_decode(const at::Tensor& x, const at::Tensor& pos, const at::Tensor& cos, const at::Tensor& sin,
                        const std::vector<at::Tensor>& input_norms, const std::vector<at::Tensor>& wqs,
                        const std::vector<at::Tensor>& wks, const std::vector<at::Tensor>& wvs,
                        const std::vector<at::Tensor>& wos, const std::vector<at::Tensor>& post_norms,
                        const std::vector<at::Tensor>& gates, const std::vector<at::Tensor>& ups,
                        const std::vector<at::Tensor>& downs, const std::vector<at::Tensor>& k_caches,
                        const std::vector<at::Tensor>& v_caches, const at::Tensor& final_norm,
                        const at::Tensor& lm_head, int64_t n_heads, int64_t n_kv_heads, double eps, at::Tensor& out) {
  check(x.dim() == 3 && x.size(0) == 1 && x.size(1) == 1, "x must be (1, 1, dim)");
  check(!wqs.empty(), "no layers");
  std::vector<Layer> layers;
  for (size_t i = 0; i < wqs.size(); i++) {
    layers.push_back({input_norms[i], wqs[i], wks[i], wvs[i], wos[i], post_norms[i], gates[i], ups[i], downs[i],
                      k_caches[i], v_caches[i]});
    for (const at::Tensor* t : {&wqs[i], &wks[i], &wvs[i], &wos[i], &gates[i], &ups[i], &downs[i], &k_caches[i],
                                &v_caches[i], &input_norms[i], &post_norms[i]}) {
      check(t->is_contiguous() && t->scalar_type() == x.scalar_type(), "weights and caches contiguous, x's dtype");
    }
    check(k_caches[i].size(0) == 1, "batch-1 caches");
  }
  const int64_t p = read_pos(pos);
  check(p >= 0 && p < k_caches[0].size(2), "pos beyond the cache");
  dispatch(x.scalar_type(), [&](auto zero) {
    using scalar_t = decltype(zero);
    decode_step<scalar_t>(x.data_ptr<scalar_t>(), p, cos.data_ptr<scalar_t>(), sin.data_ptr<scalar_t>(), layers,
                          final_norm.data_ptr<scalar_t>(), lm_head.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(),
                          x.size(2), lm_head.size(0), n_heads, n_kv_heads, static_cast<float>(eps));
  });
}

std::string isa() {
#if defined(CPU_CAPABILITY_AVX512)
  return "AVX512";
#elif defined(CPU_CAPABILITY_AVX2)
  return "AVX2";
#else
  return "DEFAULT";
#endif
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("matvec_out", &matvec_out, "y = W @ h (bf16 / fp32 W, fp32 accumulation)");
  m.def("transformer_decode", &transformer_decode, "one batch-1 decode step through every layer + LM head");
  m.def("isa", &isa, "the vector ISA this build was compiled for");
}
