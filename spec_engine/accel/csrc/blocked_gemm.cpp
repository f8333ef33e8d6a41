// fp32 products of a few rows by a weight packed in column blocks, for the engine's CPU forwards
// (spec_engine/blocked_gemm.py builds this file on first use and explains why it exists).
//
// Layout: a weight W [N, K] (nn.Linear's [out, in]) is packed as P [ceil(N / NB)][K][NB], zero-padded to whole
// blocks: block b holds outputs b*NB .. b*NB+NB-1, and for each input index k their NB weights side by side.
// A block is one contiguous stream of memory that is read once per call, whatever the row count (up to NR_MAX rows
// share each load), so a product over 1-8 rows costs about what reading the weight costs.
//
// Prefetch: each k also asks for the cache lines PREFETCH_BYTES further along the stream (into the next block at a
// block's end). The hardware prefetcher alone keeps up with the stream at one row, but not while the FMAs of several
// rows occupy the core: measured on an AMD EPYC (Zen 5) at two threads, SmolLM2-135M's products over 1 / 4 / 8 / 12
// rows cost 12.3 / 16.4 / 21.4 / 25.0 ms without it and 12.7 / 13.0 / 13.0 / 18.2 ms with 8 KB ahead, so verifying
// up to 7 draft tokens costs about what decoding one does. Prefetching changes no arithmetic (results are bitwise the
// same) and never faults past the end.
//
// The fp32 stream is prefetched non-temporally (NTA): a weight is read once per forward, and a forward's weights
// (540 MB for SmolLM2-135M) would otherwise push everything else out of the last-level cache every step: the EAGLE
// head's bf16 weights (~20 MB, prefetched normally below), the KV cache, the interpreter's own data. Kept there, the
// head's catch-up costs 0.47 ms a round instead of 0.68, and plain decoding's own steps get faster too (one process,
// interleaved, 2 threads: plain decoding 9% less time, speculative 11% less; bench/results/decode-ab-nta-2threads.md,
// docs/benchmarks.md).
//
// Micro-kernel: for each k, NB/VL vector loads of P, one broadcast of x[r][k] per row, and an FMA per (row, vector):
// each output is one FMA chain over k = 0..K-1 in order. So a row's result never depends on how many other rows are
// in the call or which block of rows it lands in (batch-invariant, bitwise): verifying k draft tokens gives
// every position exactly the numbers that a one-token forward gives it.
#include <immintrin.h>
#include <cstddef>
#include <cstring>
#include <vector>

#if defined(__AVX512F__)
typedef __m512 vec;
static const int VL = 16;                     // floats per vector register
static const int NR_MAX = 8;                  // rows per micro-kernel call (32 vector registers)
#define VZERO() _mm512_setzero_ps()
#define VLOAD(p) _mm512_loadu_ps(p)
#define VSTORE(p, v) _mm512_storeu_ps(p, v)
#define VSET1(s) _mm512_set1_ps(s)
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VMUL(a, b) _mm512_mul_ps(a, b)
#define VADD(a, b) _mm512_add_ps(a, b)
#elif defined(__AVX2__) && defined(__FMA__)
typedef __m256 vec;
static const int VL = 8;
static const int NR_MAX = 2;                  // 16 vector registers: 2 rows x 4 accumulators + 4 loads + 1 broadcast
#define VZERO() _mm256_setzero_ps()
#define VLOAD(p) _mm256_loadu_ps(p)
#define VSTORE(p, v) _mm256_storeu_ps(p, v)
#define VSET1(s) _mm256_set1_ps(s)
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VMUL(a, b) _mm256_mul_ps(a, b)
#define VADD(a, b) _mm256_add_ps(a, b)
#else
#error "blocked_gemm needs AVX-512F or AVX2 with FMA"
#endif

static const int NV = 4;                      // vectors per column block
static const int NB = NV * VL;                // outputs per column block: 64 (AVX-512) or 32 (AVX2)
static const int LINE = 16;                   // floats per 64-byte cache line
static const int PREFETCH_BYTES = 8192;       // how far ahead of the loads the prefetches run (see above)
static const int PREFETCH_K = PREFETCH_BYTES / (NB * 4);

// out[r][0..NB) = sum_k x[r][k] * p[k][0..NB), for NR rows of x (row stride K).
template <int NR>
static void micro(const float* x, const float* p, int K, float* out) {
  vec acc[NR][NV];
  for (int r = 0; r < NR; r++)
    for (int v = 0; v < NV; v++) acc[r][v] = VZERO();
  for (int k = 0; k < K; k++) {
    vec w[NV];
    for (int v = 0; v < NV; v++) w[v] = VLOAD(p + (size_t)k * NB + v * VL);
    for (int c = 0; c < NB; c += LINE) _mm_prefetch((const char*)(p + (size_t)(k + PREFETCH_K) * NB + c), _MM_HINT_NTA);
    for (int r = 0; r < NR; r++) {
      vec xb = VSET1(x[(size_t)r * K + k]);
      for (int v = 0; v < NV; v++) acc[r][v] = VFMA(xb, w[v], acc[r][v]);
    }
  }
  for (int r = 0; r < NR; r++)
    for (int v = 0; v < NV; v++) VSTORE(out + r * NB + v * VL, acc[r][v]);
}

typedef void (*micro_fn)(const float*, const float*, int, float*);
static const micro_fn MICRO[9] = {nullptr, micro<1>, micro<2>, micro<NR_MAX < 3 ? 1 : 3>, micro<NR_MAX < 4 ? 1 : 4>,
                                  micro<NR_MAX < 5 ? 1 : 5>, micro<NR_MAX < 6 ? 1 : 6>, micro<NR_MAX < 7 ? 1 : 7>,
                                  micro<NR_MAX < 8 ? 1 : 8>};

extern "C" int blocked_gemm_block_width() { return NB; }

// Many rows (a batch of sequences, a long draft tree): the weight block stays in cache while tiles of rows pass over
// it, so what bounds the product is the FMAs per load, not the stream. `micro_half` computes half a block (NH
// vectors) for up to NR_WIDE rows: 2 loads and NR broadcasts feed 2 NR FMAs per k (AVX2: 6 rows x 2 vectors = 12
// accumulators, as in BLIS's 6x16 Haswell kernel), where `micro` at NR_MAX rows feeds 8 with 4 loads. Each output is
// still one FMA chain over k = 0..K-1 in order from zero: bitwise what `micro` gives it, whatever the row count.
static const int NH = NV / 2;                 // vectors per half block
#if defined(__AVX512F__)
static const int NR_WIDE = 12;                // 24 accumulators + 2 loads + 1 broadcast of 32 registers
#else
static const int NR_WIDE = 6;                 // 12 accumulators + 2 loads + 1 broadcast of 16 registers
#endif
static const int TILE_ROWS = NR_WIDE > NR_MAX ? NR_WIDE : NR_MAX;

template <int NR>
static void micro_half(const float* x, const float* p, int K, float* out, bool stream) {
  vec acc[NR][NH];
  for (int r = 0; r < NR; r++)
    for (int v = 0; v < NH; v++) acc[r][v] = VZERO();
  for (int k = 0; k < K; k++) {
    vec w[NH];
    for (int v = 0; v < NH; v++) w[v] = VLOAD(p + (size_t)k * NB + v * VL);
    if (stream) _mm_prefetch((const char*)(p + (size_t)(k + PREFETCH_K) * NB), _MM_HINT_T0);
    for (int r = 0; r < NR; r++) {
      vec xb = VSET1(x[(size_t)r * K + k]);
      for (int v = 0; v < NH; v++) acc[r][v] = VFMA(xb, w[v], acc[r][v]);
    }
  }
  for (int r = 0; r < NR; r++)
    for (int v = 0; v < NH; v++) VSTORE(out + r * NB + v * VL, acc[r][v]);
}

typedef void (*micro_half_fn)(const float*, const float*, int, float*, bool);
#define HALF(n) micro_half<NR_WIDE < (n) ? 1 : (n)>
static const micro_half_fn MICRO_HALF[13] = {nullptr, HALF(1), HALF(2), HALF(3), HALF(4), HALF(5), HALF(6), HALF(7),
                                             HALF(8), HALF(9), HALF(10), HALF(11), HALF(12)};
#undef HALF

// y [M, N] = micro products of M rows by the packed blocks (+ bias [N]): threads share the column blocks, and each
// block's rows go through `micro` (rows, row offset, the block's index, tile) NR_MAX or fewer at a time, split evenly.
template <typename Micro>
static void over_blocks(const float* bias, float* y, int M, int N, int threads, Micro micro, int tile_max = NR_MAX) {
  if (M <= 0 || N <= 0) return;
  const int blocks = (N + NB - 1) / NB;
  const int row_blocks = (M + tile_max - 1) / tile_max, nr = (M + row_blocks - 1) / row_blocks;  // rows split evenly
  #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
  for (int b = 0; b < blocks; b++) {
    const int j0 = b * NB, width = N - j0 < NB ? N - j0 : NB;
    float tile[TILE_ROWS * NB];
    for (int r0 = 0; r0 < M; r0 += nr) {
      const int rows = M - r0 < nr ? M - r0 : nr;
      micro(rows, r0, b, tile);
      for (int r = 0; r < rows; r++) {
        float* dst = y + (size_t)(r0 + r) * N + j0;
        const float* src = tile + r * NB;
        if (bias)
          for (int j = 0; j < width; j++) dst[j] = src[j] + bias[j0 + j];
        else
          std::memcpy(dst, src, width * sizeof(float));
      }
    }
  }
}

// y [M, N] = x [M, K] @ W^T (+ bias [N]), W packed as above.
// Rows from WIDE_ROWS on take the half-block kernel: measured faster from 3 rows on an AVX2 EPYC (2 threads, a
// 3072 x 576 weight: 3 / 4 / 8 / 32 rows 0.37 / 0.34 / 0.55 / 1.79 ms against 0.55 / 0.60 / 0.67 / 2.34 ms);
// one and two rows stay on the streaming kernel above, as measured for decoding.
#if defined(__AVX512F__)
// On an AVX-512 EPYC the half-block kernel made verify widths of 3-16 rows slower (SmolLM2-135M: 12 rows cost 1.9
// plain steps instead of ~1.05, so the cost-sized draft trees shrank to one node); a verify (at most 16 rows, the
// engine's MAX_ROWS) keeps the streaming kernel there, and only a batch's or a prompt's many rows take the wide one.
static const int WIDE_ROWS = 17;
#else
static const int WIDE_ROWS = 3;
#endif

extern "C" void blocked_gemm(const float* x, const float* packed, const float* bias, float* y, int M, int K, int N,
                             int threads) {
  if (M >= WIDE_ROWS) {
    over_blocks(bias, y, M, N, threads, [=](int rows, int r0, int b, float* tile) {
      for (int h = 0; h < NV / NH; h++)
        MICRO_HALF[rows](x + (size_t)r0 * K, packed + (size_t)b * K * NB + h * NH * VL, K, tile + h * NH * VL, r0 == 0);
    }, NR_WIDE);
    return;
  }
  over_blocks(bias, y, M, N, threads, [=](int rows, int r0, int b, float* tile) {
    MICRO[rows](x + (size_t)r0 * K, packed + (size_t)b * K * NB, K, tile);
  });
}

#if defined(__AVX512BF16__)
// bf16 weights, fp32 rows and outputs (the EAGLE head beside an fp32 target: half the bytes to stream). The weight is
// packed as P [ceil(N / NB)][ceil(K / 2)][NB][2] (bf16, zero-padded): for each pair of inputs, each output's two
// weights side by side, as AVX-512 BF16's dot product reads them. Each row of x is rounded to bf16 once (to nearest
// even), then every output is one chain of pairwise dot products over k in order (fp32 accumulation), so a row's
// result does not depend on the other rows of the call either.
static const int PAIR_PREFETCH_K = PREFETCH_BYTES / (NB * 4);   // pairs: NB outputs x 2 inputs x 2 bytes each

template <int NR>
static void micro_bf16(const unsigned int* x, const unsigned short* p, int K2, float* out) {
  __m512 acc[NR][NV];
  for (int r = 0; r < NR; r++)
    for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_ps();
  for (int k = 0; k < K2; k++) {
    __m512i w[NV];
    for (int v = 0; v < NV; v++) w[v] = _mm512_loadu_si512((const void*)(p + ((size_t)k * NB + v * VL) * 2));
    for (int c = 0; c < NB * 2; c += 32)
      _mm_prefetch((const char*)(p + (size_t)(k + PAIR_PREFETCH_K) * NB * 2 + c), _MM_HINT_T0);
    for (int r = 0; r < NR; r++) {
      const __m512i xb = _mm512_set1_epi32((int)x[(size_t)r * K2 + k]);
      for (int v = 0; v < NV; v++) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], (__m512bh)xb, (__m512bh)w[v]);
    }
  }
  for (int r = 0; r < NR; r++)
    for (int v = 0; v < NV; v++) _mm512_storeu_ps(out + r * NB + v * VL, acc[r][v]);
}

typedef void (*micro_bf16_fn)(const unsigned int*, const unsigned short*, int, float*);
static const micro_bf16_fn MICRO_BF16[9] = {nullptr, micro_bf16<1>, micro_bf16<2>, micro_bf16<3>, micro_bf16<4>,
                                            micro_bf16<5>, micro_bf16<6>, micro_bf16<7>, micro_bf16<8>};

static inline unsigned short to_bf16(float value) {          // round to nearest even (inputs are finite)
  unsigned int bits;
  std::memcpy(&bits, &value, 4);
  return (unsigned short)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

extern "C" void blocked_gemm_bf16(const float* x, const unsigned short* packed, const float* bias, float* y, int M,
                                  int K, int N, int threads) {
  if (M <= 0 || N <= 0) return;
  const int K2 = (K + 1) / 2;
  std::vector<unsigned int> pairs((size_t)M * K2);            // x in bf16, two inputs per 32-bit lane
  for (int r = 0; r < M; r++)
    for (int k = 0; k < K2; k++) {
      const unsigned int lo = to_bf16(x[(size_t)r * K + 2 * k]);
      const unsigned int hi = 2 * k + 1 < K ? to_bf16(x[(size_t)r * K + 2 * k + 1]) : 0u;
      pairs[(size_t)r * K2 + k] = lo | (hi << 16);
    }
  const unsigned int* rows_bf16 = pairs.data();
  over_blocks(bias, y, M, N, threads, [=](int rows, int r0, int b, float* tile) {
    MICRO_BF16[rows](rows_bf16 + (size_t)r0 * K2, packed + (size_t)b * K2 * NB * 2, K2, tile);
  });
}
#endif
