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

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <string>
#include <type_traits>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <vector>

using at::vec::Vectorized;
using fVec = Vectorized<float>;

namespace {

// The OpenMP team of the calling thread (sized by the device's thread policy with omp_set_num_threads, i.e.
// torch.set_num_threads); one thread where the build has no OpenMP.
inline int team_size() {
#ifdef _OPENMP
  return omp_get_num_threads();
#else
  return 1;
#endif
}
inline int team_rank() {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

// This thread's share [b, e) of n items, in blocks of `block` so row groups are not split across threads.
inline void share(int64_t n, int64_t block, int64_t& b, int64_t& e) {
  const int64_t nt = team_size(), blocks = (n + block - 1) / block;
  const int64_t per = (blocks + nt - 1) / nt;
  b = std::min(n, team_rank() * per * block);
  e = std::min(n, b + per * block);
}

inline float hsum(const fVec& v) {
  return at::vec::vec_reduce_all<float>([](fVec& a, fVec& b) { return a + b; }, v);
}

// Software prefetch of the line at p (a hint: never faults, a no-op where the compiler has none), with
// locality HINT: 3 into L1 (prefetcht0), 2 into L2 (prefetcht1), 0 non-temporal (prefetchnta: past the
// caches a line read once need not stay in).
template <int HINT = 3>
inline void prefetch(const void* p) {
#if defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(p, 0, HINT);
#endif
}

// A non-owning reference to a callable (as std::function_ref): the row loops below take their row map and
// their store through one, so each is compiled once per tuning instantiation, not once per call site. An
// indirect call per row (or per block of rows) is noise beside the kilobyte row it streams.
template <typename Sig>
class FnRef;
template <typename Ret, typename... A>
class FnRef<Ret(A...)> {
 public:
  template <typename F>
  FnRef(F&& f)  // NOLINT: implicit, from a lambda at the call
      : obj_(const_cast<void*>(static_cast<const void*>(&f))),
        call_([](void* o, A... a) -> Ret { return (*static_cast<std::remove_reference_t<F>*>(o))(a...); }) {}
  Ret operator()(A... a) const { return call_(obj_, a...); }

 private:
  void* obj_;
  Ret (*call_)(void*, A...);
};

// R dot products at once: out[j] = rows[j][0:k] . h[0:k], weights in the model dtype, h in fp32 (L1-resident).
// R rows in flight share each load of h and give the core R independent streams to keep memory busy; the
// weights are widened to fp32 in registers (exact), accumulated in fp32. `next` (R rows, or null) are the rows
// the caller reads after these: each step prefetches the same columns of them, one block of rows ahead. One
// core's hardware prefetchers do not keep R interleaved streams in flight (a row is only 1-4 KB), so without
// this one thread waited on memory latency, streaming 7-12 GB/s where it can read 25-30 GB/s (2-core Xeon VM,
// AVX-512: the whole step on one thread 6.3-8.6 -> 3.5 ms; the convert and the reductions were not the limit).
// The j loops are unrolled so the accumulators live in registers (gcc kept them on the stack, a store and
// reload per FMA, which alone gained little: 6.0-6.2 ms).
template <int R, int HINT = 3>
inline void dot_rows(const float* const* rows, const float* const* next, const float* h, int64_t k, float* out) {
  constexpr int64_t L = fVec::size();
  fVec acc[R];
#pragma GCC unroll 16
  for (int j = 0; j < R; j++) acc[j] = fVec(0.f);
  int64_t i = 0;
  for (; i + L <= k; i += L) {
    const fVec hv = fVec::loadu(h + i);
    // one prefetch per 64-byte line of each row (fp32: every 64 / (4 L) steps)
    if (next && (i * 4) % 64 == 0) {
#pragma GCC unroll 16
      for (int j = 0; j < R; j++) prefetch<HINT>(next[j] + i);
    }
#pragma GCC unroll 16
    for (int j = 0; j < R; j++) acc[j] = at::vec::fmadd(fVec::loadu(rows[j] + i), hv, acc[j]);
  }
  for (int j = 0; j < R; j++) {
    float s = hsum(acc[j]);
    for (int64_t t = i; t < k; t++) s += rows[j][t] * h[t];
    out[j] = s;
  }
}

// The same over bf16 rows, h widened in registers with at::vec's convert_to_float (a shuffle per 8 weights); the
// row-streaming products below take an Activation instead, which needs no shuffle. Kept for attention (one
// short K row at a time against one query head).
template <int R>
inline void dot_rows(const at::BFloat16* const* rows, const at::BFloat16* const* next, const float* h, int64_t k,
                     float* out) {
  using bVec = Vectorized<at::BFloat16>;
  constexpr int64_t L = bVec::size();  // two fp32 vectors' worth
  constexpr int64_t F = fVec::size();
  fVec lo_acc[R], hi_acc[R];
#pragma GCC unroll 16
  for (int j = 0; j < R; j++) lo_acc[j] = hi_acc[j] = fVec(0.f);
  int64_t i = 0;
  for (; i + L <= k; i += L) {
    const fVec h0 = fVec::loadu(h + i), h1 = fVec::loadu(h + i + F);
    if (next) {
#pragma GCC unroll 16
      for (int j = 0; j < R; j++) prefetch(next[j] + i);
    }
#pragma GCC unroll 16
    for (int j = 0; j < R; j++) {
      auto [lo, hi] = at::vec::convert_to_float<at::BFloat16>(bVec::loadu(rows[j] + i));
      lo_acc[j] = at::vec::fmadd(lo, h0, lo_acc[j]);
      hi_acc[j] = at::vec::fmadd(hi, h1, hi_acc[j]);
    }
  }
  for (int j = 0; j < R; j++) {
    float s = hsum(lo_acc[j] + hi_acc[j]);
    for (int64_t t = i; t < k; t++) s += static_cast<float>(rows[j][t]) * h[t];
    out[j] = s;
  }
}

// The activation h[0:k] (fp32) of a matrix-vector product, as dot_rows reads it against rows of type T: fp32
// rows read h itself; bf16 rows read a copy with each block of 2F elements (F = fp32 lanes) split into its F
// even then its F odd elements (the tail past the last whole block as is), to match how those rows are widened
// (below). The copy is made once per product into this thread's scratch (k floats, stays in L1): one
// Activation<bf16> live per thread at a time.
template <typename T>
struct Activation {
  const float* h;
  Activation(const float* h, int64_t) : h(h) {}
};

// dst[0:k] = src with each whole block of 2F elements split into its F even then F odd elements (the layout
// bf16 rows widened by shift / AND meet; also the prefill's tiles, csrc/prefill.h).
inline void split_even_odd(const float* src, float* dst, int64_t k) {
  constexpr int64_t F = fVec::size();
  int64_t i = 0;
  for (; i + 2 * F <= k; i += 2 * F) {
    auto [even, odd] = at::vec::deinterleave2(fVec::loadu(src + i), fVec::loadu(src + i + F));
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    std::swap(even, odd);  // a 32-bit lane holds its even bf16 in its upper half here
#endif
    even.store(dst + i);
    odd.store(dst + i + F);
  }
  std::copy(src + i, src + k, dst + i);
}

template <>
struct Activation<at::BFloat16> {
  const float* h;
  Activation(const float* src, int64_t k) {
    static thread_local std::vector<float> scratch;
    scratch.resize(k);
    split_even_odd(src, scratch.data(), k);
    h = scratch.data();
  }
};

template <int R, int HINT = 3>
inline void dot_rows(const float* const* rows, const float* const* next, const Activation<float>& a, int64_t k,
                     float* out) {
  dot_rows<R, HINT>(rows, next, a.h, k, out);
}

// bf16 rows streamed without shuffles: a bf16 is the upper half of an fp32, so F 32-bit lanes loaded from 2F
// weights hold an (even, odd) pair each: lane << 16 is the even weight as an fp32 and lane & 0xFFFF0000 the
// odd one (exact; one shift and one AND per 2F weights, no shuffle). at::vec's convert_to_float widens with
// an extract, two cross-lane vpmovzxwd and two shifts per 2F weights, into two accumulators per row: on AVX2
// that was 2.29 ms per `small` bf16 step against 1.81 on AVX-512 (2 threads, 2-core Xeon VM, 8 rows); this
// is 1.73 on AVX2 and 1.82 on AVX-512 (bench/decode_isa.py), both at ~46-48 GB/s of weights.
// The products are the same exact fp32 products as before; only their summation order differs (even and
// odd columns into one accumulator per row, then its lanes), within fp32 rounding of any other order.
// One step covers a 64-byte line of each row, the line the prefetch of `next` asks for.
template <int R, int HINT = 3>
inline void dot_rows(const at::BFloat16* const* rows, const at::BFloat16* const* next,
                     const Activation<at::BFloat16>& a, int64_t k, float* out) {
  using iVec = Vectorized<int32_t>;
  constexpr int64_t F = fVec::size();
  constexpr int64_t L = 2 * F;                                 // bf16 weights per vector
  constexpr int64_t LINE = 64 / sizeof(at::BFloat16);          // bf16 weights per cache line
  constexpr int V = LINE >= L ? static_cast<int>(LINE / L) : 1;  // vectors per step
  const iVec sixteen(16), odd_bits(static_cast<int32_t>(0xFFFF0000u));
  const float* h = a.h;
  fVec acc[R];
#pragma GCC unroll 16
  for (int j = 0; j < R; j++) acc[j] = fVec(0.f);
  auto block = [&](int64_t i) {
    const fVec he = fVec::loadu(h + i), ho = fVec::loadu(h + i + F);
#pragma GCC unroll 16
    for (int j = 0; j < R; j++) {
      const iVec w = iVec::loadu(rows[j] + i);
      acc[j] = at::vec::fmadd(at::vec::cast<float>(w << sixteen), he, acc[j]);
      acc[j] = at::vec::fmadd(at::vec::cast<float>(w & odd_bits), ho, acc[j]);
    }
  };
  int64_t i = 0;
  for (; i + V * L <= k; i += V * L) {
    if (next) {
#pragma GCC unroll 16
      for (int j = 0; j < R; j++) prefetch<HINT>(next[j] + i);
    }
#pragma GCC unroll 4
    for (int v = 0; v < V; v++) block(i + v * L);
  }
  for (; i + L <= k; i += L) block(i);
  // every row's lane sum, then the scalar tails (measured ~4% faster on the AVX-512 step than row by row)
#pragma GCC unroll 16
  for (int j = 0; j < R; j++) out[j] = hsum(acc[j]);
  for (int j = 0; j < R; j++) {
    for (int64_t t = i; t < k; t++) out[j] += static_cast<float>(rows[j][t]) * h[t];
  }
}

// How the weight-streaming loops run on this machine: chosen by measuring at a DecodePlan's first step
// (nativelab.kernels.cpu.tune), forced with NATIVELAB_DECODE_CONFIG. None of these changes a value: every
// output is one row's dot product, accumulated in the same order whatever the rows per call, the prefetching,
// the thread that computes it or the prefill's tile (tests/test_decode_tuning.py checks the tokens).
// The defaults are what the kernels without a plan (core's one-token products) run with. On a 2-core Xeon VM
// (AVX-512) 4 rows per call with the next block prefetched into L1 was best (the whole `small` bf16 step, 2
// threads, ms, AVX-512 / AVX2: rows 2: 1.69 / 2.07, 4: 1.66 / 1.68, 6: 1.69 / 1.72, 8: 1.72 / 1.79); on a 2-core
// AMD EPYC Zen 4 that read 50-56% of a flat read of the step's bytes, and two blocks ahead into L2 94-102% (1 / 2
// threads; bench/decode_isa.py, /tmp sweep of every rows x ahead x hint), so the defaults are now those.
struct Tuning {
  int rows = 4;             // rows per dot_rows call (independent streams in flight): 2, 4 or 8
  int ahead = 2;            // software prefetch distance, in blocks of `rows` rows; 0: none
  int hint = 2;             // prefetch locality: 3 into L1 (prefetcht0), 2 into L2 (prefetcht1), 0 non-temporal
  bool interleave = false;  // row blocks dealt to the threads round-robin (else one contiguous share each)
  int tile_rows = 4;        // the prefill's tiles: weight rows (2 or 4) ...
  int tile_tokens = 0;      // ... by at most this many tokens (0: the build's most, TILE_T in prefill.h)
};

template <typename T>
using RowFn = FnRef<const T*(int64_t)>;                     // virtual row r's first element
using EmitFn = FnRef<void(int64_t, int64_t, const float*)>;  // rows r .. r + nr's products

// This thread's rows of n virtual rows, each k long, dotted with a: R rows per call, the rows of the block
// `ahead` blocks on in this thread's order prefetched with HINT; the rows past the last whole block in units
// of `unit` rows (n is a multiple of unit; R too). emit(r, nr, y) gets rows r .. r + nr's products.
template <int R, int HINT, typename T>
void stream_rows_as(int64_t n, int64_t unit, RowFn<T> row, const Activation<T>& a, int64_t k, int ahead,
                    bool interleave, EmitFn emit) {
  const int64_t nt = team_size(), me = team_rank();
  int64_t b = 0, e = 0, blocks;  // this thread's whole blocks: the q-th starts at first(q)
  if (interleave) {
    const int64_t whole = n / R;
    blocks = whole > me ? (whole - me + nt - 1) / nt : 0;
  } else {
    share(n, R, b, e);
    blocks = (e - b) / R;
  }
  const auto first = [&](int64_t q) { return interleave ? (me + q * nt) * R : b + q * R; };
  float y[R];
  const T *rows[R], *next[R];
  for (int64_t q = 0; q < blocks; q++) {
    const int64_t r = first(q);
    for (int j = 0; j < R; j++) rows[j] = row(r + j);
    if (ahead > 0) {
      const int64_t rn = first(std::min(q + ahead, blocks - 1));
      for (int j = 0; j < R; j++) next[j] = row(rn + j);
    }
    dot_rows<R, HINT>(rows, ahead > 0 ? next : nullptr, a, k, y);
    emit(r, R, y);
  }
  // the rest: after this thread's blocks in its own share, or the rows past every whole block dealt in units
  int64_t r = interleave ? n / R * R + me * unit : b + blocks * R;
  const int64_t end = interleave ? n : e, stride = interleave ? nt * unit : unit;
  for (; r < end; r += stride) {
    for (int64_t j = 0; j < unit; j++) rows[j] = row(r + j);
    if (unit == 2) {
      dot_rows<2>(rows, static_cast<const T* const*>(nullptr), a, k, y);
    } else {
      for (int64_t j = 0; j < unit; j++) dot_rows<1>(rows + j, static_cast<const T* const*>(nullptr), a, k, y + j);
    }
    emit(r, unit, y);
  }
}

// stream_rows_as for the tuning's rows per call and prefetch hint (unit: 1 or 2, rows a multiple of it).
template <typename T>
void stream_rows(const Tuning& tu, int64_t n, int64_t unit, RowFn<T> row, const Activation<T>& a, int64_t k,
                 EmitFn emit) {
  const auto go = [&](auto r_tag, auto hint_tag) {
    stream_rows_as<decltype(r_tag)::value, decltype(hint_tag)::value, T>(n, unit, row, a, k, tu.ahead,
                                                                         tu.interleave, emit);
  };
  const auto with_hint = [&](auto r_tag) {
    switch (tu.hint) {
      case 2: return go(r_tag, std::integral_constant<int, 2>{});
      case 0: return go(r_tag, std::integral_constant<int, 0>{});
      default: return go(r_tag, std::integral_constant<int, 3>{});
    }
  };
  switch (tu.rows) {
    case 2: return with_hint(std::integral_constant<int, 2>{});
    case 8: return with_hint(std::integral_constant<int, 8>{});
    default: return with_hint(std::integral_constant<int, 4>{});
  }
}

// y[r] = W[r, :] . h for this thread's rows r of [0, n) (W row-major [n, k], contiguous); call inside a team.
template <typename T, typename Store>
void matvec_share(const Tuning& tu, const T* w, const float* h, int64_t n, int64_t k, Store&& store) {
  const Activation<T> a(h, k);
  stream_rows<T>(tu, n, 1, [&](int64_t r) { return w + r * k; }, a, k, [&](int64_t r, int64_t nr, const float* y) {
    for (int64_t j = 0; j < nr; j++) store(r + j, y[j]);
  });
}

template <typename T>
inline float to_f(T v) { return static_cast<float>(v); }

template <typename T>
inline float rnd(float v) { return static_cast<float>(static_cast<T>(v)); }  // round to the model dtype

// out = rnd(x * rsqrt(mean(x^2) + eps)) * w, rounded again (the model's RMSNorm in its dtype)
template <typename T>
void rmsnorm(const float* x, const T* w, float* out, int64_t n, float eps) {
  float ss = 0.f;
  for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
  const float r = 1.f / std::sqrt(ss / n + eps);
  for (int64_t i = 0; i < n; i++) out[i] = rnd<T>(rnd<T>(x[i] * r) * to_f(w[i]));
}

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

#ifdef _OPENMP
#define NL_BARRIER _Pragma("omp barrier")
#else
#define NL_BARRIER
#endif

// Q, K and V rows (one pass over the three weights) for this thread's share: qkv = rnd([wq; wk; wv] @ h).
template <typename T>
void qkv_rows(const Tuning& tu, const T* wq, const T* wk, const T* wv, const float* h, int64_t dim, int64_t nq,
              int64_t nk, float* qkv) {
  auto row = [&](int64_t r) {
    return r < nq ? wq + r * dim : r < nq + nk ? wk + (r - nq) * dim : wv + (r - nq - nk) * dim;
  };
  const Activation<T> a(h, dim);
  stream_rows<T>(tu, nq + 2 * nk, 1, row, a, dim, [&](int64_t r, int64_t nr, const float* out) {
    for (int64_t j = 0; j < nr; j++) qkv[r + j] = rnd<T>(out[j]);
  });
}

// act = rnd(SiLU(rnd(gate @ h)) * rnd(up @ h)) for this thread's share of the rows: gate and up row i as
// virtual rows 2i and 2i + 1, so a call holds both halves of its outputs.
template <typename T>
void swiglu_rows(const Tuning& tu, const T* wg, const T* wu, const float* h, int64_t dim, int64_t ffn, float* act) {
  const Activation<T> a(h, dim);
  auto silu_mul = [](float g, float u) { return rnd<T>(rnd<T>(g / (1.f + std::exp(-g))) * u); };
  stream_rows<T>(tu, 2 * ffn, 2, [&](int64_t r) { return (r % 2 ? wu : wg) + (r / 2) * dim; }, a, dim,
                 [&](int64_t r, int64_t nr, const float* out) {
                   for (int64_t j = 0; j < nr; j += 2) act[(r + j) / 2] = silu_mul(rnd<T>(out[j]), rnd<T>(out[j + 1]));
                 });
}

// The query heads of KV group g (q: roped, fp32) over cache positions 0..pos -> att (fp32, rounded to T).
// p (pos + 1) and qh (d) are the caller's scratch.
template <typename T>
void attend_group(int64_t g, const float* q, const T* kc, const T* vc, int64_t pos, int64_t s_len, int64_t d,
                  int64_t group, float* att, float* p, float* qh) {
  const float scale = 1.f / std::sqrt(static_cast<float>(d));
  for (int64_t hh = g * group; hh < (g + 1) * group; hh++) {
    for (int64_t i = 0; i < d; i++) qh[i] = rnd<T>(q[hh * d + i]);
    float mx = -INFINITY;
    for (int64_t j = 0; j <= pos; j++) {
      const T* kr = kc + (g * s_len + j) * d;
      dot_rows<1>(&kr, static_cast<const T* const*>(nullptr), qh, d, &p[j]);
      p[j] = rnd<T>(p[j]) * scale;
      mx = std::max(mx, p[j]);
    }
    float sum = 0.f;
    for (int64_t j = 0; j <= pos; j++) sum += (p[j] = std::exp(p[j] - mx));
    float* o = att + hh * d;
    std::fill(o, o + d, 0.f);
    for (int64_t j = 0; j <= pos; j++) {
      const float pj = rnd<T>(p[j] / sum);
      const T* vr = vc + (g * s_len + j) * d;
      for (int64_t i = 0; i < d; i++) o[i] += pj * to_f(vr[i]);
    }
    for (int64_t i = 0; i < d; i++) o[i] = rnd<T>(o[i]);
  }
}

// k and v (fp32) of KV group g into the caches at position pos.
template <typename T>
void write_cache(int64_t g, const float* k, const float* v, T* kc, T* vc, int64_t pos, int64_t s_len, int64_t d) {
  for (int64_t i = 0; i < d; i++) {
    kc[(g * s_len + pos) * d + i] = static_cast<T>(k[i]);
    vc[(g * s_len + pos) * d + i] = static_cast<T>(v[i]);
  }
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

// A model's tensors by name, as Python's DecodeWeights.named() gives them (kernels/ops/decode_weights.py): each
// field a list, one tensor for a per-model field, one per layer for a per-layer one.
using Named = std::map<std::string, std::vector<at::Tensor>>;

// The fields this code computes with, each read by its name once below (a test checks that DecodeWeights has
// every one of them).
const std::vector<std::string> kFieldsRead = {"embed", "input_norms", "wqs", "wks", "wvs", "wos", "post_norms",
                                              "gates", "ups", "downs", "final_norm", "lm_head", "k_caches",
                                              "v_caches"};

struct Model {
  at::Tensor embed, final_norm, lm_head;
  std::vector<Layer> layers;
  std::vector<std::string> names;  // every field bound, those this code does not read too
};

// The Model of these named tensors, checked: every field (whether this code reads it or not) contiguous and in
// the embedding's dtype, a per-layer field one tensor per layer. Done once per model (a DecodePlan) or call.
Model bind_model(const Named& w) {
  const auto field = [&](const std::string& name) -> const std::vector<at::Tensor>& {
    const auto it = w.find(name);
    check(it != w.end(), "the weights have no field '" + name + "' (DecodeWeights.named())");
    return it->second;
  };
  const auto one = [&](const std::string& name) {
    check(field(name).size() == 1, name + ": one tensor");
    return field(name)[0];
  };
  Model m{one("embed"), one("final_norm"), one("lm_head"), {}, {}};
  const size_t n = field("wqs").size();
  check(n > 0, "no layers");
  const auto layer = [&](const std::string& name, size_t i) {
    check(field(name).size() == n, name + ": one tensor per layer (" + std::to_string(n) + ")");
    return field(name)[i];
  };
  for (size_t i = 0; i < n; i++) {
    m.layers.push_back({layer("input_norms", i), layer("wqs", i), layer("wks", i), layer("wvs", i),
                        layer("wos", i), layer("post_norms", i), layer("gates", i), layer("ups", i),
                        layer("downs", i), layer("k_caches", i), layer("v_caches", i)});
    check(m.layers[i].k_cache.dim() == 4 && m.layers[i].k_cache.size(0) == 1 &&
              m.layers[i].v_cache.sizes() == m.layers[i].k_cache.sizes(),
          "batch-1 caches (1, kv_heads, S, head_dim)");
  }
  const auto dtype = m.embed.scalar_type();
  for (const auto& [name, ts] : w) {
    m.names.push_back(name);
    for (const at::Tensor& t : ts) {
      check(t.is_contiguous() && t.scalar_type() == dtype, name + ": contiguous, in the embedding's dtype");
    }
  }
  check(m.embed.dim() == 2, "embedding table (vocab, dim)");
  check(m.lm_head.dim() == 2 && m.lm_head.size(1) == m.embed.size(1), "lm_head (vocab, dim)");
  return m;
}

}  // namespace

#include "prefill.h"  // a prompt's tiles (each weight row read once for all its tokens), the row-wise helpers

namespace {

// ---- One step through every layer: a decode step (one token) or a prompt's prefill (T tokens) ----

// This thread's share of the products of n virtual weight rows (row(r): row r, k long) with the activation rows
// t0 .. t1 of h (stride ldh): store(r, nr, t, nt, o, ld) gets rows r .. r + nr for tokens t .. t + nt, o[j * ld
// + u] for row r + j and token t + u (n and the share in units of `unit` rows). One token streams each weight row
// once against its activation (stream_rows); a prompt's tokens take tiles of rows by up to TILE_T tokens
// (tile_rows), so memory sees each weight once for all of them. Either way an output is one row's dot product.
template <bool PROMPT, typename T, typename Row, typename Store>
inline void products(const Tuning& tu, int64_t n, int64_t unit, Row&& row, const float* h, int64_t ldh, int64_t k,
                     int64_t t0, int64_t t1, Store&& store) {
  if constexpr (PROMPT) {
    tile_rows<T>(tu, n, unit, row, h, ldh, k, t0, t1,
                 [&](int64_t r, int64_t nr, int64_t t, int64_t nt, const float* o) { store(r, nr, t, nt, o, TILE_T); });
  } else {
    const Activation<T> a(h + t0 * ldh, k);
    stream_rows<T>(tu, n, unit, row, a, k, [&](int64_t r, int64_t nr, const float* o) { store(r, nr, t0, 1, o, 1); });
  }
}

// n_tok tokens x_in (their embedding rows) at positions pos0 .. pos0 + n_tok - 1 through every layer of m,
// writing their cache rows; then the final norm and the LM head for the last token only: logits (vocab). cos /
// sin: n_tok rows of head_dim in the model dtype. PROMPT (n_tok > 1) changes only how the products run
// (`products`) and where SwiGLU's SiLU runs: a decode step and a prefill are this one loop, so they round to
// the model dtype at the same points by construction (rnd and the *_row helpers, where the reference rounds;
// fp32 in between), and a prompt's cache rows and last logits are what n_tok decode steps would give.
// One OpenMP team for the whole step (no fork/join per matrix): each phase splits its rows (or KV-head groups)
// across the team and ends at a barrier; the residual stream and the normed rows (n_tok x dim, a few KB each)
// are computed by every thread into its own copy, so no phase waits for a single thread.
template <typename T, bool PROMPT>
void layers_step(const Tuning& tu, const T* const* x_in, int64_t n_tok, int64_t pos0, const T* cos, const T* sin,
                 const Model& m, T* logits, int64_t n_heads, int64_t n_kv, float eps) {
  const std::vector<Layer>& layers = m.layers;
  const int64_t dim = m.lm_head.size(1), vocab = m.lm_head.size(0);
  const int64_t d = layers[0].wq.size(0) / n_heads;
  const int64_t ffn = layers[0].gate.size(0);
  const int64_t s_len = layers[0].k_cache.size(2);
  const int64_t group = n_heads / n_kv;
  const int64_t nq = n_heads * d, nk = n_kv * d, nqkv = nq + 2 * nk;
  // shared between the team: what one phase writes and the next reads, one row per token
  std::vector<float> qkv(n_tok * nqkv), att(n_tok * nq), act(n_tok * ffn), y(n_tok * dim);
  std::vector<float> gate_out(n_tok * ffn), up_out(n_tok * ffn);  // raw gate / up products (SwiGLU's inputs)
#ifdef _OPENMP
#pragma omp parallel
#endif
  {
    // this thread's own: the residual stream and normed rows of every token, attention scratch
    std::vector<float> x(n_tok * dim), h(n_tok * dim), p(pos0 + n_tok), qh(d), tmp(dim), norm_w(dim);
    const auto widen = [&](const T* w) {  // a norm weight in fp32, once per use
      for (int64_t i = 0; i < dim; i++) norm_w[i] = to_f(w[i]);
      return norm_w.data();
    };
    for (int64_t t = 0; t < n_tok; t++) {
      for (int64_t i = 0; i < dim; i++) x[t * dim + i] = to_f(x_in[t][i]);
    }
    for (size_t l = 0; l < layers.size(); l++) {
      const Layer& L = layers[l];
      // After the last layer's cache writes only the last token matters (its logits are all we return).
      const int64_t first = l + 1 == layers.size() ? n_tok - 1 : 0;
      const float* in_w = widen(ptr<T>(L.in_norm));
      for (int64_t t = 0; t < n_tok; t++) rmsnorm_row<T>(x.data() + t * dim, in_w, h.data() + t * dim, dim, eps);
      {  // Q, K and V rows in one pass over the three weights: qkv = rnd([wq; wk; wv] @ h)
        const T *wq = ptr<T>(L.wq), *wk = ptr<T>(L.wk), *wv = ptr<T>(L.wv);
        auto row = [&](int64_t r) {
          return r < nq ? wq + r * dim : r < nq + nk ? wk + (r - nq) * dim : wv + (r - nq - nk) * dim;
        };
        products<PROMPT, T>(tu, nqkv, 1, row, h.data(), dim, dim, 0, n_tok,
                            [&](int64_t r, int64_t nr, int64_t t, int64_t nt, const float* o, int64_t ld) {
                              for (int64_t j = 0; j < nr; j++) {
                                for (int64_t u = 0; u < nt; u++) qkv[(t + u) * nqkv + r + j] = rnd<T>(o[j * ld + u]);
                              }
                            });
      }
      NL_BARRIER
      // per KV-head group: RoPE on every token's K, the cache writes, then each token's queries over cache
      // positions 0..its own (the group's rows of earlier tokens are written by this thread just before)
      {
        T* kc = L.k_cache.data_ptr<T>();  // (1, n_kv, S, d)
        T* vc = L.v_cache.data_ptr<T>();
        int64_t gb, ge;
        share(n_kv, 1, gb, ge);
        for (int64_t g = gb; g < ge; g++) {
          for (int64_t t = 0; t < n_tok; t++) {
            float* row = qkv.data() + t * nqkv;
            rope(row + nq + g * d, cos + t * d, sin + t * d, d);
            write_cache(g, row + nq + g * d, row + nq + nk + g * d, kc, vc, pos0 + t, s_len, d);
          }
          for (int64_t t = first; t < n_tok; t++) {
            float* row = qkv.data() + t * nqkv;
            for (int64_t hh = g * group; hh < (g + 1) * group; hh++) rope(row + hh * d, cos + t * d, sin + t * d, d);
            attend_group(g, row, kc, vc, pos0 + t, s_len, d, group, att.data() + t * nq, p.data(), qh.data());
          }
        }
      }
      NL_BARRIER
      const auto to_y = [&](int64_t r, int64_t nr, int64_t t, int64_t nt, const float* o, int64_t ld) {
        for (int64_t j = 0; j < nr; j++) {
          for (int64_t u = 0; u < nt; u++) y[(t + u) * dim + r + j] = o[j * ld + u];
        }
      };
      {
        const T* wo = ptr<T>(L.wo);
        products<PROMPT, T>(tu, dim, 1, [&](int64_t r) { return wo + r * nq; }, att.data(), nq, nq, first, n_tok,
                            to_y);
      }
      NL_BARRIER
      const float* post_w = widen(ptr<T>(L.post_norm));
      for (int64_t t = first; t < n_tok; t++) {
        float* xt = x.data() + t * dim;
        residual_row<T>(xt, y.data() + t * dim, tmp.data(), dim);
        rmsnorm_row<T>(xt, post_w, h.data() + t * dim, dim, eps);
      }
      {
        // act = rnd(SiLU(rnd(gate @ h)) * rnd(up @ h)): gate and up row i as virtual rows 2i and 2i + 1, so a
        // call holds both halves of its outputs. One token: SiLU on those rows as they come (a few per call); a
        // prompt: on this thread's share after its tiles, vectorized along each token's row.
        const T *wg = ptr<T>(L.gate), *wu = ptr<T>(L.up);
        products<PROMPT, T>(tu, 2 * ffn, 2, [&](int64_t r) { return (r % 2 ? wu : wg) + (r / 2) * dim; }, h.data(),
                            dim, dim, first, n_tok,
                            [&](int64_t r, int64_t nr, int64_t t, int64_t nt, const float* o, int64_t ld) {
                              for (int64_t u = 0; u < nt; u++) {
                                const int64_t at = (t + u) * ffn + r / 2;
                                for (int64_t j = 0; j < nr; j += 2) {
                                  gate_out[at + j / 2] = o[j * ld + u];
                                  up_out[at + j / 2] = o[(j + 1) * ld + u];
                                }
                                if constexpr (!PROMPT) {
                                  silu_mul_row<T>(gate_out.data() + at, up_out.data() + at, act.data() + at, nr / 2);
                                }
                              }
                            });
        if constexpr (PROMPT) {
          int64_t b, e;  // this thread's gate / up rows (tile_rows' share)
          share(2 * ffn, tile_rows_of(tu), b, e);
          for (int64_t t = first; t < n_tok; t++) {
            silu_mul_row<T>(gate_out.data() + t * ffn + b / 2, up_out.data() + t * ffn + b / 2,
                            act.data() + t * ffn + b / 2, (e - b) / 2);
          }
        }
      }
      NL_BARRIER
      {
        const T* wd = ptr<T>(L.down);
        products<PROMPT, T>(tu, dim, 1, [&](int64_t r) { return wd + r * ffn; }, act.data(), ffn, ffn, first, n_tok,
                            to_y);
      }
      NL_BARRIER
      for (int64_t t = first; t < n_tok; t++) residual_row<T>(x.data() + t * dim, y.data() + t * dim, tmp.data(), dim);
    }
    const float* last = x.data() + (n_tok - 1) * dim;
    rmsnorm_row<T>(last, widen(ptr<T>(m.final_norm)), h.data(), dim, eps);
    matvec_share(tu, ptr<T>(m.lm_head), h.data(), vocab, dim, [&](int64_t r, float v) { logits[r] = static_cast<T>(v); });
  }
}

}  // namespace

// y (N) = W (N, K) @ h (K): a matrix-vector product, fp32 accumulation, result in W's dtype.
void matvec_out(const at::Tensor& w, const at::Tensor& h, at::Tensor& y) {
  check(w.dim() == 2 && w.is_contiguous() && h.is_contiguous() && y.is_contiguous(), "contiguous W (N, K), h, y");
  check(h.numel() == w.size(1) && y.numel() == w.size(0), "shapes: W (N, K), h (K), y (N)");
  check(w.scalar_type() == y.scalar_type(), "y must have W's dtype");
  const int64_t n = w.size(0), k = w.size(1);
  at::Tensor hf = h.to(at::kFloat).contiguous();
  dispatch(w.scalar_type(), [&](auto zero) {
    using scalar_t = decltype(zero);
    const scalar_t* wp = w.data_ptr<scalar_t>();
    const float* hp = hf.data_ptr<float>();
    scalar_t* yp = y.data_ptr<scalar_t>();
#ifdef _OPENMP
#pragma omp parallel
#endif
    matvec_share(Tuning{}, wp, hp, n, k, [&](int64_t r, float v) { yp[r] = static_cast<scalar_t>(v); });
  });
}

// One decode step of x (1, 1, dim) at pos through the named model (its embedding unused) into out (vocab).
void transformer_decode(const at::Tensor& x, const at::Tensor& pos, const at::Tensor& cos, const at::Tensor& sin,
                        const Named& weights, int64_t n_heads, int64_t n_kv_heads, double eps, at::Tensor& out) {
  check(x.dim() == 3 && x.size(0) == 1 && x.size(1) == 1, "x must be (1, 1, dim)");
  const Model m = bind_model(weights);
  check(x.scalar_type() == m.embed.scalar_type(), "x in the weights' dtype");
  const int64_t p = read_pos(pos);
  check(p >= 0 && p < m.layers[0].k_cache.size(2), "pos beyond the cache");
  dispatch(x.scalar_type(), [&](auto zero) {
    using scalar_t = decltype(zero);
    const scalar_t* row = x.data_ptr<scalar_t>();
    layers_step<scalar_t, false>(Tuning{}, &row, 1, p, cos.data_ptr<scalar_t>(), sin.data_ptr<scalar_t>(), m,
                                 out.data_ptr<scalar_t>(), n_heads, n_kv_heads, static_cast<float>(eps));
  });
}

// The core tier's kernels for one token (batch 1), each one OpenMP team.

// q_out (1, H, 1, d), k_out / v_out (1, KV, 1, d) = RoPE(rmsnorm(x) @ wq), RoPE(... @ wk), ... @ wv.
void qkv_decode(const at::Tensor& x, const at::Tensor& norm_w, const at::Tensor& wq, const at::Tensor& wk,
                const at::Tensor& wv, const at::Tensor& cos, const at::Tensor& sin, int64_t n_heads,
                int64_t n_kv_heads, double eps, at::Tensor& q_out, at::Tensor& k_out, at::Tensor& v_out) {
  check(x.numel() == x.size(-1) && wq.size(0) % n_heads == 0, "x must be one token (1, 1, dim)");
  const int64_t dim = x.size(-1), d = wq.size(0) / n_heads, nq = n_heads * d, nk = n_kv_heads * d;
  check(wk.size(0) == nk && wv.size(0) == nk && q_out.numel() == nq && k_out.numel() == nk, "head counts");
  dispatch(x.scalar_type(), [&](auto zero) {
    using T = decltype(zero);
    std::vector<float> qkv(nq + 2 * nk);
#ifdef _OPENMP
#pragma omp parallel
#endif
    {
      std::vector<float> h(dim), xf(dim);
      for (int64_t i = 0; i < dim; i++) xf[i] = to_f(ptr<T>(x)[i]);
      rmsnorm(xf.data(), ptr<T>(norm_w), h.data(), dim, static_cast<float>(eps));
      qkv_rows(Tuning{}, ptr<T>(wq), ptr<T>(wk), ptr<T>(wv), h.data(), dim, nq, nk, qkv.data());
    }
    const T *c = ptr<T>(cos), *sn = ptr<T>(sin);
    for (int64_t hh = 0; hh < n_heads + n_kv_heads; hh++) rope(qkv.data() + hh * d, c, sn, d);
    T *q = q_out.data_ptr<T>(), *k = k_out.data_ptr<T>(), *v = v_out.data_ptr<T>();
    for (int64_t i = 0; i < nq; i++) q[i] = static_cast<T>(qkv[i]);
    for (int64_t i = 0; i < nk; i++) k[i] = static_cast<T>(qkv[nq + i]);
    for (int64_t i = 0; i < nk; i++) v[i] = static_cast<T>(qkv[nq + nk + i]);
  });
}

// k_new / v_new (1, KV, 1, d) into the caches (1, KV, S, d) at pos, then q (1, H, 1, d) over positions 0..pos.
void attention_decode(const at::Tensor& q, const at::Tensor& k_new, const at::Tensor& v_new, at::Tensor& k_cache,
                      at::Tensor& v_cache, const at::Tensor& pos, at::Tensor& out) {
  const int64_t n_heads = q.size(1), n_kv = k_cache.size(1), s_len = k_cache.size(2), d = q.size(3);
  check(q.size(0) == 1 && q.size(2) == 1 && n_heads % n_kv == 0, "q must be (1, heads, 1, head_dim)");
  const int64_t p = read_pos(pos);
  check(p >= 0 && p < s_len, "pos beyond the cache");
  dispatch(q.scalar_type(), [&](auto zero) {
    using T = decltype(zero);
    std::vector<float> qf(n_heads * d), att(n_heads * d), k(n_kv * d), v(n_kv * d);
    for (int64_t i = 0; i < n_heads * d; i++) qf[i] = to_f(ptr<T>(q)[i]);
    for (int64_t i = 0; i < n_kv * d; i++) k[i] = to_f(ptr<T>(k_new)[i]), v[i] = to_f(ptr<T>(v_new)[i]);
    T *kc = k_cache.data_ptr<T>(), *vc = v_cache.data_ptr<T>();
#ifdef _OPENMP
#pragma omp parallel
#endif
    {
      std::vector<float> sc(p + 1), qh(d);
      int64_t gb, ge;
      share(n_kv, 1, gb, ge);
      for (int64_t g = gb; g < ge; g++) {
        write_cache(g, k.data() + g * d, v.data() + g * d, kc, vc, p, s_len, d);
        attend_group(g, qf.data(), kc, vc, p, s_len, d, n_heads / n_kv, att.data(), sc.data(), qh.data());
      }
    }
    T* o = out.data_ptr<T>();
    for (int64_t i = 0; i < n_heads * d; i++) o[i] = static_cast<T>(att[i]);
  });
}

// out (1, 1, dim) = [x +] down @ (SiLU(gate @ h) * (up @ h)), h = rmsnorm(x), or h = x without norm_w (the
// guide's core tier: its transformer_block normalizes before calling nki_mlp).
void mlp_decode(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& up, const at::Tensor& down,
                const std::optional<at::Tensor>& norm_w, double eps, bool residual, at::Tensor& out) {
  check(x.numel() == x.size(-1), "x must be one token (1, 1, dim)");
  const int64_t dim = x.size(-1), ffn = gate.size(0);
  check(up.size(0) == ffn && down.size(0) == dim && down.size(1) == ffn, "weights [ffn, dim], [dim, ffn]");
  dispatch(x.scalar_type(), [&](auto zero) {
    using T = decltype(zero);
    std::vector<float> act(ffn), xf(dim);
    for (int64_t i = 0; i < dim; i++) xf[i] = to_f(ptr<T>(x)[i]);
    T* o = out.data_ptr<T>();
#ifdef _OPENMP
#pragma omp parallel
#endif
    {
      std::vector<float> h(dim);
      if (norm_w.has_value())
        rmsnorm(xf.data(), ptr<T>(*norm_w), h.data(), dim, static_cast<float>(eps));
      else
        std::copy(xf.begin(), xf.end(), h.begin());  // x's values: exact in float
      swiglu_rows(Tuning{}, ptr<T>(gate), ptr<T>(up), h.data(), dim, ffn, act.data());
      NL_BARRIER
      matvec_share(Tuning{}, ptr<T>(down), act.data(), dim, ffn, [&](int64_t r, float y) {
        o[r] = static_cast<T>(residual ? xf[r] + rnd<T>(y) : y);
      });
    }
  });
}


// ---- The experimental tier's whole decode step, bound once (DecodePlan) ----
// Token in, next token (or logits) out: embedding row, RoPE rows from the model's tables, every layer, final
// norm, LM head and the greedy argmax in one call. The weights, caches and tables are checked and their
// pointers taken once, when the plan is made (the kernel interface makes one per set of tensors and keeps
// it), so a step passes only the token, the position and its outputs: no per-step list of 66 tensors.
#include "sample.h"  // the sampler's draw (sample_draw), for DecodePlan::draw

namespace {

// The sampler's state: an int64 [seed, counter] tensor.
void check_seed_state(const at::Tensor& seed_state) {
  check(seed_state.scalar_type() == at::kLong && seed_state.numel() == 2 && seed_state.is_contiguous(),
        "seed_state: int64 [seed, counter]");
}

// The token sample_draw draws from the last row of logits (the row a step draws from).
int64_t draw_row(const at::Tensor& logits, int64_t vocab, const at::Tensor& seed_state, double temperature,
                 int64_t top_k, double top_p, SampleScratch& scratch) {
  check(logits.is_contiguous() && logits.numel() >= vocab && logits.numel() % vocab == 0,
        "logits: contiguous rows of the vocabulary");
  check(vocab < (int64_t{1} << 24), "vocabulary below 2^24 tokens");  // the draw keeps indices in fp32 lanes
  const int64_t* st = seed_state.data_ptr<int64_t>();
  int64_t token = 0;
  dispatch(logits.scalar_type(), [&](auto zero) {
    using T = decltype(zero);
    token = sample_draw(logits.data_ptr<T>() + logits.numel() - vocab, vocab, st[0], st[1], temperature, top_k,
                        top_p, scratch);
  });
  return token;
}

// First index of the largest value, NaN counting as the largest (as torch.argmax).
template <typename T>
int64_t argmax(const T* v, int64_t n) {
  int64_t best = 0;
  float bv = to_f(v[0]);
  for (int64_t i = 1; i < n; i++) {
    const float x = to_f(v[i]);
    if (std::isnan(bv)) break;
    if (x > bv || std::isnan(x)) bv = x, best = i;
  }
  return best;
}

class DecodePlan {
 public:
  DecodePlan(const Named& weights, const at::Tensor& cos_table, const at::Tensor& sin_table, int64_t n_heads,
             int64_t n_kv_heads, double eps)
      : model_(bind_model(weights)), n_heads_(n_heads), n_kv_(n_kv_heads), eps_(static_cast<float>(eps)) {
    check(n_heads > 0 && n_kv_heads > 0 && n_heads % n_kv_heads == 0, "heads: a multiple of the KV heads");
    const auto dtype = model_.embed.scalar_type();
    const int64_t d = model_.layers[0].wq.size(0) / n_heads;
    check(cos_table.dim() == 2 && cos_table.size(1) == d && sin_table.sizes() == cos_table.sizes() &&
              cos_table.is_contiguous() && sin_table.is_contiguous(),
          "RoPE tables (max_seq_len, head_dim), contiguous");
    check(cos_table.scalar_type() == sin_table.scalar_type() &&
              (cos_table.scalar_type() == dtype || cos_table.scalar_type() == at::kFloat),
          "RoPE tables in the model dtype or float32");
    // Read live at each step (one row each), so the plan holds no copy that could go stale.
    cos_ = cos_table;
    sin_ = sin_table;
  }

  // The names of the fields bound (DecodeWeights' fields: those this code does not read too).
  std::vector<std::string> names() const { return model_.names; }

  // How the step's and the prefill's loops run from now on (see Tuning); values checked here.
  void configure(int64_t rows, int64_t ahead, int64_t hint, bool interleave, int64_t tile_rows,
                 int64_t tile_tokens) {
    check(rows == 2 || rows == 4 || rows == 8, "tuning: rows per call must be 2, 4 or 8");
    check(ahead >= 0 && ahead <= 8, "tuning: prefetch distance must be 0..8 blocks");
    check(hint == 0 || hint == 2 || hint == 3, "tuning: prefetch hint must be 3 (L1), 2 (L2) or 0 (non-temporal)");
    check(tile_rows == 2 || tile_rows == TILE_R, "tuning: prefill tile rows must be 2 or 4");
    check(tile_tokens >= 1 && tile_tokens <= TILE_T, "tuning: prefill tile tokens must be 1.." + std::to_string(TILE_T));
    tuning_ = {static_cast<int>(rows), static_cast<int>(ahead), static_cast<int>(hint), interleave,
               static_cast<int>(tile_rows), static_cast<int>(tile_tokens)};
  }

  // (rows, ahead, hint, interleave, tile_rows, tile_tokens) now in use.
  std::tuple<int64_t, int64_t, int64_t, bool, int64_t, int64_t> tuning() const {
    return {tuning_.rows, tuning_.ahead, tuning_.hint, tuning_.interleave, tile_rows_of(tuning_),
            tile_tokens_of(tuning_)};
  }

  // The fastest of `calls` runs (seconds) of the current tuning on the bound weights: a decode step (n_tok 1)
  // or a prefill of n_tok tokens, from token 0 at position 0, for the tuner. What those runs write into the
  // caches (positions 0 .. n_tok - 1 of every layer) is put back after, so the plan's state is unchanged.
  double measure(int64_t n_tok, int64_t calls) {
    check(n_tok >= 1 && n_tok <= model_.layers[0].k_cache.size(2) && n_tok <= cos_.size(0), "measure: n_tok");
    check(calls >= 1, "measure: calls >= 1");
    std::vector<at::Tensor> saved;
    using at::indexing::Slice;
    for (const Layer& L : model_.layers) {
      saved.push_back(L.k_cache.index({Slice(), Slice(), Slice(0, n_tok)}).clone());
      saved.push_back(L.v_cache.index({Slice(), Slice(), Slice(0, n_tok)}).clone());
    }
    at::Tensor logits = at::empty({model_.lm_head.size(0)}, model_.lm_head.options());
    const at::Tensor toks = at::zeros({1, n_tok}, at::kLong), positions = at::arange(n_tok, at::kLong);
    double best = INFINITY;
    for (int64_t c = 0; c < calls; c++) {
      const auto t0 = std::chrono::steady_clock::now();
      run(toks, positions, logits);
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    for (size_t i = 0; i < model_.layers.size(); i++) {
      model_.layers[i].k_cache.index({Slice(), Slice(), Slice(0, n_tok)}).copy_(saved[2 * i]);
      model_.layers[i].v_cache.index({Slice(), Slice(), Slice(0, n_tok)}).copy_(saved[2 * i + 1]);
    }
    return best;
  }

  // The step's logits (1, 1, vocab), in the model dtype, into logits.
  void step(const at::Tensor& token, const at::Tensor& pos, at::Tensor& logits) { run(token, pos, logits); }

  // The step's logits, and the greedy next token into out (int64, one element); the sampler's counter
  // advances as for any draw (the device sampler's seed_state [seed, counter]).
  void greedy(const at::Tensor& token, const at::Tensor& pos, at::Tensor& seed_state, at::Tensor& logits,
              at::Tensor& out) {
    check(out.scalar_type() == at::kLong && out.numel() == 1, "out: one int64 token");
    check_seed_state(seed_state);
    run(token, pos, logits);
    dispatch(logits.scalar_type(), [&](auto zero) {
      using T = decltype(zero);
      out.data_ptr<int64_t>()[0] = argmax(logits.data_ptr<T>(), logits.numel());
    });
    seed_state.data_ptr<int64_t>()[1] += 1;
  }

  // The step's logits, and the token `sample` draws from them (temperature, top-k, top-p; argmax for
  // temperature <= 0) into out, in this one call; the sampler's counter advances once.
  void draw(const at::Tensor& token, const at::Tensor& pos, at::Tensor& seed_state, at::Tensor& logits,
            at::Tensor& out, double temperature, int64_t top_k, double top_p) {
    check(out.scalar_type() == at::kLong && out.numel() == 1, "out: one int64 token");
    check_seed_state(seed_state);
    check(top_k >= 0 && top_p > 0.0 && top_p <= 1.0, "top_k >= 0, 0 < top_p <= 1");
    run(token, pos, logits);
    out.data_ptr<int64_t>()[0] = draw_row(logits, model_.lm_head.size(0), seed_state, temperature, top_k, top_p,
                                          scratch_);
    seed_state.data_ptr<int64_t>()[1] += 1;
  }

 private:
  // token ids (1, T) at positions pos (T,), consecutive: T == 1 is a decode step, T > 1 a prompt's prefill
  // (layers_step: every token's cache rows, the last token's logits).
  void run(const at::Tensor& token, const at::Tensor& pos, at::Tensor& logits) {
    const std::vector<int64_t> toks = read_ids(token, "tokens"), at = read_ids(pos, "pos");
    const int64_t n = static_cast<int64_t>(toks.size());
    check(n >= 1 && (token.dim() < 2 || token.size(0) == 1), "tokens: (1, T) ids, batch 1");
    check(static_cast<int64_t>(at.size()) == n, "pos: one position per token (T,)");
    for (int64_t t = 0; t < n; t++) {
      check(toks[t] >= 0 && toks[t] < model_.embed.size(0), "token id out of the vocabulary");
      check(at[t] == at[0] + t, "pos: a prompt's positions must be consecutive (pos[0], pos[0] + 1, ...)");
    }
    const int64_t p = at[0];
    check(p >= 0 && p + n <= model_.layers[0].k_cache.size(2) && p + n <= cos_.size(0), "pos beyond the cache");
    check(logits.is_contiguous() && logits.numel() == model_.lm_head.size(0) &&
              logits.scalar_type() == model_.embed.scalar_type(),
          "logits: (vocab) in the model dtype, contiguous (the last token's only)");
    const int64_t dim = model_.embed.size(1), d = cos_.size(1);
    dispatch(model_.embed.scalar_type(), [&](auto zero) {
      using T = decltype(zero);
      std::vector<T> c(n * d), s(n * d);  // these positions' RoPE rows in the model dtype (rope_cos[pos].to(dtype))
      for (int64_t i = 0; i < n * d; i++) {
        if (cos_.scalar_type() == at::kFloat) {
          c[i] = static_cast<T>(cos_.data_ptr<float>()[p * d + i]);
          s[i] = static_cast<T>(sin_.data_ptr<float>()[p * d + i]);
        } else {
          c[i] = ptr<T>(cos_)[p * d + i];
          s[i] = ptr<T>(sin_)[p * d + i];
        }
      }
      std::vector<const T*> rows(n);
      for (int64_t t = 0; t < n; t++) rows[t] = ptr<T>(model_.embed) + toks[t] * dim;
      if (n == 1) {
        layers_step<T, false>(tuning_, rows.data(), 1, p, c.data(), s.data(), model_, logits.data_ptr<T>(), n_heads_,
                              n_kv_, eps_);
      } else {
        layers_step<T, true>(tuning_, rows.data(), n, p, c.data(), s.data(), model_, logits.data_ptr<T>(), n_heads_,
                             n_kv_, eps_);
      }
    });
  }

  Model model_;  // the bound tensors, by what they are
  at::Tensor cos_, sin_;
  Tuning tuning_;  // how its loops run (configure); never what they compute
  int64_t n_heads_, n_kv_;
  float eps_;
  SampleScratch scratch_;  // the draw's work buffers
};

}  // namespace

// The sampler's draw alone (`sample`'s kernel for one row of logits, the last of `logits`) into out (one
// int64); advances seed_state's counter once.
void sample_out(const at::Tensor& logits, at::Tensor& seed_state, double temperature, int64_t top_k, double top_p,
                at::Tensor& out) {
  check(out.scalar_type() == at::kLong && out.numel() == 1, "out: one int64 token");
  check_seed_state(seed_state);
  check(top_k >= 0 && top_p > 0.0 && top_p <= 1.0, "top_k >= 0, 0 < top_p <= 1");
  check(logits.dim() >= 1 && logits.size(-1) > 0, "logits: (..., vocab)");
  thread_local SampleScratch scratch;
  out.data_ptr<int64_t>()[0] = draw_row(logits, logits.size(-1), seed_state, temperature, top_k, top_p, scratch);
  seed_state.data_ptr<int64_t>()[1] += 1;
}

// `_race`'s draw given the noise, per row: logits (rows, vocab), exp_noise (rows, vocab) fp32, out (rows, 1) int32
// (the NKI top-p kernel's result, which it lowers to here).
void race_out(const at::Tensor& logits, const at::Tensor& exp_noise, double temperature, int64_t top_k, double top_p,
              at::Tensor& out) {
  check(logits.dim() == 2 && logits.is_contiguous() && logits.size(1) > 0, "logits: contiguous (rows, vocab)");
  check(exp_noise.scalar_type() == at::kFloat && exp_noise.is_contiguous() && exp_noise.sizes() == logits.sizes(),
        "exp_noise: contiguous fp32, the shape of logits");
  check(out.scalar_type() == at::kInt && out.is_contiguous() && out.numel() == logits.size(0), "out: (rows, 1) int32");
  check(temperature > 0.0 && top_k >= 0 && top_p > 0.0 && top_p <= 1.0, "temperature > 0, top_k >= 0, 0 < top_p <= 1");
  const int64_t rows = logits.size(0), vocab = logits.size(1);
  thread_local SampleScratch scratch;
  dispatch(logits.scalar_type(), [&](auto zero) {
    using T = decltype(zero);
    for (int64_t r = 0; r < rows; r++) {
      out.data_ptr<int32_t>()[r] = static_cast<int32_t>(race_draw(
          logits.data_ptr<T>() + r * vocab, exp_noise.data_ptr<float>() + r * vocab, vocab, temperature, top_k, top_p,
          scratch));
    }
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
  m.def("qkv_decode", &qkv_decode, "one token: RMSNorm + Q/K/V + RoPE (the core tier's qkv)");
  m.def("attention_decode", &attention_decode, "one token: cache write + attention over positions 0..pos");
  m.def("mlp_decode", &mlp_decode, "one token: [RMSNorm +] SwiGLU MLP (+ residual)");
  m.def("sample_out", &sample_out, "the sampler's draw (temperature, top-k, top-p) from the last row of logits");
  m.def("race_out", &race_out, "the sampler's race given its noise, per row (the NKI top-p kernel's lowering)");
  m.def("isa", &isa, "the vector ISA this build was compiled for");
  m.def("fields_read", []() { return kFieldsRead; }, "the DecodeWeights fields this code reads, by name");
  m.def("max_tile_tokens", []() { return TILE_T; }, "the prefill tile's most tokens in this build");
  // module_local: each ISA's build registers its own DecodePlan type (all three may load in one process)
  pybind11::class_<DecodePlan>(m, "DecodePlan", pybind11::module_local(), "the whole decode step over bound weights")
      .def(pybind11::init<const Named&, const at::Tensor&, const at::Tensor&, int64_t, int64_t, double>(),
           "over DecodeWeights.named(), the model's RoPE tables (max_seq_len, head_dim), heads, KV heads, eps")
      .def("names", &DecodePlan::names, "the names of the fields it bound")
      .def("configure", &DecodePlan::configure, "how the loops run: rows, ahead, hint, interleave, tile_rows, tile_tokens")
      .def("tuning", &DecodePlan::tuning, "(rows, ahead, hint, interleave, tile_rows, tile_tokens) in use")
      .def("measure", &DecodePlan::measure, "fastest of `calls` runs (s) of a step (n_tok 1) or prefill, state kept")
      .def("step", &DecodePlan::step, "the step's logits (vocab) into logits")
      .def("greedy", &DecodePlan::greedy, "the step's logits, and its greedy next token into out")
      .def("draw", &DecodePlan::draw, "the step's logits, and the token the sampler draws from them into out");
}
