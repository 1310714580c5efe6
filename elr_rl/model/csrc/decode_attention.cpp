// Decode attention over vLLM-CPU's paged KV cache: one query token per sequence.
//
// Cache layout (vLLM's CPU attention backend): kv_cache[num_blocks][kv_heads][2 * block_size][head_dim],
// where the first block_size * head_dim elements of a (block, kv head) hold K transposed
// ([head_dim][block_size]: one row per channel, tokens contiguous) and the next block_size * head_dim hold V
// ([block_size][head_dim]: one row per token).
//
// Why this kernel: on a CPU without AMX vLLM-CPU runs its generic ("vec") kernel, which at RL-length contexts
// held a 512-row decode step to ~23 GFLOP/s and ~6 GB/s of KV read, against ~60 GFLOP/s when the same work fits
// in cache and 20-23 GB/s for streaming reads (scripts/bench_attention.py): it waits on memory latency, since
// a sequence's blocks sit anywhere in the cache, and it widens every bf16 element with a cross-lane
// zero-extension (16% of a profiled decode step). Here K and V are prefetched into L2 ahead of their use
// (most of the gain), and a pair of bf16 values is read as one 32-bit word and split with a shift and a
// mask (lane-local): the even element's fp32 value is `word << 16`, the odd one's `word & 0xffff0000`.
// Scores and outputs are kept in the order that produces inside each 32-token chunk / head_dim row and put
// back in order at the end. The arithmetic is fp32, as in vLLM's kernel (on CPUs with AVX512-BF16 the
// scores are bf16 dot products accumulated in fp32: the products are exact). bf16 has an AVX-512 path
// (`attend_bf16`, prefetching as two streams across a thread's items); fp32, and bf16 without AVX-512,
// run plain C++ for the compiler's vectoriser (-O3 -march=native), prefetching each item's next chunk.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

constexpr int kChunk = 32;  // tokens per chunk; block sizes are multiples of it
constexpr int kHalf = kChunk / 2;

inline float as_float(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// e^x for x <= 0 (softmax after subtracting the max); relative error ~1e-7, vectorisable.
inline float exp_nonpositive(float x) {
  x = x < -87.0f ? -87.0f : x;
  const float y = x * 1.4426950408889634f;
  const float n = (y + 12582912.0f) - 12582912.0f;  // round to nearest (|y| < 2^22)
  const float f = (y - n) * 0.6931471805599453f;     // |f| <= ln2 / 2
  float p = 1.0f / 5040.0f;
  p = p * f + 1.0f / 720.0f;
  p = p * f + 1.0f / 120.0f;
  p = p * f + 1.0f / 24.0f;
  p = p * f + 1.0f / 6.0f;
  p = p * f + 0.5f;
  p = p * f + 1.0f;
  p = p * f + 1.0f;
  const int32_t e = static_cast<int32_t>(n) + 127;
  return p * as_float(static_cast<uint32_t>(e) << 23);
}

// Split 32 cache elements into two halves of 16 fp32 values. bf16: even and odd elements; fp32: first and
// second 16. `index(i, half)` is the element a half's i-th value came from.
template <typename T>
struct Split;

template <>
struct Split<at::BFloat16> {
  static inline void load(const at::BFloat16* src, float* lo, float* hi) {
    uint32_t w[kHalf];
    std::memcpy(w, src, sizeof w);
    for (int i = 0; i < kHalf; ++i) {
      lo[i] = as_float(w[i] << 16);
      hi[i] = as_float(w[i] & 0xffff0000u);
    }
  }
  static constexpr int index(int i, int half) { return 2 * i + half; }
};

template <>
struct Split<float> {
  static inline void load(const float* src, float* lo, float* hi) {
    for (int i = 0; i < kHalf; ++i) {
      lo[i] = src[i];
      hi[i] = src[i + kHalf];
    }
  }
  static constexpr int index(int i, int half) { return i + half * kHalf; }
};

// Scores [chunk][g][32] (score i of half h is token `order(i, h)` of its chunk) -> probabilities in place,
// tokens outside [start, seq_len) of the first and last chunks masked out; inv_sum[g] = 1 / sum of g's.
template <int G, typename Order>
void softmax(float* sc, int n_chunks, int first_chunk, int start, int seq_len, Order order, float* inv_sum) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int c : {0, n_chunks - 1}) {
    const int base = (first_chunk + c) * kChunk;
    for (int g = 0; g < G; ++g)
      for (int half = 0; half < 2; ++half)
        for (int i = 0; i < kHalf; ++i) {
          const int t = base + order(i, half);
          if (t < start || t >= seq_len) sc[(static_cast<size_t>(c) * G + g) * kChunk + half * kHalf + i] = neg_inf;
        }
  }
  for (int g = 0; g < G; ++g) {
    float m = neg_inf;
    for (int c = 0; c < n_chunks; ++c) {
      const float* row = sc + (static_cast<size_t>(c) * G + g) * kChunk;
      for (int i = 0; i < kChunk; ++i) m = std::max(m, row[i]);
    }
    float sum = 0.0f;
    for (int c = 0; c < n_chunks; ++c) {
      float* row = sc + (static_cast<size_t>(c) * G + g) * kChunk;
      for (int i = 0; i < kChunk; ++i) {
        const float p = row[i] == neg_inf ? 0.0f : exp_nonpositive(row[i] - m);
        row[i] = p;
        sum += p;
      }
    }
    inv_sum[g] = 1.0f / sum;
  }
}

template <typename T, int D, int G>
void attend_one(const T* __restrict__ q_in, int64_t q_head_stride, const T* __restrict__ cache,
                int64_t block_stride, int64_t head_stride, const int32_t* __restrict__ blocks, int block_size,
                int kv_head, int seq_len, int window, float scale, T* __restrict__ out, int64_t out_head_stride,
                std::vector<float>& scratch) {
  static_assert(D % kChunk == 0, "head_dim must be a multiple of 32");
  constexpr int DH = D / 2;
  if (seq_len <= 0) {  // nothing to attend to (not a decode row vLLM sends): a zero output, not a read
    for (int g = 0; g < G; ++g)
      for (int d = 0; d < D; ++d) out[g * out_head_stride + d] = static_cast<T>(0.0f);
    return;
  }
  const int start = window > 0 ? std::max(0, seq_len - window) : 0;
  const int first_chunk = start / kChunk;
  const int n_chunks = (seq_len + kChunk - 1) / kChunk - first_chunk;
  const int chunks_per_block = block_size / kChunk;

  float q[G][D];
  for (int g = 0; g < G; ++g)
    for (int d = 0; d < D; ++d) q[g][d] = static_cast<float>(q_in[g * q_head_stride + d]) * scale;

  scratch.resize(static_cast<size_t>(G) * n_chunks * kChunk);
  float* sc = scratch.data();  // [chunk][g][32]: per chunk, G rows of (lo 16, hi 16)

  // A chunk's K rows and V rows: where they start.
  auto k_of = [&](int chunk) {
    const int64_t block = blocks[chunk / chunks_per_block];
    return cache + block * block_stride + kv_head * head_stride + (chunk % chunks_per_block) * kChunk;
  };
  auto v_of = [&](int chunk) {
    const int64_t block = blocks[chunk / chunks_per_block];
    return cache + block * block_stride + kv_head * head_stride + static_cast<int64_t>(block_size) * D +
           static_cast<int64_t>(chunk % chunks_per_block) * kChunk * D;
  };
  // Blocks sit anywhere in the cache and a chunk is a few KiB, so the hardware's stream prefetchers do not
  // run ahead and a decode step waits on memory latency (about 6 GB/s on one core of the machine these
  // notes come from, where streaming reads reach 20). While computing a chunk's scores, fetch the next
  // chunk's K and V, a line or two per channel, into L2 (locality 2): 1.9x vLLM's kernel on a 512-sequence
  // step at context ~400 (bf16, one thread, when bf16 ran this path; it now runs attend_bf16's two streams),
  // where fetching into L1 gave 1.25x and not fetching 1.0x.
  auto prefetch_next = [&](const char* k_next, const char* v_next, int d) {
    constexpr int64_t k_row = kChunk * sizeof(T), v_lines_per_channel = kChunk * sizeof(T) / 64;
    for (int64_t b = 0; b < k_row; b += 64) __builtin_prefetch(k_next + d * block_size * sizeof(T) + b, 0, 2);
    for (int64_t l = 0; l < v_lines_per_channel; ++l)
      __builtin_prefetch(v_next + (d * v_lines_per_channel + l) * 64, 0, 2);
  };

  // Scores: s[g][t] = q[g] . K[t], K read as rows of one channel over 32 tokens.
  for (int c = 0; c < n_chunks; ++c) {
    const int chunk = first_chunk + c;
    const T* k_t = k_of(chunk);
    // The next chunk's K and V, spread over this chunk's channels (the last chunk fetches itself: harmless).
    const int next = c + 1 < n_chunks ? chunk + 1 : chunk;
    const char* k_next = reinterpret_cast<const char*>(k_of(next));
    const char* v_next = reinterpret_cast<const char*>(v_of(next));
    float* dst = sc + static_cast<size_t>(c) * G * kChunk;
    float acc[G][kChunk] = {};
    for (int d = 0; d < D; ++d) {
      prefetch_next(k_next, v_next, d);
      float lo[kHalf], hi[kHalf];
      Split<T>::load(k_t + static_cast<int64_t>(d) * block_size, lo, hi);
      for (int g = 0; g < G; ++g) {
        const float qd = q[g][d];
        for (int i = 0; i < kHalf; ++i) {
          acc[g][i] += qd * lo[i];
          acc[g][kHalf + i] += qd * hi[i];
        }
      }
    }
    std::memcpy(dst, acc, sizeof acc);
  }

  // Mask the first and last chunks' tokens outside [start, seq_len), then the softmax.
  float inv_sum[G];
  softmax<G>(sc, n_chunks, first_chunk, start, seq_len, [](int i, int half) { return Split<T>::index(i, half); },
             inv_sum);

  // Output: o[g] = sum_t p[g][t] V[t], V rows split into two halves of channels.
  alignas(64) float o_lo[G][DH] = {}, o_hi[G][DH] = {};
  for (int c = 0; c < n_chunks; ++c) {
    const int chunk = first_chunk + c;
    const T* v = v_of(chunk);
    const float* probs = sc + static_cast<size_t>(c) * G * kChunk;
    const int t0 = chunk * kChunk;
    for (int half = 0; half < 2; ++half) {
      for (int i = 0; i < kHalf; ++i) {
        const int j = Split<T>::index(i, half);  // token within the chunk
        if (t0 + j < start || t0 + j >= seq_len) continue;
        const T* row = v + static_cast<int64_t>(j) * D;
        float lo[DH], hi[DH];
        for (int part = 0; part < D / kChunk; ++part)
          Split<T>::load(row + part * kChunk, lo + part * kHalf, hi + part * kHalf);
        for (int g = 0; g < G; ++g) {
          const float p = probs[g * kChunk + half * kHalf + i];
          for (int e = 0; e < DH; ++e) {
            o_lo[g][e] += p * lo[e];
            o_hi[g][e] += p * hi[e];
          }
        }
      }
    }
  }
  // Channel e of a half, in the row's order: part = e / 16, then Split's index within that 32-wide part.
  for (int g = 0; g < G; ++g) {
    T* dst = out + g * out_head_stride;
    for (int e = 0; e < DH; ++e) {
      const int part = e / kHalf, i = e % kHalf;
      dst[part * kChunk + Split<T>::index(i, 0)] = static_cast<T>(o_lo[g][e] * inv_sum[g]);
      dst[part * kChunk + Split<T>::index(i, 1)] = static_cast<T>(o_hi[g][e] * inv_sum[g]);
    }
  }
}

// ------------------------------------------------------------------------------ streams of items (vector paths)
// Where a (sequence, KV head) item's chunks live, and how many it has.
template <typename T>
struct Plan {
  const T* cache;
  int64_t block_stride, head_stride, table_stride;
  const int32_t* table;
  const int32_t* lens;
  int kv_heads, block_size, window, dim;

  // An item's tokens [start, seq_len) and the chunks that hold them (n_chunks 0 for an empty row).
  struct Span {
    int seq_len, start, first_chunk, n_chunks;
  };
  Span span(int64_t item) const {
    const int len = lens[item / kv_heads];
    const int start = window > 0 ? std::max(0, len - window) : 0;
    return {len, start, start / kChunk, len <= 0 ? 0 : (len + kChunk - 1) / kChunk - start / kChunk};
  }
  int first_chunk(int64_t item) const { return span(item).first_chunk; }
  int n_chunks(int64_t item) const { return span(item).n_chunks; }
  const T* k_of(int64_t item, int chunk) const {
    const int per_block = block_size / kChunk;
    const int64_t block = table[(item / kv_heads) * table_stride + chunk / per_block];
    return cache + block * block_stride + (item % kv_heads) * head_stride + (chunk % per_block) * kChunk;
  }
  const T* v_of(int64_t item, int chunk) const {
    const int per_block = block_size / kChunk;
    const int64_t block = table[(item / kv_heads) * table_stride + chunk / per_block];
    return cache + block * block_stride + (item % kv_heads) * head_stride + static_cast<int64_t>(block_size) * dim +
           static_cast<int64_t>(chunk % per_block) * kChunk * dim;
  }
  // The chunk a cursor points at: its K or V, as bytes to prefetch (null past the thread's last item).
  template <typename C>
  const char* k_at(const C& at) const {
    return at.valid() ? reinterpret_cast<const char*>(k_of(at.item, first_chunk(at.item) + at.chunk)) : nullptr;
  }
  template <typename C>
  const char* v_at(const C& at) const {
    return at.valid() ? reinterpret_cast<const char*>(v_of(at.item, first_chunk(at.item) + at.chunk)) : nullptr;
  }
};

// A position in one thread's stream of chunks (its items in order, each item's chunks in order).
struct Cursor {
  int64_t item, end;
  int chunk = 0;  // counted from the item's first chunk
  bool valid() const { return item < end; }
  template <typename T>
  void advance(const Plan<T>& plan) {
    ++chunk;
    while (item < end && chunk >= plan.n_chunks(item)) {
      chunk -= plan.n_chunks(item);
      ++item;
    }
  }
  template <typename T>
  void skip_empty(const Plan<T>& plan) {
    --chunk;
    advance(plan);
  }
};

// Prefetching runs as two streams across items, so that memory is read at an even rate and never waits
// for an item to start: while the scores of a chunk are computed, the K of the chunk kAheadK further on
// is fetched; while the outputs of a chunk are computed, the V of the next item's chunk at the same
// place. Both into L2 (locality 2: L1 measured no faster than no prefetch). Against prefetching only the
// same item's next chunk (attend_one): 19 -> 16 ms for a bf16 512-sequence step of one layer at context
// ~400 (scripts/bench_attention.py, one thread), 11 -> 13 GB/s of KV.
constexpr int kAheadK = 4;

inline void prefetch_chunk_lines(const char* base, int lines) {
  for (int l = 0; l < lines; ++l) __builtin_prefetch(base + l * 64, 0, 2);
}

// An empty row's output (not a decode row vLLM sends): zeros, and nothing read.
template <int G, int D, typename T>
void write_zeros(T* out, int64_t out_head_stride) {
  for (int g = 0; g < G; ++g)
    for (int d = 0; d < D; ++d) out[g * out_head_stride + d] = static_cast<T>(0.0f);
}

// One thread's items [begin, end): start both prefetch streams (the first `k_ahead_chunks` chunks' K; the
// first `v_ahead_chunks` chunks' V, or with 0 the first item's), then `attend(item, k_ahead, v_ahead)` for
// each. `lines` = 64-byte lines in a chunk's K (and in its V).
template <typename T, typename Attend>
void run_stream(const Plan<T>& plan, int64_t begin, int64_t end, int lines, int k_ahead_chunks, int v_ahead_chunks,
                Attend attend) {
  Cursor k_ahead{begin, end}, v_ahead{begin, end};
  k_ahead.skip_empty(plan);
  v_ahead.skip_empty(plan);
  for (int i = 0; i < k_ahead_chunks && k_ahead.valid(); ++i) {
    prefetch_chunk_lines(plan.k_at(k_ahead), lines);
    k_ahead.advance(plan);
  }
  for (int64_t first = v_ahead.item, i = 0; v_ahead.valid() && (v_ahead_chunks > 0 ? i < v_ahead_chunks : v_ahead.item == first); ++i) {
    prefetch_chunk_lines(plan.v_at(v_ahead), lines);
    v_ahead.advance(plan);
  }
  for (int64_t item = begin; item < end; ++item) attend(item, k_ahead, v_ahead);
}

#if defined(__AVX512F__)
// ---------------------------------------------------------------------------------------------- bf16, AVX-512
template <int D, int G>
void attend_bf16(const at::BFloat16* __restrict__ q_in, int64_t q_head_stride, const Plan<at::BFloat16>& plan, int64_t item,
                 Cursor& k_ahead, Cursor& v_ahead, float scale, at::BFloat16* __restrict__ out,
                 int64_t out_head_stride, std::vector<float>& scratch) {
  using T = at::BFloat16;
  static_assert(D % kChunk == 0, "head_dim must be a multiple of 32");
  constexpr int DH = D / 2, P = D / kChunk;
  constexpr int kLines = D;  // 64-byte lines in a chunk's K (one per channel) and in its V (32 rows of 2D bytes)
  const auto [seq_len, start, first_chunk, n_chunks] = plan.span(item);
  if (n_chunks == 0) return write_zeros<G, D>(out, out_head_stride);
  const int block_size = plan.block_size;
  scratch.resize(static_cast<size_t>(G) * n_chunks * kChunk);
  float* sc = scratch.data();  // [chunk][g][32], in `order` (below)
  const __m512i mask = _mm512_set1_epi32(static_cast<int>(0xffff0000u));

#if defined(__AVX512BF16__)
  // Scores with bf16 dot products: rows d and d + 1 of K interleaved (lane-local unpack) against q's
  // channels d and d + 1 as one bf16 pair; products are exact in fp32, accumulated in fp32. The scale is
  // applied to the scores, so q enters exactly as the model made it. 61 -> 74 GFLOP/s in cache.
  // Score i of half h is the token 8 (i / 4) + 4 h + i % 4 of the chunk (unpacklo / unpackhi order).
  auto order = [](int i, int half) { return 8 * (i >> 2) + 4 * half + (i & 3); };
  alignas(64) uint32_t q_pairs[G][D / 2];
  for (int g = 0; g < G; ++g) {
    const uint16_t* src = reinterpret_cast<const uint16_t*>(q_in + g * q_head_stride);
    for (int d = 0; d < D / 2; ++d)
      q_pairs[g][d] = static_cast<uint32_t>(src[2 * d]) | (static_cast<uint32_t>(src[2 * d + 1]) << 16);
  }
  const __m512 vscale = _mm512_set1_ps(scale);
#else
  // Scores in fp32 from K split into even and odd tokens (shift / mask): score i of half h is token 2 i + h.
  auto order = [](int i, int half) { return 2 * i + half; };
  float q[G][D];
  for (int g = 0; g < G; ++g)
    for (int d = 0; d < D; ++d) q[g][d] = static_cast<float>(q_in[g * q_head_stride + d]) * scale;
#endif

  for (int c = 0; c < n_chunks; ++c) {
    const T* k_t = plan.k_of(item, first_chunk + c);
    const char* k_next = plan.k_at(k_ahead);
    k_ahead.advance(plan);
    __m512 acc_a[G], acc_b[G];
    for (int g = 0; g < G; ++g) acc_a[g] = acc_b[g] = _mm512_setzero_ps();
    for (int d = 0; d < D; d += 2) {
      if (k_next) {
        __builtin_prefetch(k_next + static_cast<int64_t>(d) * block_size * sizeof(T), 0, 2);
        __builtin_prefetch(k_next + static_cast<int64_t>(d + 1) * block_size * sizeof(T), 0, 2);
      }
      const __m512i r0 = _mm512_loadu_si512(k_t + static_cast<int64_t>(d) * block_size);
      const __m512i r1 = _mm512_loadu_si512(k_t + static_cast<int64_t>(d + 1) * block_size);
#if defined(__AVX512BF16__)
      const __m512bh a = (__m512bh)_mm512_unpacklo_epi16(r0, r1);
      const __m512bh b = (__m512bh)_mm512_unpackhi_epi16(r0, r1);
      for (int g = 0; g < G; ++g) {
        const __m512bh qd = (__m512bh)_mm512_set1_epi32(static_cast<int>(q_pairs[g][d / 2]));
        acc_a[g] = _mm512_dpbf16_ps(acc_a[g], a, qd);
        acc_b[g] = _mm512_dpbf16_ps(acc_b[g], b, qd);
      }
#else
      const __m512i rows[2] = {r0, r1};
      for (int r = 0; r < 2; ++r) {
        const __m512 lo = _mm512_castsi512_ps(_mm512_slli_epi32(rows[r], 16));
        const __m512 hi = _mm512_castsi512_ps(_mm512_and_si512(rows[r], mask));
        for (int g = 0; g < G; ++g) {
          const __m512 qd = _mm512_set1_ps(q[g][d + r]);
          acc_a[g] = _mm512_fmadd_ps(qd, lo, acc_a[g]);
          acc_b[g] = _mm512_fmadd_ps(qd, hi, acc_b[g]);
        }
      }
#endif
    }
    float* dst = sc + static_cast<size_t>(c) * G * kChunk;
    for (int g = 0; g < G; ++g) {
#if defined(__AVX512BF16__)
      acc_a[g] = _mm512_mul_ps(acc_a[g], vscale);
      acc_b[g] = _mm512_mul_ps(acc_b[g], vscale);
#endif
      _mm512_storeu_ps(dst + g * kChunk, acc_a[g]);
      _mm512_storeu_ps(dst + g * kChunk + kHalf, acc_b[g]);
    }
  }

  // Mask the first and last chunks' tokens outside [start, seq_len), then the softmax.
  float inv_sum[G];
  softmax<G>(sc, n_chunks, first_chunk, start, seq_len, order, inv_sum);

  // Outputs in registers: o[g] = sum_t p[g][t] V[t], each V row split into even and odd channels.
  __m512 o_lo[G][P], o_hi[G][P];
  for (int g = 0; g < G; ++g)
    for (int part = 0; part < P; ++part) o_lo[g][part] = o_hi[g][part] = _mm512_setzero_ps();
  for (int c = 0; c < n_chunks; ++c) {
    const int chunk = first_chunk + c;
    const T* v = plan.v_of(item, chunk);
    const char* v_next = plan.v_at(v_ahead);
    v_ahead.advance(plan);
    const float* probs = sc + static_cast<size_t>(c) * G * kChunk;
    const int t0 = chunk * kChunk;
    const bool edge = c == 0 || c == n_chunks - 1;
    for (int half = 0; half < 2; ++half) {
      for (int i = 0; i < kHalf; ++i) {
        if (v_next) prefetch_chunk_lines(v_next + (half * kHalf + i) * (kLines / kChunk) * 64, kLines / kChunk);
        const int j = order(i, half);
        if (edge && (t0 + j < start || t0 + j >= seq_len)) continue;  // never read: may be another's KV or NaN
        const T* row = v + static_cast<int64_t>(j) * D;
        __m512 lo[P], hi[P];
        for (int part = 0; part < P; ++part) {
          const __m512i w = _mm512_loadu_si512(row + part * kChunk);
          lo[part] = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
          hi[part] = _mm512_castsi512_ps(_mm512_and_si512(w, mask));
        }
        for (int g = 0; g < G; ++g) {
          const __m512 p = _mm512_set1_ps(probs[g * kChunk + half * kHalf + i]);
          for (int part = 0; part < P; ++part) {
            o_lo[g][part] = _mm512_fmadd_ps(p, lo[part], o_lo[g][part]);
            o_hi[g][part] = _mm512_fmadd_ps(p, hi[part], o_hi[g][part]);
          }
        }
      }
    }
  }
  for (int g = 0; g < G; ++g) {
    alignas(64) float lo[DH], hi[DH];
    for (int part = 0; part < P; ++part) {
      _mm512_store_ps(lo + part * kHalf, o_lo[g][part]);
      _mm512_store_ps(hi + part * kHalf, o_hi[g][part]);
    }
    T* dst = out + g * out_head_stride;
    for (int e = 0; e < DH; ++e) {
      const int part = e / kHalf, i = e % kHalf;
      dst[part * kChunk + 2 * i] = static_cast<T>(lo[e] * inv_sum[g]);
      dst[part * kChunk + 2 * i + 1] = static_cast<T>(hi[e] * inv_sum[g]);
    }
  }
}

template <int D, int G>
void run_bf16(const at::BFloat16* q, const Plan<at::BFloat16>& plan, int64_t n_items, int64_t q_tok, int64_t q_head,
              at::BFloat16* o, int64_t o_tok, int64_t o_head, double scale) {
  const int64_t kv_heads = plan.kv_heads;
  at::parallel_for(0, n_items, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch;
    run_stream(plan, begin, end, D, kAheadK, 0, [&](int64_t item, Cursor& k_ahead, Cursor& v_ahead) {
      const int64_t s = item / kv_heads, h = item % kv_heads;
      attend_bf16<D, G>(q + s * q_tok + h * G * q_head, q_head, plan, item, k_ahead, v_ahead,
                        static_cast<float>(scale), o + s * o_tok + h * G * o_head, o_head, scratch);
    });
  });
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
// ------------------------------------------------------------------------------------------------ fp32, AVX2
// fp32 caches hold twice the bytes of bf16 ones, so a decode step's attention is a larger share of it: a
// profile of a 512-row fp32 request on an AVX2-only EPYC put 25% of the engine's time in attend_one (which
// prefetches only its own item's next chunk, and whose softmax is scalar). This path prefetches K and V as
// streams across a thread's items, each a fixed number of chunks ahead, computes in 8-wide AVX2 registers
// (scores 16 tokens at a time, G x 2 accumulators; outputs 16 channels at a time over a chunk's tokens, into
// a per-item fp32 array that stays in L1) and vectorises the softmax. One layer of a 512-row step at
// context ~400 (one thread, KV on 2 MiB pages): 45-47 against 49-72 ms for attend_one on the same cache
// (the machine's noise); with the KV in L2, 19 against 38 ms. Scores keep the chunk's token order.

// e^x for x <= 0 in eight lanes: exp_nonpositive's polynomial with fused multiply-adds.
inline __m256 exp_nonpositive8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 y = _mm256_mul_ps(x, _mm256_set1_ps(1.4426950408889634f));
  const __m256 n = _mm256_round_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_mul_ps(_mm256_sub_ps(y, n), _mm256_set1_ps(0.6931471805599453f));
  __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
  for (const float c : {1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f, 0.5f, 1.0f, 1.0f})
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(c));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

inline float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

inline float hsum8(__m256 v) {
  __m128 m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_add_ps(m, _mm_movehl_ps(m, m));
  m = _mm_add_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// `softmax` for scores in token order, eight lanes at a time (the scalar exp was ~a quarter of this path's
// arithmetic).
template <int G>
void softmax8(float* sc, int n_chunks, int first_chunk, int start, int seq_len, float* inv_sum) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int c : {0, n_chunks - 1}) {
    const int base = (first_chunk + c) * kChunk;
    for (int g = 0; g < G; ++g)
      for (int t = 0; t < kChunk; ++t)
        if (base + t < start || base + t >= seq_len) sc[(static_cast<size_t>(c) * G + g) * kChunk + t] = neg_inf;
  }
  const __m256 vneg_inf = _mm256_set1_ps(neg_inf);
  for (int g = 0; g < G; ++g) {
    __m256 vm = vneg_inf;
    for (int c = 0; c < n_chunks; ++c) {
      const float* row = sc + (static_cast<size_t>(c) * G + g) * kChunk;
      for (int i = 0; i < kChunk; i += 8) vm = _mm256_max_ps(vm, _mm256_loadu_ps(row + i));
    }
    const __m256 m = _mm256_set1_ps(hmax8(vm));
    __m256 vsum = _mm256_setzero_ps();
    for (int c = 0; c < n_chunks; ++c) {
      float* row = sc + (static_cast<size_t>(c) * G + g) * kChunk;
      for (int i = 0; i < kChunk; i += 8) {
        const __m256 v = _mm256_loadu_ps(row + i);
        const __m256 p = _mm256_andnot_ps(_mm256_cmp_ps(v, vneg_inf, _CMP_EQ_OQ), exp_nonpositive8(_mm256_sub_ps(v, m)));
        _mm256_storeu_ps(row + i, p);
        vsum = _mm256_add_ps(vsum, p);
      }
    }
    inv_sum[g] = 1.0f / hsum8(vsum);
  }
}

// fp32 items are twice bf16's bytes: V prefetched a whole item ahead (attend_bf16's stream) can be evicted from
// a 512 KiB L2 by the current item's K and V before its use, so V runs a fixed number of chunks ahead, as K
// does; 1-4 chunks ahead measured within noise of each other (8 slower), 2 the steadiest.
constexpr int kAhead32 = 2;

template <int D, int G>
void attend_f32(const float* __restrict__ q_in, int64_t q_head_stride, const Plan<float>& plan, int64_t item,
                Cursor& k_ahead, Cursor& v_ahead, float scale, float* __restrict__ out, int64_t out_head_stride,
                std::vector<float>& scratch) {
  static_assert(D % kChunk == 0, "head_dim must be a multiple of 32");
  constexpr int kRowLines = kChunk * sizeof(float) / 64;  // lines in a K channel row of a chunk, per V token: D/16
  constexpr int kVTokenLines = D * sizeof(float) / 64;
  const auto [seq_len, start, first_chunk, n_chunks] = plan.span(item);
  if (n_chunks == 0) return write_zeros<G, D>(out, out_head_stride);
  const int block_size = plan.block_size;
  scratch.resize(static_cast<size_t>(G) * n_chunks * kChunk);
  float* sc = scratch.data();  // [chunk][g][32], token order

  alignas(32) float q[G][D];
  for (int g = 0; g < G; ++g)
    for (int d = 0; d < D; ++d) q[g][d] = q_in[g * q_head_stride + d] * scale;

  // Scores: s[g][t] = q[g] . K[t]; K is [channel][token] within a chunk.
  for (int c = 0; c < n_chunks; ++c) {
    const float* k_t = plan.k_of(item, first_chunk + c);
    const char* k_next = plan.k_at(k_ahead);
    k_ahead.advance(plan);
    float* dst = sc + static_cast<size_t>(c) * G * kChunk;
    for (int half = 0; half < 2; ++half) {
      __m256 acc[G][2];
      for (int g = 0; g < G; ++g) acc[g][0] = acc[g][1] = _mm256_setzero_ps();
      for (int d = 0; d < D; ++d) {
        if (k_next && (d % 2 == half))  // the next chunk's row d, spread over both halves
          for (int l = 0; l < kRowLines; ++l)
            __builtin_prefetch(k_next + static_cast<int64_t>(d) * block_size * sizeof(float) + l * 64, 0, 2);
        const float* row = k_t + static_cast<int64_t>(d) * block_size + half * kHalf;
        const __m256 a = _mm256_loadu_ps(row), b = _mm256_loadu_ps(row + 8);
        for (int g = 0; g < G; ++g) {
          const __m256 qd = _mm256_broadcast_ss(&q[g][d]);
          acc[g][0] = _mm256_fmadd_ps(qd, a, acc[g][0]);
          acc[g][1] = _mm256_fmadd_ps(qd, b, acc[g][1]);
        }
      }
      for (int g = 0; g < G; ++g) {
        _mm256_storeu_ps(dst + g * kChunk + half * kHalf, acc[g][0]);
        _mm256_storeu_ps(dst + g * kChunk + half * kHalf + 8, acc[g][1]);
      }
    }
  }

  float inv_sum[G];
  softmax8<G>(sc, n_chunks, first_chunk, start, seq_len, inv_sum);

  // Outputs: o[g] = sum_t p[g][t] V[t]; V is [token][channel] within a chunk.
  alignas(32) float o[G][D] = {};
  for (int c = 0; c < n_chunks; ++c) {
    const int chunk = first_chunk + c;
    const float* v = plan.v_of(item, chunk);
    const char* v_next = plan.v_at(v_ahead);
    v_ahead.advance(plan);
    const float* probs = sc + static_cast<size_t>(c) * G * kChunk;
    const int t0 = chunk * kChunk;
    // Tokens outside [start, seq_len) are never read: they may be another sequence's KV, or NaN.
    const int j0 = std::max(0, start - t0), j1 = std::min(kChunk, seq_len - t0);
    if (v_next) prefetch_chunk_lines(v_next, j0 * kVTokenLines);
    for (int part = 0; part < D / 16; ++part) {
      __m256 acc[G][2];
      for (int g = 0; g < G; ++g) {
        acc[g][0] = _mm256_load_ps(&o[g][part * 16]);
        acc[g][1] = _mm256_load_ps(&o[g][part * 16 + 8]);
      }
      for (int j = j0; j < j1; ++j) {
        if (v_next && part == 0) prefetch_chunk_lines(v_next + j * kVTokenLines * 64, kVTokenLines);
        const float* row = v + static_cast<int64_t>(j) * D + part * 16;
        const __m256 a = _mm256_loadu_ps(row), b = _mm256_loadu_ps(row + 8);
        for (int g = 0; g < G; ++g) {
          const __m256 p = _mm256_broadcast_ss(probs + g * kChunk + j);
          acc[g][0] = _mm256_fmadd_ps(p, a, acc[g][0]);
          acc[g][1] = _mm256_fmadd_ps(p, b, acc[g][1]);
        }
      }
      for (int g = 0; g < G; ++g) {
        _mm256_store_ps(&o[g][part * 16], acc[g][0]);
        _mm256_store_ps(&o[g][part * 16 + 8], acc[g][1]);
      }
    }
    if (v_next) prefetch_chunk_lines(v_next + j1 * kVTokenLines * 64, (kChunk - j1) * kVTokenLines);
  }
  for (int g = 0; g < G; ++g)
    for (int d = 0; d < D; ++d) out[g * out_head_stride + d] = o[g][d] * inv_sum[g];
}

template <int D, int G>
void run_f32(const float* q, const Plan<float>& plan, int64_t n_items, int64_t q_tok, int64_t q_head, float* o,
             int64_t o_tok, int64_t o_head, double scale) {
  const int64_t kv_heads = plan.kv_heads;
  at::parallel_for(0, n_items, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch;
    run_stream(plan, begin, end, 2 * D, kAhead32, kAhead32, [&](int64_t item, Cursor& k_ahead, Cursor& v_ahead) {
      const int64_t s = item / kv_heads, h = item % kv_heads;
      attend_f32<D, G>(q + s * q_tok + h * G * q_head, q_head, plan, item, k_ahead, v_ahead,
                       static_cast<float>(scale), o + s * o_tok + h * G * o_head, o_head, scratch);
    });
  });
}
#endif

template <typename T, int D, int G>
void run(const torch::Tensor& query, const torch::Tensor& kv_cache, const torch::Tensor& block_table,
         const torch::Tensor& seq_lens, torch::Tensor& out, double scale, int64_t window) {
  const int64_t n = query.size(0), kv_heads = kv_cache.size(1), block_size = kv_cache.size(2);
  const T* q = query.data_ptr<T>();
  const T* cache = kv_cache.data_ptr<T>();
  T* o = out.data_ptr<T>();
  const int32_t* table = block_table.data_ptr<int32_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const int64_t q_tok = query.stride(0), q_head = query.stride(1), o_tok = out.stride(0), o_head = out.stride(1);
  const int64_t table_stride = block_table.stride(0);
  const int64_t block_stride = kv_cache.stride(0), head_stride = kv_cache.stride(1);
  const Plan<T> plan{cache, block_stride, head_stride, table_stride, table, lens, static_cast<int>(kv_heads),
                     static_cast<int>(block_size), static_cast<int>(window), D};
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, at::BFloat16>) return run_bf16<D, G>(q, plan, n * kv_heads, q_tok, q_head, o, o_tok, o_head, scale);
#endif
#if defined(__AVX2__) && defined(__FMA__)
  if constexpr (std::is_same_v<T, float>) return run_f32<D, G>(q, plan, n * kv_heads, q_tok, q_head, o, o_tok, o_head, scale);
#endif
  at::parallel_for(0, n * kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t s = item / kv_heads;
      const int h = static_cast<int>(item % kv_heads);
      attend_one<T, D, G>(q + s * q_tok + h * G * q_head, q_head, cache, block_stride, head_stride,
                          table + s * table_stride, static_cast<int>(block_size), h, lens[s],
                          static_cast<int>(window), static_cast<float>(scale), o + s * o_tok + h * G * o_head, o_head,
                          scratch);
    }
  });
}

template <typename T, int D>
void dispatch_group(int64_t group, const torch::Tensor& query, const torch::Tensor& kv_cache,
                    const torch::Tensor& block_table, const torch::Tensor& seq_lens, torch::Tensor& out, double scale,
                    int64_t window) {
  switch (group) {
    case 1: return run<T, D, 1>(query, kv_cache, block_table, seq_lens, out, scale, window);
    case 2: return run<T, D, 2>(query, kv_cache, block_table, seq_lens, out, scale, window);
    case 4: return run<T, D, 4>(query, kv_cache, block_table, seq_lens, out, scale, window);
    case 8: return run<T, D, 8>(query, kv_cache, block_table, seq_lens, out, scale, window);
    default: TORCH_CHECK(false, "decode_attention: query heads per KV head must be 1, 2, 4 or 8, got ", group);
  }
}

template <typename T>
void dispatch_dim(int64_t dim, int64_t group, const torch::Tensor& query, const torch::Tensor& kv_cache,
                  const torch::Tensor& block_table, const torch::Tensor& seq_lens, torch::Tensor& out, double scale,
                  int64_t window) {
  switch (dim) {
    case 32: return dispatch_group<T, 32>(group, query, kv_cache, block_table, seq_lens, out, scale, window);
    case 64: return dispatch_group<T, 64>(group, query, kv_cache, block_table, seq_lens, out, scale, window);
    case 128: return dispatch_group<T, 128>(group, query, kv_cache, block_table, seq_lens, out, scale, window);
    case 256: return dispatch_group<T, 256>(group, query, kv_cache, block_table, seq_lens, out, scale, window);
    default: TORCH_CHECK(false, "decode_attention: head_dim must be 32, 64, 128 or 256, got ", dim);
  }
}

}  // namespace

// query [n, heads, head_dim], kv_cache [blocks, kv_heads, block_size, 2 * head_dim], block_table [n, max_blocks]
// int32, seq_lens [n] int32 (each sequence's length including the query token), out [n, heads, head_dim].
// window > 0: attend to the last `window` tokens only.
void decode_attention(torch::Tensor query, torch::Tensor kv_cache, torch::Tensor block_table, torch::Tensor seq_lens,
                      torch::Tensor out, double scale, int64_t window) {
  TORCH_CHECK(query.dim() == 3 && out.dim() == 3 && kv_cache.dim() == 4, "decode_attention: bad ranks");
  TORCH_CHECK(query.scalar_type() == kv_cache.scalar_type() && out.scalar_type() == query.scalar_type(),
              "decode_attention: query, cache and output must share a dtype");
  TORCH_CHECK(kv_cache.is_contiguous() && query.stride(2) == 1 && out.stride(2) == 1,
              "decode_attention: contiguous cache and head rows required");
  TORCH_CHECK(block_table.scalar_type() == torch::kInt32 && seq_lens.scalar_type() == torch::kInt32,
              "decode_attention: int32 block table and lengths required");
  const int64_t dim = query.size(2), heads = query.size(1), kv_heads = kv_cache.size(1);
  TORCH_CHECK(kv_cache.size(3) == 2 * dim, "decode_attention: cache rows must be 2 * head_dim");
  TORCH_CHECK(kv_cache.size(2) % kChunk == 0, "decode_attention: block size must be a multiple of 32");
  TORCH_CHECK(heads % kv_heads == 0, "decode_attention: heads must be a multiple of kv heads");
  TORCH_CHECK(seq_lens.size(0) == query.size(0) && block_table.size(0) == query.size(0),
              "decode_attention: one block-table row and one length per query");
  if (query.scalar_type() == torch::kBFloat16) {
    dispatch_dim<at::BFloat16>(dim, heads / kv_heads, query, kv_cache, block_table, seq_lens, out, scale, window);
  } else if (query.scalar_type() == torch::kFloat32) {
    dispatch_dim<float>(dim, heads / kv_heads, query, kv_cache, block_table, seq_lens, out, scale, window);
  } else {
    TORCH_CHECK(false, "decode_attention: bfloat16 or float32 only");
  }
}

// Whether this build has the AVX-512 bf16 path (else bf16 runs the plain loops: correct, but measured slower
// than vLLM-CPU's kernel, 58 against 36 ms for a 512-row step at context 400; the engine then keeps vLLM's).
bool vectorised_bf16() {
#if defined(__AVX512F__)
  return true;
#else
  return false;
#endif
}

// Whether this build has the AVX2 fp32 path (else fp32 runs attend_one's plain loops).
bool vectorised_f32() {
#if defined(__AVX2__) && defined(__FMA__)
  return true;
#else
  return false;
#endif
}

// csrc/elementwise.cpp, built into the same module (elr_rl/model/cpu_elementwise.py).
torch::Tensor rms_norm_bf16(torch::Tensor x, torch::Tensor weight, double eps);
torch::Tensor rotary_bf16(torch::Tensor x, torch::Tensor cos, torch::Tensor sin, int64_t rot);
// csrc/small_gemm.cpp (elr_rl/model/cpu_gemm.py).
torch::Tensor gemm_f32_panels(torch::Tensor x, torch::Tensor panels, int64_t n, c10::optional<torch::Tensor> bias);
bool vectorised_gemm();

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("decode_attention", &decode_attention, "decode attention over a paged KV cache (vLLM-CPU layout)");
  m.def("rms_norm_bf16", &rms_norm_bf16, "the model's RMSNorm on bf16 in one pass (same roundings)");
  m.def("rotary_bf16", &rotary_bf16, "the model's neox rotary embedding on bf16 [T, H, D] in one pass");
  m.def("vectorised_bf16", &vectorised_bf16, "whether bf16 caches run the AVX-512 path");
  m.def("vectorised_f32", &vectorised_f32, "whether fp32 caches run the AVX2 path");
  m.def("gemm_f32_panels", &gemm_f32_panels, "fp32 x W^T + b with W packed in panels of 16 columns (few rows)");
  m.def("vectorised_gemm", &vectorised_gemm, "whether gemm_f32_panels runs the AVX2 + FMA kernel");
}
