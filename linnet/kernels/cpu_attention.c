/* Linnet's CPU attention for tokens that each read one cache row: decode steps, the decoding rows
 * of a mixed pass, and prompts' tokens once the pass has written their keys. Token i's query heads
 * attend to row rows[i] of the cache at positions [max(0, positions[i] - window + 1), positions[i]],
 * with an optional sink logit per head.
 *
 * SDPA's CPU kernel (flash attention) blocks over queries; with one query a row it ran a 16-row
 * SmolLM2 layer in ~415 us, a third of a decode step's non-linear time. Here each token is a
 * task, its KV heads in turn: scores of its G query heads against the visible keys (up to four
 * heads a key load), a softmax, then the weighted sum of the values (eight chunks of a head at a
 * time, as independent FMA chains). The cache is f32, bf16 or f16, widened in registers;
 * head_dim is a multiple of 8.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "kernels.h"

static inline AVX2 float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* e^x of eight floats, for the softmax (x <= 0 there): x = n ln2 + r with |r| <= ln2 / 2, e^r by
 * Cephes' polynomial (within 2 ulp of expf), 2^n put into the exponent bits. x below -87 (e^x
 * under f32's normal range) is taken as -87: about 1e-38, where a softmax weight is 0. */
static inline AVX2 __m256 exp8(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x); /* ln 2 in two parts: r stays exact */
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i two_n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(two_n));
}

/* s[0 .. L) = e^(s - top), in place; returns their sum. */
static inline AVX2 float exp_and_sum(float *s, long L, float top) {
    __m256 vtop = _mm256_set1_ps(top), sum = _mm256_setzero_ps();
    long j = 0;
    for (; j + 8 <= L; j += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), vtop));
        _mm256_storeu_ps(s + j, e);
        sum = _mm256_add_ps(sum, e);
    }
    if (j < L) { /* the last few through a buffer of eight, so every weight comes from exp8 */
        float tail[8];
        for (long m = 0; m < 8; m++)
            tail[m] = j + m < L ? s[j + m] - top : -INFINITY;
        __m256 e = exp8(_mm256_loadu_ps(tail));
        _mm256_storeu_ps(tail, e);
        for (long m = 0; j + m < L; m++)
            s[j + m] = tail[m];
        /* the places past L hold e^-87 each: too small to move a sum of at least 1 */
        sum = _mm256_add_ps(sum, e);
    }
    return hsum(sum);
}

#define HEADS_AT_ONCE 4   /* query heads scored together: each key is loaded once for them */
#define CHUNKS_AT_ONCE 8  /* 8-float chunks of an output head summed together: independent FMA chains */

/* Scores of query heads g0 .. g0 + gn (gn <= 4) against keys j0 .. j1, scaled, into s[g][j]. */
static AVX2 void score(int type, const float *q, long gn, long D, const char *k, long pos_stride, long j0, long j1,
                       float scale, float *s, long L) {
    long elem = type_bytes(type);
    for (long j = j0; j < j1; j++) {
        const char *kj = k + j * pos_stride * elem;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (long d = 0; d < D; d += 8) {
            __m256 kv = load8(kj, type, d);
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), kv, a0);
            if (gn > 1) a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + D + d), kv, a1);
            if (gn > 2) a2 = _mm256_fmadd_ps(_mm256_loadu_ps(q + 2 * D + d), kv, a2);
            if (gn > 3) a3 = _mm256_fmadd_ps(_mm256_loadu_ps(q + 3 * D + d), kv, a3);
        }
        s[j - j0] = hsum(a0) * scale;
        if (gn > 1) s[L + j - j0] = hsum(a1) * scale;
        if (gn > 2) s[2 * L + j - j0] = hsum(a2) * scale;
        if (gn > 3) s[3 * L + j - j0] = hsum(a3) * scale;
    }
}

/* One token's G query heads (q, G x D) against keys/values j0..j1 of one KV head. */
static AVX2 void attend(int type, const float *q, long G, long D, const char *k, const char *v, long pos_stride,
                        long j0, long j1, const float *sinks, float scale, float *scores, float *out) {
    long elem = type_bytes(type), L = j1 - j0;
    for (long g = 0; g < G; g += HEADS_AT_ONCE)
        score(type, q + g * D, G - g < HEADS_AT_ONCE ? G - g : HEADS_AT_ONCE, D, k, pos_stride, j0, j1, scale,
              scores + g * L, L);
    for (long g = 0; g < G; g++) {
        float *s = scores + g * L, top = sinks ? sinks[g] : -INFINITY;
        for (long j = 0; j < L; j++)
            top = s[j] > top ? s[j] : top;
        float total = (sinks ? expf(sinks[g] - top) : 0.0f) + exp_and_sum(s, L, top);
        __m256 norm = _mm256_set1_ps(1.0f / total);
        for (long d0 = 0; d0 < D; d0 += 8 * CHUNKS_AT_ONCE) {
            long chunks = (D - d0) / 8 < CHUNKS_AT_ONCE ? (D - d0) / 8 : CHUNKS_AT_ONCE;
            __m256 acc[CHUNKS_AT_ONCE];
            for (long c = 0; c < CHUNKS_AT_ONCE; c++) acc[c] = _mm256_setzero_ps();
            for (long j = 0; j < L; j++) {
                const char *vj = v + (j0 + j) * pos_stride * elem;
                __m256 p = _mm256_set1_ps(s[j]);
                for (long c = 0; c < CHUNKS_AT_ONCE; c++)
                    if (c < chunks) acc[c] = _mm256_fmadd_ps(p, load8(vj, type, d0 + 8 * c), acc[c]);
            }
            for (long c = 0; c < chunks; c++)
                _mm256_storeu_ps(out + g * D + d0 + 8 * c, _mm256_mul_ps(acc[c], norm));
        }
    }
}

/* Asks for positions j0 .. j1 of a cache row, every KV head (`span` bytes from each position's
 * start), ahead of the walks over them. A decode step finds its row's keys and values in memory,
 * not in cache (the weights streamed past since): walked a head at a time, 128 bytes every 384, the
 * loads waited on memory one after another, and attention took 2 ms of SmolLM2's one-row bf16 step
 * at position 250 (against 0.45 with the row in cache). Asked for all at once, the lines arrive
 * together while the first head's scores are computed. */
static inline void prefetch_span(const char *base, long j0, long j1, long stride, long span) {
    for (long j = j0; j < j1; j++)
        for (long b = 0; b < span; b += 64)
            _mm_prefetch(base + j * stride + b, _MM_HINT_T0);
}

/* Tokens [i0, i1) on the calling thread; `scores` holds G * max_seq floats. */
static AVX2 void attend_tokens(int type, const float *q, long H, long KVH, long D, const void *k, const void *v,
                               long row_stride, long pos_stride, long batch, long max_seq, const int32_t *rows,
                               const int32_t *positions, long window, const float *sinks, float scale, float *out,
                               long i0, long i1, float *scores) {
    long G = H / KVH, elem = type_bytes(type);
    for (long i = i0; i < i1; i++) {  /* a token's KV heads in turn: its row's positions read in order */
        long pos = positions[i];
        if (pos < max_seq && pos >= 0 && rows[i] >= 0 && rows[i] < batch) {
            long j0 = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0, row = rows[i] * row_stride * elem;
            prefetch_span((const char *)k + row, j0, pos + 1, pos_stride * elem, KVH * D * elem);
            prefetch_span((const char *)v + row, j0, pos + 1, pos_stride * elem, KVH * D * elem);
        }
        for (long h = 0; h < KVH; h++) {
            float *o = out + (i * H + h * G) * D;
            if (pos >= max_seq || pos < 0 || rows[i] < 0 || rows[i] >= batch) {  /* padding, or no such row */
                for (long e = 0; e < G * D; e++) o[e] = 0.0f;
                continue;
            }
            long j0 = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
            long base = (rows[i] * row_stride + h * D) * elem;
            attend(type, q + (i * H + h * G) * D, G, D, (const char *)k + base, (const char *)v + base, pos_stride,
                   j0, pos + 1, sinks ? sinks + h * G : NULL, scale, scores, o);
        }
    }
}

/* q [n, H, D] f32; k and v point at position 0 of row 0, KV head 0 of one layer's cache, whose
 * rows are row_stride elements apart and positions pos_stride apart (KV heads D apart); out
 * [n, H, D] f32. A token at a position >= max_seq is padding, and one whose row is not in
 * [0, batch) reads nothing: their output is zero. sinks: [H] or
 * NULL. Tokens [i0, i1) on the calling thread, for a caller with a pool of its own (XLA's). */
int linnet_attention_tokens(int type, const float *q, long H, long KVH, long D, const void *k, const void *v,
                            long row_stride, long pos_stride, long batch, long max_seq, const int32_t *rows,
                            const int32_t *positions, long window, const float *sinks, float scale, float *out,
                            long i0, long i1) {
    float *scores = malloc((H / KVH) * max_seq * sizeof(float));
    if (!scores)
        return -1;
    attend_tokens(type, q, H, KVH, D, k, v, row_stride, pos_stride, batch, max_seq, rows, positions, window, sinks,
                  scale, out, i0, i1, scores);
    free(scores);
    return 0;
}

/* The same over n tokens, on `threads` OpenMP threads (the pool torch uses), a token at a time.
 * Returns -1 if out of memory. */
int linnet_attention(int type, const float *q, long n, long H, long KVH, long D, const void *k, const void *v,
                     long row_stride, long pos_stride, long batch, long max_seq, const int32_t *rows,
                     const int32_t *positions, long window, const float *sinks, float scale, float *out, int threads) {
    int failed = 0;
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1) reduction(| : failed)
    for (long i = 0; i < n; i++)
        failed |= linnet_attention_tokens(type, q, H, KVH, D, k, v, row_stride, pos_stride, batch, max_seq, rows,
                                          positions, window, sinks, scale, out, i, i + 1);
    return failed ? -1 : 0;
}
