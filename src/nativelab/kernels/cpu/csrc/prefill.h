// The experimental tier's prompt prefill: the tiles that multiply each weight row into a prompt's T tokens, and
// the row-wise helpers that round where the reference rounds, which a decode step uses too (included by
// decode.cpp, after its decode helpers; decode.cpp's layers_step is the one loop over the layers for both).
//
// A decode step is a matrix-vector product per weight; T prompt tokens make it a thin matrix-matrix product.
// Running the decode step T times would stream every weight T times; here a tile of R weight rows is widened
// to fp32 once per token block and multiplied into up to TT activation rows held in L1 (R x TT accumulators
// in registers), so memory sees each weight once and the FMA units see T tokens per load.
#pragma once

#include <cstring>
#include <type_traits>

namespace {

// The values of a small int32 / int64 tensor (token ids, positions), in order.
inline std::vector<int64_t> read_ids(const at::Tensor& t, const char* what) {
  check(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, std::string(what) + ": int32 or int64 ids");
  const at::Tensor c = t.contiguous();
  std::vector<int64_t> out(c.numel());
  for (int64_t i = 0; i < c.numel(); i++) {
    out[i] = c.scalar_type() == at::kInt ? c.data_ptr<int32_t>()[i] : c.data_ptr<int64_t>()[i];
  }
  return out;
}

// Row-wise elementwise work, vectorized: with T tokens per weight read, the scalar rounding, norms and SiLU
// that are noise in a decode step (dim or ffn elements per matrix) cost as much as the products (T x that,
// ~1 ms of a 6-token `small` prefill on a 2-core Xeon). The rounding points of the model (rnd<T> where the
// reference rounds), for decode and prefill alike; the scalar tails are the same formulas.

// v[0:n] rounded to the model dtype in place (rnd<T> on each element).
template <typename T>
inline void round_row(float* v, int64_t n) {
  if constexpr (std::is_same_v<T, at::BFloat16>) {
    constexpr int64_t F = fVec::size();
    int64_t i = 0;
    for (; i + 2 * F <= n; i += 2 * F) {
      const auto b = at::vec::convert_from_float<at::BFloat16>(fVec::loadu(v + i), fVec::loadu(v + i + F));
      auto [lo, hi] = at::vec::convert_to_float<at::BFloat16>(b);
      lo.store(v + i);
      hi.store(v + i + F);
    }
    for (; i < n; i++) v[i] = rnd<T>(v[i]);
  } else {
    for (int64_t i = 0; i < n; i++) v[i] = rnd<T>(v[i]);
  }
}

// out = rnd(rnd(x * rsqrt(mean(x^2) + eps)) * w): rmsnorm's rounding, vectorized (wf: w widened to fp32).
template <typename T>
inline void rmsnorm_row(const float* x, const float* wf, float* out, int64_t n, float eps) {
  constexpr int64_t F = fVec::size();
  fVec acc(0.f);
  int64_t i = 0;
  for (; i + F <= n; i += F) {
    const fVec v = fVec::loadu(x + i);
    acc = at::vec::fmadd(v, v, acc);
  }
  float ss = hsum(acc);
  for (; i < n; i++) ss += x[i] * x[i];
  const float r = 1.f / std::sqrt(ss / n + eps);
  for (int64_t j = 0; j < n; j++) out[j] = x[j] * r;
  round_row<T>(out, n);
  for (int64_t j = 0; j < n; j++) out[j] *= wf[j];
  round_row<T>(out, n);
}

// x = rnd(x + rnd(y)) (the residual add), tmp: n floats of scratch.
template <typename T>
inline void residual_row(float* x, const float* y, float* tmp, int64_t n) {
  std::copy(y, y + n, tmp);
  round_row<T>(tmp, n);
  for (int64_t i = 0; i < n; i++) x[i] += tmp[i];
  round_row<T>(x, n);
}

// act = rnd(rnd(SiLU(g')) * u') with g' = rnd(g), u' = rnd(u): swiglu_rows' rounding, vectorized (g and u are
// scratch, overwritten).
template <typename T>
inline void silu_mul_row(float* g, float* u, float* act, int64_t n) {
  constexpr int64_t F = fVec::size();
  round_row<T>(g, n);
  round_row<T>(u, n);
  int64_t i = 0;
  for (; i + F <= n; i += F) {
    const fVec v = fVec::loadu(g + i);
    (v / (fVec(1.f) + v.neg().exp())).store(g + i);
  }
  for (; i < n; i++) g[i] = g[i] / (1.f + std::exp(-g[i]));
  round_row<T>(g, n);
  for (int64_t j = 0; j < n; j++) act[j] = g[j] * u[j];
  round_row<T>(act, n);
}

// dst[0:n] = src as bf16, for values already rounded to bf16 (the upper half of each fp32: exact).
inline void to_bf16_exact(const float* src, at::BFloat16* dst, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    uint32_t u;
    std::memcpy(&u, src + i, sizeof u);
    const uint16_t b = static_cast<uint16_t>(u >> 16);
    std::memcpy(dst + i, &b, sizeof b);
  }
}

// One chunk of a weight row widened to fp32: N elements as P fp32 vectors. bf16 rows as decode.cpp's
// dot_rows streams them: F 32-bit lanes of 2F weights give the even weights by << 16 and the odd ones by
// & 0xFFFF0000 (exact, two ops, no shuffle), so the activation rows they meet are split per block of 2F into
// F even then F odd elements (decode.cpp's split_even_odd).
template <typename T>
struct Chunk;
template <>
struct Chunk<float> {
  static constexpr int P = 1;
  static constexpr int64_t N = fVec::size();
  static inline void load(const float* p, fVec* w) { w[0] = fVec::loadu(p); }
};
template <>
struct Chunk<at::BFloat16> {
  using iVec = Vectorized<int32_t>;
  static constexpr int P = 2;
  static constexpr int64_t N = 2 * fVec::size();
  static inline void load(const at::BFloat16* p, fVec* w) {
    const iVec v = iVec::loadu(p);
    w[0] = at::vec::cast<float>(v << iVec(16));
    w[1] = at::vec::cast<float>(v & iVec(static_cast<int32_t>(0xFFFF0000u)));
  }
};

// Tile shape: R weight rows by up to TILE_T tokens of fp32 accumulators, which must stay in registers
// (AVX-512 has 32 vector registers: 4 x 6 = 24 accumulators; AVX2 and the default build have 16: 4 x 3).
// These are the largest; the tuning picks the rows (2 or TILE_R) and the most tokens per tile (1..TILE_T).
constexpr int TILE_R = 4;
#if defined(CPU_CAPABILITY_AVX512)
constexpr int TILE_T = 6;
#else
constexpr int TILE_T = 3;
#endif

// out[j * TILE_T + t] = rows[j][0:k] . h[t * ldh : t * ldh + k] for R rows and TT activation rows.
// `next` (R rows, or null): the rows read after these, prefetched a line ahead as dot_rows does.
template <int R, int TT, typename T>
inline void dot_tile(const T* const* rows, const T* const* next, const float* h, int64_t ldh, int64_t k,
                     float* out) {
  using C = Chunk<T>;
  constexpr int64_t F = fVec::size();
  fVec acc[R][TT];
#pragma GCC unroll 8
  for (int j = 0; j < R; j++) {
#pragma GCC unroll 8
    for (int t = 0; t < TT; t++) acc[j][t] = fVec(0.f);
  }
  int64_t i = 0;
  for (; i + C::N <= k; i += C::N) {
    if (next) {
#pragma GCC unroll 8
      for (int j = 0; j < R; j++) prefetch(next[j] + i);
    }
#pragma GCC unroll 8
    for (int j = 0; j < R; j++) {
      fVec w[C::P];
      C::load(rows[j] + i, w);
#pragma GCC unroll 8
      for (int t = 0; t < TT; t++) {
#pragma GCC unroll 2
        for (int p = 0; p < C::P; p++) acc[j][t] = at::vec::fmadd(w[p], fVec::loadu(h + t * ldh + i + p * F), acc[j][t]);
      }
    }
  }
  for (int j = 0; j < R; j++) {
    for (int t = 0; t < TT; t++) {
      float s = hsum(acc[j][t]);
      for (int64_t q = i; q < k; q++) s += to_f(rows[j][q]) * h[t * ldh + q];
      out[j * TILE_T + t] = s;
    }
  }
}

// dot_tile with the token count TT chosen at run time (N..TILE_T).
template <int R, int N = 1, typename T>
inline void dot_tile_n(int tt, const T* const* rows, const T* const* next, const float* h, int64_t ldh, int64_t k,
                       float* out) {
  if constexpr (N <= TILE_T) {
    if (tt == N) return dot_tile<R, N>(rows, next, h, ldh, k, out);
    return dot_tile_n<R, N + 1>(tt, rows, next, h, ldh, k, out);
  } else {
    TORCH_CHECK(false, "nativelab prefill kernel: token block of ", tt);
  }
}

#if defined(CPU_CAPABILITY_AVX512) && defined(__GNUC__) && defined(__x86_64__)
// AVX512_BF16 (Cooper Lake, Sapphire Rapids, Zen 4): vdpbf16ps multiplies bf16 pairs straight from the weight
// row into fp32 accumulators, 32 weights per instruction and no widening, twice the products per instruction
// of the fp32 FMAs above, which bound a prompt's tiles (the weights come from memory once, the FMAs run T
// times). Exact here: the activations of every bf16 product (normed rows, attention output, SwiGLU output)
// are already rounded to bf16 at the reference's points, so their bf16 copy (hb, rows of ldh) loses nothing.
// Built into the AVX-512 build with a target attribute, called only where the CPU reports the extension.
#define NL_HAVE_DPBF16 1
#include <immintrin.h>

inline bool cpu_has_dpbf16() {
  static const bool yes = __builtin_cpu_supports("avx512bf16");
  return yes;
}

template <int R, int TT>
__attribute__((target("avx512f,avx512bf16"), noinline)) void dot_tile_dpbf16(
    const at::BFloat16* const* rows, const at::BFloat16* const* next, const at::BFloat16* hb, int64_t ldh,
    int64_t k, float* out) {
  __m512 acc[R][TT];
#pragma GCC unroll 8
  for (int j = 0; j < R; j++) {
#pragma GCC unroll 8
    for (int t = 0; t < TT; t++) acc[j][t] = _mm512_setzero_ps();
  }
  int64_t i = 0;
  for (; i + 32 <= k; i += 32) {
    if (next) {
#pragma GCC unroll 8
      for (int j = 0; j < R; j++) prefetch(next[j] + i);
    }
#pragma GCC unroll 8
    for (int j = 0; j < R; j++) {
      const __m512bh w = (__m512bh)_mm512_loadu_si512(rows[j] + i);
#pragma GCC unroll 8
      for (int t = 0; t < TT; t++) {
        acc[j][t] = _mm512_dpbf16_ps(acc[j][t], w, (__m512bh)_mm512_loadu_si512(hb + t * ldh + i));
      }
    }
  }
  for (int j = 0; j < R; j++) {
    for (int t = 0; t < TT; t++) {
      float s = _mm512_reduce_add_ps(acc[j][t]);
      for (int64_t q = i; q < k; q++) s += to_f(rows[j][q]) * to_f(hb[t * ldh + q]);
      out[j * TILE_T + t] = s;
    }
  }
}

template <int R>
inline void dot_tile_dpbf16_n(int tt, const at::BFloat16* const* rows, const at::BFloat16* const* next,
                              const at::BFloat16* hb, int64_t ldh, int64_t k, float* out) {
  switch (tt) {
    case 1: return dot_tile_dpbf16<R, 1>(rows, next, hb, ldh, k, out);
    case 2: return dot_tile_dpbf16<R, 2>(rows, next, hb, ldh, k, out);
    case 3: return dot_tile_dpbf16<R, 3>(rows, next, hb, ldh, k, out);
    case 4: return dot_tile_dpbf16<R, 4>(rows, next, hb, ldh, k, out);
    case 5: return dot_tile_dpbf16<R, 5>(rows, next, hb, ldh, k, out);
    case 6: return dot_tile_dpbf16<R, 6>(rows, next, hb, ldh, k, out);
    default: TORCH_CHECK(false, "nativelab prefill kernel: token block of ", tt);
  }
}
#endif

// One tile of R rows by tt tokens: the AVX512_BF16 products where the CPU has them (bf16 weights), else
// fp32 FMAs on the widened rows. hb: the bf16 copy of h (same layout) or null.
template <int R, typename T>
inline void tile(int tt, const T* const* rows, const T* const* next, const float* h, const at::BFloat16* hb,
                 int64_t ldh, int64_t k, float* out) {
#ifdef NL_HAVE_DPBF16
  if constexpr (std::is_same_v<T, at::BFloat16>) {
    if (hb) return dot_tile_dpbf16_n<R>(tt, rows, next, hb, ldh, k, out);
  }
#endif
  (void)hb;
  dot_tile_n<R>(tt, rows, next, h, ldh, k, out);
}

// The tuning's tile: rows (2 or TILE_R) and the most tokens per tile (1..TILE_T).
inline int tile_rows_of(const Tuning& tu) { return tu.tile_rows == 2 ? 2 : TILE_R; }
inline int tile_tokens_of(const Tuning& tu) {
  return tu.tile_tokens <= 0 ? TILE_T : std::min(tu.tile_tokens, TILE_T);
}

// This thread's share of n virtual rows (row(r) gives row r's pointer), each dotted with activation rows
// t0..t1 of h (stride ldh, k long): store(r, nr, t, nt, out) gets the tile of rows r..r+nr and tokens
// t..t+nt, out[j * TILE_T + u] for row r + j and token t + u. Rows are taken in tiles of the tuning's rows
// (then of `tail` rows at the end of the share: n and the share boundaries are multiples of it), tokens in
// even blocks of at most its tokens; a tile's rows are fetched from memory for its first token block, from
// L1 after.
template <typename T, typename Row, typename Store>
void tile_rows(const Tuning& tu, int64_t n, int64_t tail, Row&& row, const float* h, int64_t ldh, int64_t k,
               int64_t t0, int64_t t1, Store&& store) {
  const int tr = tile_rows_of(tu), tt_most = tile_tokens_of(tu);
  int64_t b, e;
  share(n, tr, b, e);
  const int64_t nt = t1 - t0, blocks = (nt + tt_most - 1) / tt_most, per = (nt + blocks - 1) / blocks;
  float out[TILE_R * TILE_T];
  // bf16 weights: h's rows t0..t1 as the tiles read them, indexed by absolute token as h (this thread's copy)
  const at::BFloat16* hb = nullptr;  // in bf16 for the AVX512_BF16 products (exact: see dot_tile_dpbf16)
#ifdef NL_HAVE_DPBF16
  if (std::is_same_v<T, at::BFloat16> && cpu_has_dpbf16() && b < e) {
    static thread_local std::vector<at::BFloat16> scratch;
    scratch.resize(t1 * ldh);
    for (int64_t t = t0; t < t1; t++) to_bf16_exact(h + t * ldh, scratch.data() + t * ldh, k);
    hb = scratch.data();
  }
#endif
  if (std::is_same_v<T, at::BFloat16> && !hb && b < e) {  // else split into even / odd blocks (see Chunk)
    static thread_local std::vector<float> split;
    split.resize(t1 * ldh);
    for (int64_t t = t0; t < t1; t++) split_even_odd(h + t * ldh, split.data() + t * ldh, k);
    h = split.data();
  }
  int64_t r = b;
  for (; r + tr <= e; r += tr) {
    const T *rows[TILE_R], *next[TILE_R];
    for (int j = 0; j < tr; j++) {
      rows[j] = row(r + j);
      next[j] = row(std::min(r + tr + j, e - 1));
    }
    for (int64_t t = t0; t < t1; t += per) {
      const int tt = static_cast<int>(std::min(per, t1 - t));
      const T* const* pre = t == t0 ? next : nullptr;
      const at::BFloat16* hbt = hb ? hb + t * ldh : nullptr;
      if (tr == 2) {
        tile<2>(tt, rows, pre, h + t * ldh, hbt, ldh, k, out);
      } else {
        tile<TILE_R>(tt, rows, pre, h + t * ldh, hbt, ldh, k, out);
      }
      store(r, tr, t, tt, out);
    }
  }
  for (; r < e; r += tail) {
    const T* rows[2] = {row(r), tail > 1 ? row(r + 1) : nullptr};
    for (int64_t t = t0; t < t1; t += per) {
      const int tt = static_cast<int>(std::min(per, t1 - t));
      const at::BFloat16* hbt = hb ? hb + t * ldh : nullptr;
      if (tail == 1) {
        tile<1>(tt, rows, static_cast<const T* const*>(nullptr), h + t * ldh, hbt, ldh, k, out);
      } else {
        tile<2>(tt, rows, static_cast<const T* const*>(nullptr), h + t * ldh, hbt, ldh, k, out);
      }
      store(r, tail, t, tt, out);
    }
  }
}

}  // namespace
