// The sampler's draw (nativelab.kernels.ops.sample._sample) on the host CPU, for one row of logits:
// temperature, top-k, top-p by bisection and the exponential race with the counter-based hash noise, so the
// experimental tier's one-kernel step can draw its token in the same launch as its logits.
//
// Same inputs, same arithmetic as the traced kernel (Inductor's code for `_sample`): z = logit / float(T) in
// fp32, the max-70 clamp, e = exp(z - max) with at::vec's exp (the same Sleef routine Inductor's vectorized
// code calls), p = e / sum(e) in fp32; top-k keeps p >= the k-th largest p (ties kept); top-p keeps p >= lo,
// lo after the same 32 bisection steps (mid = float(lo + hi) / 2, enough = float(mass(p >= mid)) >=
// float(top_p)); the noise is -float(log((h + 0.5) / 2^32)) in double with at::vec's log, h the same 32-bit
// hash of (seed, counter, token id); the token is the first index of max(p / E) over the kept set.
//
// The one difference is summation order. Inductor sums in fp32, lane-wise, in chunks per OpenMP thread (so its
// own result depends on the thread count); here every sum is accumulated in double and rounded once, i.e.
// (all but never) the correctly rounded fp32 sum. The two differ by a few fp32 ulps (~1e-6 relative), which
// can change (1) p by the same relative amount for every token: the race's winner changes only on a near tie
// of two p / E values (~1e-6 relative), and (2) the bisection's `enough` only when a mass lands within ~1e-6
// of top_p, which can move the one token whose mass before it is that close to top_p in or out of the kept
// set: a borderline token that a sort-based top-p sampler also keeps or drops by rounding, so the token drawn
// is always one `reference_sample_mask` allows (up to that rounding). The tests check equal tokens against the
// traced kernel over seeds, counters and settings.
//
// Cost: the bisection does not make 32 passes over the vocabulary: it keeps the mass above `hi` as a running
// (double) sum and only sums the band [mid, hi) of a candidate list holding every p in [lo, hi), compacted
// once at most half of it is still in that range; exact-equivalent to the full masked sums in double. The
// noise is only computed for vector blocks holding a kept token, the exact double log only for the race's
// leaders (see the race below). One thread: splitting the softmax and race passes over the OpenMP team (two
// cores, after the step's own team) measured no faster (2-core Xeon, AVX-512: 144 us either way for top-p 0.9
// over 32000 N(0, 1) logits, ~50 us of it the bisection, which is serial by nature).
#pragma once

#include <ATen/cpu/vec/vec.h>
#include <ATen/cpu/vec/functional.h>
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

namespace {

namespace sample_detail {

using fVec = at::vec::Vectorized<float>;
using dVec = at::vec::Vectorized<double>;
constexpr int BISECT_STEPS = 32;  // _sample's _BISECT_STEPS

// _sample's _hash32, in uint32 arithmetic (the int64 version masks every product to 32 bits: the same value).
inline uint32_t hash32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x45D9F3Bu;
  x ^= x >> 16;
  x *= 0x45D9F3Bu;
  return x ^ (x >> 16);
}

// Lanes of v that are set (all bits one) in a comparison result, as a bit mask.
inline int set_lanes(const fVec& cmp) { return ~cmp.zero_mask() & ((1 << fVec::size()) - 1); }

// out[i] = float(x[i]) (restrict: a loop the compiler vectorizes, bf16 widening included).
template <typename T>
inline void to_float(const T* __restrict x, float* __restrict out, int64_t n) {
  for (int64_t i = 0; i < n; i++) out[i] = static_cast<float>(x[i]);
}

// The first k lanes set (all bits one), the others clear.
inline fVec first_lanes(int64_t k) { return fVec::arange(0.f, 1.f) < fVec(static_cast<float>(k)); }

// k <= L values from p, the lanes past them `fill`.
inline fVec load_or(const float* p, int64_t k, float fill) {
  const fVec v = fVec::loadu(p, k);
  return k < fVec::size() ? fVec::blendv(fVec(fill), v, first_lanes(k)) : v;
}

inline float max_lanes(const fVec& v) {
  return at::vec::vec_reduce_all<float>([](fVec& a, fVec& b) { return at::vec::maximum(a, b); }, v);
}

// A sum of fp32 vectors accumulated in double, lane-wise (each fp32 lane widened exactly), summed in order.
struct DoubleSum {
  static constexpr int64_t L = fVec::size();
#if defined(CPU_CAPABILITY_AVX512)
  dVec lo{0.0}, hi{0.0};
  void add(const fVec& v) {
    const __m512 x = v;
    lo = lo + dVec(_mm512_cvtps_pd(_mm512_castps512_ps256(x)));
    hi = hi + dVec(_mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1))));
  }
  double total() const {
    alignas(64) double lanes[L];
    lo.store(lanes);
    hi.store(lanes + L / 2);
    return sum(lanes);
  }
#elif defined(CPU_CAPABILITY_AVX2)
  dVec lo{0.0}, hi{0.0};
  void add(const fVec& v) {
    const __m256 x = v;
    lo = lo + dVec(_mm256_cvtps_pd(_mm256_castps256_ps128(x)));
    hi = hi + dVec(_mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)));
  }
  double total() const {
    alignas(64) double lanes[L];
    lo.store(lanes);
    hi.store(lanes + L / 2);
    return sum(lanes);
  }
#else
  double acc[L] = {};
  void add(const fVec& v) {
    alignas(64) float x[L];
    v.store(x);
    for (int64_t j = 0; j < L; j++) acc[j] += x[j];
  }
  double total() const { return sum(acc); }
#endif
  static double sum(const double* lanes) {
    double s = 0.0;
    for (int64_t j = 0; j < L; j++) s += lanes[j];
    return s;
  }
};

// sum(c[i] for mid <= c[i] < hi) in double, and how many. Raw intrinsics where there are (mask registers,
// no branch per vector: the band is a random subset), two double accumulators per fp32 vector.
inline double band_sum(const float* c, int64_t m, float mid, float hi, int64_t& count) {
  int64_t cnt = 0, i = 0;
  double s = 0.0;
#if defined(CPU_CAPABILITY_AVX512)
  __m512d a = _mm512_setzero_pd(), b = _mm512_setzero_pd();
  const __m512 vmid = _mm512_set1_ps(mid), vhi = _mm512_set1_ps(hi);
  for (; i + 16 <= m; i += 16) {
    const __m512 v = _mm512_loadu_ps(c + i);
    const __mmask16 in = _mm512_cmp_ps_mask(v, vmid, _CMP_GE_OQ) & _mm512_cmp_ps_mask(v, vhi, _CMP_LT_OQ);
    cnt += __builtin_popcount(in);
    const __m512 x = _mm512_maskz_mov_ps(in, v);
    a = _mm512_add_pd(a, _mm512_cvtps_pd(_mm512_castps512_ps256(x)));
    b = _mm512_add_pd(b, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1))));
  }
  alignas(64) double lanes[16];
  _mm512_store_pd(lanes, a);
  _mm512_store_pd(lanes + 8, b);
  for (double x : lanes) s += x;
#elif defined(CPU_CAPABILITY_AVX2)
  __m256d a = _mm256_setzero_pd(), b = _mm256_setzero_pd();
  const __m256 vmid = _mm256_set1_ps(mid), vhi = _mm256_set1_ps(hi);
  for (; i + 8 <= m; i += 8) {
    const __m256 v = _mm256_loadu_ps(c + i);
    const __m256 in = _mm256_and_ps(_mm256_cmp_ps(v, vmid, _CMP_GE_OQ), _mm256_cmp_ps(v, vhi, _CMP_LT_OQ));
    cnt += __builtin_popcount(_mm256_movemask_ps(in));
    const __m256 x = _mm256_and_ps(v, in);
    a = _mm256_add_pd(a, _mm256_cvtps_pd(_mm256_castps256_ps128(x)));
    b = _mm256_add_pd(b, _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)));
  }
  alignas(64) double lanes[8];
  _mm256_store_pd(lanes, a);
  _mm256_store_pd(lanes + 4, b);
  for (double x : lanes) s += x;
#endif
  for (; i < m; i++) {
    const bool in = c[i] >= mid && c[i] < hi;
    cnt += in;
    s += in ? c[i] : 0.0;
  }
  count = cnt;
  return s;
}

// The values of c (m of them) in [lo, hi) into out, in order; how many. out may be c.
inline int64_t keep_band(const float* c, int64_t m, float lo, float hi, float* out) {
  int64_t w = 0, i = 0;
#if defined(CPU_CAPABILITY_AVX512)
  const __m512 vlo = _mm512_set1_ps(lo), vhi = _mm512_set1_ps(hi);
  for (; i + 16 <= m; i += 16) {
    const __m512 v = _mm512_loadu_ps(c + i);
    const __mmask16 in = _mm512_cmp_ps_mask(v, vlo, _CMP_GE_OQ) & _mm512_cmp_ps_mask(v, vhi, _CMP_LT_OQ);
    _mm512_mask_compressstoreu_ps(out + w, in, v);
    w += __builtin_popcount(in);
  }
#endif
  for (; i < m; i++) {
    const float v = c[i];
    out[w] = v;
    w += (v >= lo) & (v < hi);
  }
  return w;
}

// _sample's top-p bisection over p (n probabilities, the largest pmax): the final `lo`.
inline float top_p_floor(const float* p, int64_t n, float pmax, float top_p, std::vector<float>& band) {
  float lo = 0.f, hi = pmax;
  int64_t live;  // how many p lie in [lo, hi)
  double above = band_sum(p, n, hi, INFINITY, live);  // the mass at p >= hi (the maxima)
  live = n - live;
  const float* c = p;  // holds every p in [lo, hi) (and maybe others, masked out by band_sum)
  int64_t m = n;
  for (int step = 0; step < BISECT_STEPS; step++) {
    const float mid = (lo + hi) / 2.f;
    int64_t cnt;
    const double part = band_sum(c, m, mid, hi, cnt);
    if (static_cast<float>(above + part) >= top_p) {  // mass(p >= mid) >= top_p
      lo = mid;
      live = cnt;
    } else {
      hi = mid;
      above += part;
      live -= cnt;
    }
    if (live * 2 < m && m > 64) {  // compact: keep [lo, hi) only
      band.resize(n);
      m = keep_band(c, m, lo, hi, band.data());
      c = band.data();
    }
  }
  return lo;
}

// The k-th largest of p (n values, 0 < k < n), as topk(p, k).values[-1]: the k-th largest of the vector-block
// maxima is a lower bound (k blocks reach it), so only the blocks reaching it are ranked.
inline float kth_largest(const float* p, int64_t n, int64_t k, std::vector<float>& maxima, std::vector<float>& tmp) {
  constexpr int64_t L = fVec::size();
  const int64_t blocks = (n + L - 1) / L;
  tmp.clear();
  if (k > blocks / 4) {
    tmp.assign(p, p + n);
  } else {
    maxima.resize(blocks);
    for (int64_t b = 0; b < blocks; b++) maxima[b] = max_lanes(load_or(p + b * L, std::min(L, n - b * L), -INFINITY));
    tmp.assign(maxima.begin(), maxima.end());
    std::nth_element(tmp.begin(), tmp.begin() + (k - 1), tmp.end(), std::greater<float>());
    const float bound = tmp[k - 1];
    tmp.clear();
    for (int64_t b = 0; b < blocks; b++) {
      if (maxima[b] < bound) continue;
      for (int64_t i = b * L; i < std::min(n, (b + 1) * L); i++) {
        if (p[i] >= bound) tmp.push_back(p[i]);
      }
    }
  }
  std::nth_element(tmp.begin(), tmp.begin() + (k - 1), tmp.end(), std::greater<float>());
  return tmp[k - 1];
}

}  // namespace sample_detail

// Work buffers of the draw (one vocabulary of floats each), kept between draws.
struct SampleScratch {
  std::vector<float> p, band, tmp;
};

// `_race`'s probabilities of one row of logits (n values, temperature > 0) into s.p, and the threshold a token's
// probability must reach to be kept (top-k, top-p; 0 when neither).
template <typename T>
float kept_probabilities(const T* logits, int64_t n, double temperature, int64_t top_k, double top_p,
                         SampleScratch& s) {
  namespace sd = sample_detail;
  using V = sd::fVec;
  constexpr int64_t L = V::size();
  s.p.resize(n);
  float* p = s.p.data();
  // z = logits / T and its max; e = exp(max(z, max - 70) - max) and its sum; p = e / sum
  sd::to_float(logits, p, n);
  const V vt(static_cast<float>(temperature));
  V vmax(-INFINITY);
  for (int64_t i = 0; i < n; i += L) {
    const int64_t k = std::min(L, n - i);
    const V z = V::loadu(p + i, k) / vt;
    z.store(p + i, k);
    vmax = at::vec::maximum(vmax, k < L ? V::blendv(V(-INFINITY), z, sd::first_lanes(k)) : z);
  }
  const float zmax = sd::max_lanes(vmax);
  const V vfloor(zmax - 70.f), vzmax(zmax);
  sd::DoubleSum acc;
  for (int64_t i = 0; i < n; i += L) {
    const int64_t k = std::min(L, n - i);
    const V e = (at::vec::maximum(V::loadu(p + i, k), vfloor) - vzmax).exp();
    e.store(p + i, k);
    acc.add(k < L ? V::blendv(V(0.f), e, sd::first_lanes(k)) : e);
  }
  const V vsum(static_cast<float>(acc.total()));
  V pmaxv(-INFINITY);
  for (int64_t i = 0; i < n; i += L) {
    const int64_t k = std::min(L, n - i);
    const V v = V::loadu(p + i, k) / vsum;
    v.store(p + i, k);
    pmaxv = at::vec::maximum(pmaxv, v);  // tail lanes: 0 / sum = 0, never above a probability
  }
  const float pmax = sd::max_lanes(pmaxv);

  float threshold = 0.f;
  if (top_k > 0 && top_k < n) threshold = sd::kth_largest(p, n, top_k, s.band, s.tmp);
  if (top_p < 1.0) threshold = std::max(threshold, sd::top_p_floor(p, n, pmax, static_cast<float>(top_p), s.band));
  return threshold;
}

// The token `_sample` draws from one row of logits (n values), with the sampler state (seed, counter); the
// caller advances the counter. temperature <= 0: the first index of the largest logit (NaN counts as largest).
template <typename T>
int64_t sample_draw(const T* logits, int64_t n, int64_t seed, int64_t counter, double temperature, int64_t top_k,
                    double top_p, SampleScratch& s) {
  namespace sd = sample_detail;
  using V = sd::fVec;
  constexpr int64_t L = V::size();
  if (temperature <= 0.0) {
    int64_t best = 0;
    float bv = static_cast<float>(logits[0]);
    for (int64_t i = 1; i < n && !std::isnan(bv); i++) {
      const float x = static_cast<float>(logits[i]);
      if (x > bv || std::isnan(x)) bv = x, best = i;
    }
    return best;
  }
  const float threshold = kept_probabilities(logits, n, temperature, top_k, top_p, s);
  const float* p = s.p.data();

  // The race: the first index of max(p / E) over p >= threshold, E = -float(log(u)) with u = (h + 0.5) / 2^32
  // in double. That double log per kept token is most of the draw's time, so a first pass bounds each kept
  // token's p / E from fp32 logs (u to fp32: relative error <= 1.2e-7, so |log| off by <= 1.2e-7; the fp32 log
  // within 1 ulp; E's rounding 6e-8; the divisions 6e-8 each: within 1e-6 relative plus 4e-7 absolute in E,
  // here doubled), and only tokens whose upper bound reaches the largest lower bound (the winner and its near
  // ties, usually one token) get the exact value, in index order, the first maximum winning as in argmax.
  const uint32_t seed32 = static_cast<uint32_t>(seed), cterm = static_cast<uint32_t>(counter) * 0x9E37u;
  auto noise_hash = [seed32, cterm](int64_t i) {
    return sd::hash32(sd::hash32(static_cast<uint32_t>(i) ^ seed32) ^ cterm);
  };
  s.band.resize(n + L);
  float* upper = s.band.data();  // per token: its bound, -1 where not kept
  const V vthr(threshold), abs_err(8e-7f), rel_err(2e-6f), down(1.f - 4e-6f), up(1.f + 4e-6f);
  V lower_max(-INFINITY);
  alignas(64) float uf[L];
  for (int64_t i = 0; i < n; i += L) {
    const int64_t k = std::min(L, n - i);
    const V pv = V::loadu(p + i, k);
    V keep = pv >= vthr;
    if (k < L) keep = keep & sd::first_lanes(k);
    if (!sd::set_lanes(keep)) {
      V(-1.f).store(upper + i);
      continue;
    }
    for (int64_t j = 0; j < L; j++) uf[j] = (static_cast<float>(noise_hash(i + j)) + 0.5f) * 0x1p-32f;
    const V e = -V::loadu(uf).log();
    const V err = abs_err + rel_err * e;
    const V lo_r = pv / (e + err) * down;
    const V e_lo = e - err;
    const V hi_r = V::blendv(V(INFINITY), pv / e_lo * up, e_lo > V(0.f));
    lower_max = at::vec::maximum(lower_max, V::blendv(V(-1.f), lo_r, keep));
    V::blendv(V(-1.f), hi_r, keep).store(upper + i);
  }
  const V vbound(sd::max_lanes(lower_max));
  int64_t best = 0;
  float best_r = -INFINITY;
  for (int64_t i = 0; i < n; i += L) {
    int bits = sd::set_lanes(V::loadu(upper + i) >= vbound);
    if (i + L > n) bits &= (1 << (n - i)) - 1;
    for (; bits; bits &= bits - 1) {
      const int64_t t = i + __builtin_ctz(bits);
      const double u = (static_cast<double>(noise_hash(t)) + 0.5) * 0x1p-32;  // = / 2^32 exactly
      alignas(64) double lu[sd::dVec::size()];
      sd::dVec(u).log().store(lu);  // at::vec's log, as Inductor's vectorized code
      const float r = p[t] / -static_cast<float>(lu[0]);
      if (r > best_r) best_r = r, best = t;
    }
  }
  return best;
}

// The token `_race` draws from one row of logits (n values, temperature > 0) given its noise e (n fp32 values,
// E = -log(u)): the first index of the largest p / E in fp32 over the kept tokens (0 elsewhere), as argmax of
// Inductor's `where(p >= threshold, p / E, 0)`.
template <typename T>
int64_t race_draw(const T* logits, const float* e, int64_t n, double temperature, int64_t top_k, double top_p,
                  SampleScratch& s) {
  const float threshold = kept_probabilities(logits, n, temperature, top_k, top_p, s);
  const float* p = s.p.data();
  int64_t best = 0;
  float best_r = p[0] >= threshold ? p[0] / e[0] : 0.f;
  for (int64_t i = 1; i < n; i++) {
    const float r = p[i] >= threshold ? p[i] / e[i] : 0.f;
    if (r > best_r) best_r = r, best = i;
  }
  return best;
}

}  // namespace
