/* Linnet's CPU attention for tokens that each read one cache row: decode steps, the decoding rows
 * of a mixed pass, and prompts' tokens once the pass has written their keys. Token i's query heads
 * attend to row rows[i] of the cache at positions [max(0, positions[i] - window + 1), positions[i]],
 * with an optional sink logit per head.
 *
 * SDPA's CPU kernel (flash attention) blocks over queries; with one query a row it ran a 16-row
 * SmolLM2 layer in ~415 us, a third of a decode step's non-linear time. Here each token's KV head
 * is a task: scores of its G query heads against the visible keys (up to four
 * heads a key load), a softmax, then the weighted sum of the values (eight chunks of a head at a
 * time, as independent FMA chains). The cache is f32, bf16 or f16, widened in registers;
 * head_dim is a multiple of 8.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

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
    return hsum8(sum);
}

#define HEADS_AT_ONCE 4   /* query heads scored together: each key is loaded once for them */
#define CHUNKS_AT_ONCE 8  /* 8-float chunks of an output head summed together: independent FMA chains */

/* Scores of query heads g0 .. g0 + gn (gn <= 4) against keys j0 .. j1, scaled, into s[g][j]. */
static inline AVX2 __attribute__((always_inline)) void score(int type, const float *q, long gn, long D, const char *k,
                                                              long pos_stride, long j0, long j1, float scale, float *s,
                                                              long L) {
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
        s[j - j0] = hsum8(a0) * scale;
        if (gn > 1) s[L + j - j0] = hsum8(a1) * scale;
        if (gn > 2) s[2 * L + j - j0] = hsum8(a2) * scale;
        if (gn > 3) s[3 * L + j - j0] = hsum8(a3) * scale;
    }
}

/* Each score s capped as softcap * tanh(s / softcap) (Gemma 2's), in place, eight at a time and the
 * last few through a buffer of eight: every score through `tanh8`, whatever path (AVX2, AVX-512,
 * bf16 pairs, a span's parts) scored it, so its capped value does not depend on which ran it. */
static inline AVX2 void cap_scores(float *s, long L, float softcap) {
    __m256 cap = _mm256_set1_ps(softcap);
    long j = 0;
    for (; j + 8 <= L; j += 8)
        _mm256_storeu_ps(s + j, _mm256_mul_ps(cap, tanh8(_mm256_div_ps(_mm256_loadu_ps(s + j), cap))));
    if (j < L) {
        float tail[8] = {0};
        memcpy(tail, s + j, (L - j) * sizeof(float));
        _mm256_storeu_ps(tail, _mm256_mul_ps(cap, tanh8(_mm256_div_ps(_mm256_loadu_ps(tail), cap))));
        memcpy(s + j, tail, (L - j) * sizeof(float));
    }
}

/* The softmax of each of G heads' L scores (rows of s) in place, unnormalized, with a sink logit
 * per head if any, the scores capped first if softcap > 0; norm[g] gets 1 / head g's sum, and stats
 * (if not NULL) [2g] its largest score and [2g + 1] its sum, for merging parts of a span (`merge_parts`). */
static inline AVX2 void softmax_rows(float *scores, long G, long L, const float *sinks, float softcap, float *norm,
                                     float *stats) {
    for (long g = 0; g < G; g++) {
        float *s = scores + g * L, top = sinks ? sinks[g] : -INFINITY;
        if (softcap > 0.0f)
            cap_scores(s, L, softcap);
        __m256 tops = _mm256_set1_ps(top); /* eight running maxima: one was a chain of L dependent compares */
        long j = 0;
        for (; j + 8 <= L; j += 8)
            tops = _mm256_max_ps(tops, _mm256_loadu_ps(s + j));
        float lanes[8];
        _mm256_storeu_ps(lanes, tops);
        for (int m = 0; m < 8; m++)
            top = lanes[m] > top ? lanes[m] : top;
        for (; j < L; j++)
            top = s[j] > top ? s[j] : top;
        float sum = exp_and_sum(s, L, top);
        norm[g] = 1.0f / ((sinks ? expf(sinks[g] - top) : 0.0f) + sum);
        if (stats)
            stats[2 * g] = top, stats[2 * g + 1] = sum;
    }
}

/* One token's G query heads (q, G x D) against keys/values j0..j1 of one KV head, 8 floats a
 * vector (AVX2). */
static inline AVX2 __attribute__((always_inline)) void attend(int type, const float *q, long G, long D, const char *k,
                                                               const char *v, long pos_stride, long j0, long j1,
                                                               const float *sinks, float scale, float softcap,
                                                               float *scores, float *out, float *stats) {
    long elem = type_bytes(type), L = j1 - j0;
    float norms[G];
    for (long g = 0; g < G; g += HEADS_AT_ONCE)
        score(type, q + g * D, G - g < HEADS_AT_ONCE ? G - g : HEADS_AT_ONCE, D, k, pos_stride, j0, j1, scale,
              scores + g * L, L);
    softmax_rows(scores, G, L, sinks, softcap, norms, stats);
    for (long g = 0; g < G; g++) {
        float *s = scores + g * L;
        __m256 norm = _mm256_set1_ps(norms[g]);
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

/* ---- the same with 16 floats a vector, for AVX-512 CPUs and head_dim a multiple of 16. A
 * SmolLM2 layer's row at position 250 (3 KV heads of 3 query heads, bf16): 18-19 us in cache on
 * AVX2, as each key's widening is repeated for every query head it serves and each value's too. Here
 * a key or value is widened once for up to four heads (`gn`, a constant in each copy), a head's
 * query is read from L1 by the FMAs, and a value's 64 floats are summed into four heads' 16
 * accumulators at once. */

#define AVX512 __attribute__((target("avx512f,avx2,fma,f16c")))

static inline AVX512 __attribute__((always_inline)) __m512 load16(const void *p, int type, long i) {
    if (type == F32)
        return _mm512_loadu_ps((const float *)p + i);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i));
    if (type == BF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

/* The four lane sums of a, b, c, d: [sum a, sum b, sum c, sum d]. */
static inline AVX512 __attribute__((always_inline)) __m128 sum4(__m512 a, __m512 b, __m512 c, __m512 d) {
#define HALVES(x) _mm256_add_ps(_mm512_castps512_ps256(x), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)))
    __m256 ab = _mm256_hadd_ps(HALVES(a), HALVES(b)), cd = _mm256_hadd_ps(HALVES(c), HALVES(d));
#undef HALVES
    __m256 abcd = _mm256_hadd_ps(ab, cd); /* each 128-bit half: the four sums of its half of the lanes */
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

/* The body of a scorer (`score16`, `score_pairs`), over its j0, j1, D, gn, scale, s and L: the
 * scores of gn (1..4) query heads against keys j0..j1, scaled, into s[g][j - j0]; four keys at a
 * time, whose sums over their lanes are taken together (`sum4`), not one after another. Each
 * product covers STEP elements of a head: KEY_T kv = LOAD_KEY(j, d) is key j's from element d,
 * and DOT(acc, g, d, kv) is acc plus query head g's times them, in 16 f32 lanes. */
#define SCORE_KEYS(STEP, KEY_T, LOAD_KEY, DOT)                                                                \
    do {                                                                                                      \
        long j = j0;                                                                                          \
        __m128 vscale = _mm_set1_ps(scale);                                                                   \
        for (; j + 4 <= j1; j += 4) {                                                                         \
            __m512 a[4][4];                                                                                   \
            for (int g = 0; g < 4; g++)                                                                       \
                for (int t = 0; t < 4; t++)                                                                   \
                    a[g][t] = _mm512_setzero_ps();                                                            \
            for (long d = 0; d < D; d += STEP)                                                                \
                for (int t = 0; t < 4; t++) {                                                                 \
                    KEY_T kv = LOAD_KEY(j + t, d);                                                            \
                    for (int g = 0; g < gn; g++)                                                              \
                        a[g][t] = DOT(a[g][t], g, d, kv);                                                     \
                }                                                                                             \
            for (int g = 0; g < gn; g++)                                                                      \
                _mm_storeu_ps(s + g * L + j - j0, _mm_mul_ps(sum4(a[g][0], a[g][1], a[g][2], a[g][3]), vscale)); \
        }                                                                                                     \
        for (; j < j1; j++) {                                                                                 \
            __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()}; \
            for (long d = 0; d < D; d += STEP) {                                                              \
                KEY_T kv = LOAD_KEY(j, d);                                                                    \
                for (int g = 0; g < gn; g++)                                                                  \
                    a[g] = DOT(a[g], g, d, kv);                                                               \
            }                                                                                                 \
            for (int g = 0; g < gn; g++)                                                                      \
                s[g * L + j - j0] = _mm512_reduce_add_ps(a[g]) * scale;                                       \
        }                                                                                                     \
    } while (0)

/* Scores of gn (1..4) query heads (f32) against keys j0..j1 of any cache type, each key widened
 * to 16 floats a load (`SCORE_KEYS`). */
static inline AVX512 __attribute__((always_inline)) void score16(int type, int gn, const float *q, long D,
                                                                  const char *k, long pos_stride, long j0, long j1,
                                                                  float scale, float *s, long L) {
    long elem = type_bytes(type);
#define KEY16(j, d) load16(k + (j) * pos_stride * elem, type, d)
#define FMA16(acc, g, d, kv) _mm512_fmadd_ps(_mm512_loadu_ps(q + (g) * D + (d)), kv, acc)
    SCORE_KEYS(16, __m512, KEY16, FMA16);
#undef KEY16
#undef FMA16
}

/* out[g] = norm[g] * sum_j s[g][j] v_j over columns [d0, d0 + 16 chunks) for gn (1..4) heads. */
static inline AVX512 __attribute__((always_inline)) void weigh16(int type, int gn, int chunks, const char *v,
                                                                  long pos_stride, long j0, long L, const float *s,
                                                                  const float *norm, long D, long d0, float *out) {
    long elem = type_bytes(type);
    __m512 acc[4][4];
    for (int g = 0; g < 4; g++)
        for (int c = 0; c < 4; c++)
            acc[g][c] = _mm512_setzero_ps();
    for (long j = 0; j < L; j++) {
        const char *vj = v + (j0 + j) * pos_stride * elem;
        __m512 x[4];
        for (int c = 0; c < chunks; c++)
            x[c] = load16(vj, type, d0 + 16 * c);
        for (int g = 0; g < gn; g++) {
            __m512 p = _mm512_set1_ps(s[g * L + j]);
            for (int c = 0; c < chunks; c++)
                acc[g][c] = _mm512_fmadd_ps(p, x[c], acc[g][c]);
        }
    }
    for (int g = 0; g < gn; g++)
        for (int c = 0; c < chunks; c++)
            _mm512_storeu_ps(out + g * D + d0 + 16 * c, _mm512_mul_ps(acc[g][c], _mm512_set1_ps(norm[g])));
}

/* `score16` for bf16 queries (qb, D a head, D % 32 == 0) against a bf16 cache, by VDPBF16PS: 32
 * products of a query head and a key an instruction, exact, summed in f32, where score16 widens
 * each key's values and does 16 (a bf16 model's queries are bf16 already). A packed prompt's
 * tokens score their whole prefix each, so this is most of a long prompt's attention. */
static AVX512BF16 void score_pairs(int gn, const uint16_t *qb, long D, const uint16_t *k, long pos_stride, long j0,
                                   long j1, float scale, float *s, long L) {
#define KEY_PAIRS(j, d) (__m512bh)_mm512_loadu_si512(k + (j) * pos_stride + (d))
#define DOT_PAIRS(acc, g, d, kv) _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(qb + (g) * D + (d)), kv)
    SCORE_KEYS(32, __m512bh, KEY_PAIRS, DOT_PAIRS);
#undef KEY_PAIRS
#undef DOT_PAIRS
}

static inline AVX512 __attribute__((always_inline)) void attend16_heads(int type, int gn, const float *q,
                                                                         const uint16_t *qb, long D,
                                                                         const char *k, const char *v,
                                                                         long pos_stride, long j0, long j1,
                                                                         const float *sinks, float scale,
                                                                         float softcap, float *scores, float *out,
                                                                         float *stats) {
    long L = j1 - j0, d0 = 0;
    float norm[4];
    if (qb)
        score_pairs(gn, qb, D, (const uint16_t *)k, pos_stride, j0, j1, scale, scores, L);
    else
        score16(type, gn, q, D, k, pos_stride, j0, j1, scale, scores, L);
    softmax_rows(scores, gn, L, sinks, softcap, norm, stats);
    for (; d0 + 64 <= D; d0 += 64)
        weigh16(type, gn, 4, v, pos_stride, j0, L, scores, norm, D, d0, out);
    for (; d0 < D; d0 += 16)
        weigh16(type, gn, 1, v, pos_stride, j0, L, scores, norm, D, d0, out);
}

/* `attend` with 16 floats a vector: the heads four at a time. qb: the queries in bf16 for
 * `score_pairs`, or NULL. */
static inline AVX512 __attribute__((always_inline)) void attend16(int type, const float *q, const uint16_t *qb,
                                                                   long G, long D, const char *k, const char *v,
                                                                   long pos_stride, long j0, long j1,
                                                                   const float *sinks, float scale, float softcap,
                                                                   float *scores, float *out, float *stats) {
    for (long g = 0; g < G; g += 4) {
        const float *qg = q + g * D, *sg = sinks ? sinks + g : NULL;
        const uint16_t *qbg = qb ? qb + g * D : NULL;
        float *og = out + g * D, *st = stats ? stats + 2 * g : NULL;
        switch (G - g < 4 ? G - g : 4) {
        case 1:
            attend16_heads(type, 1, qg, qbg, D, k, v, pos_stride, j0, j1, sg, scale, softcap, scores, og, st);
            break;
        case 2:
            attend16_heads(type, 2, qg, qbg, D, k, v, pos_stride, j0, j1, sg, scale, softcap, scores, og, st);
            break;
        case 3:
            attend16_heads(type, 3, qg, qbg, D, k, v, pos_stride, j0, j1, sg, scale, softcap, scores, og, st);
            break;
        default:
            attend16_heads(type, 4, qg, qbg, D, k, v, pos_stride, j0, j1, sg, scale, softcap, scores, og, st);
        }
    }
}

static AVX512 void attend16_typed(int type, const float *q, const uint16_t *qb, long G, long D, const char *k,
                                  const char *v, long pos_stride, long j0, long j1, const float *sinks, float scale,
                                  float softcap, float *scores, float *out, float *stats) {
    switch (type) { /* a copy for each type, whose loads the compiler then knows */
    case F32: attend16(F32, q, NULL, G, D, k, v, pos_stride, j0, j1, sinks, scale, softcap, scores, out, stats); break;
    case BF16: attend16(BF16, q, qb, G, D, k, v, pos_stride, j0, j1, sinks, scale, softcap, scores, out, stats); break;
    default: attend16(F16, q, NULL, G, D, k, v, pos_stride, j0, j1, sinks, scale, softcap, scores, out, stats);
    }
}

static AVX2 void attend8_typed(int type, const float *q, long G, long D, const char *k, const char *v,
                               long pos_stride, long j0, long j1, const float *sinks, float scale, float softcap,
                               float *scores, float *out, float *stats) {
    switch (type) {
    case F32: attend(F32, q, G, D, k, v, pos_stride, j0, j1, sinks, scale, softcap, scores, out, stats); break;
    case BF16: attend(BF16, q, G, D, k, v, pos_stride, j0, j1, sinks, scale, softcap, scores, out, stats); break;
    default: attend(F16, q, G, D, k, v, pos_stride, j0, j1, sinks, scale, softcap, scores, out, stats);
    }
}

/* Asks for positions j0 .. j1 of one KV head of a cache row (`span` bytes at each position)
 * ahead of the walks over them. A decode step finds its row's keys and values in memory, not in
 * cache (the weights streamed past since): walked a position at a time, each load waited on the
 * last, and attention grew SmolLM2's one-row bf16 step by 1.6-1.7 ms from position 5 to 250 (1.3
 * with the whole span asked for at once, and less again with the heads split among threads). */
static inline void prefetch_span(const char *base, long j0, long j1, long stride, long span) {
    for (long j = j0; j < j1; j++)
        for (long b = 0; b < span; b += 64)
            _mm_prefetch(base + j * stride + b, _MM_HINT_T0);
}

/* The first position token i reads (its window's start), or -1 if it reads none: padding at a
 * position >= max_seq, or a row outside [0, batch). */
static inline long first_visible(long i, const int32_t *rows, const int32_t *positions, long batch, long max_seq,
                                 long window) {
    long pos = positions[i];
    if (pos >= max_seq || pos < 0 || rows[i] < 0 || rows[i] >= batch)
        return -1;
    return window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
}

/* Token i's KV head h (its G query heads) over positions [ja, jb): the heads' outputs into o (f32,
 * G x D), normalized over those positions, and their stats (`softmax_rows`) if not NULL; the
 * queries widened into `staging` (G x D) where q_type is not F32. */
static AVX2 void attend_head(int type, int q_type, const void *q, long H, long KVH, long D, const void *k,
                             const void *v, long row_stride, long pos_stride, const int32_t *rows, long i, long h,
                             long ja, long jb, const float *sinks, float scale, float softcap, float *o,
                             float *stats, float *scores, float *staging) {
    long G = H / KVH, elem = type_bytes(type), at = (i * H + h * G) * D;
    long base = (rows[i] * row_stride + h * D) * elem;
    prefetch_span((const char *)k + base, ja, jb, pos_stride * elem, D * elem);
    prefetch_span((const char *)v + base, ja, jb, pos_stride * elem, D * elem);
    const float *qh = (const float *)q + at;
    if (q_type != F32) {
        for (long e = 0; e < G * D; e += 8)
            _mm256_storeu_ps(staging + e, load8(q, q_type, at + e));
        qh = staging;
    }
    const char *kh = (const char *)k + base, *vh = (const char *)v + base;
    if (linnet_isa() >= ISA_AVX512 && D % 16 == 0) {
        /* bf16 queries and cache: scored as they are, in pairs (`score_pairs`) */
        const uint16_t *qb = type == BF16 && q_type == BF16 && D % 32 == 0 && linnet_isa() >= ISA_AVX512_BF16
                                 ? (const uint16_t *)q + at : NULL;
        attend16_typed(type, qh, qb, G, D, kh, vh, pos_stride, ja, jb, sinks, scale, softcap, scores, o, stats);
    } else {
        attend8_typed(type, qh, G, D, kh, vh, pos_stride, ja, jb, sinks, scale, softcap, scores, o, stats);
    }
}

/* Asks for what tokens [0, n) will read of a cache laid out as linnet_attention_run reads it,
 * every KV head: for a caller that knows the next layer's cache, whose lines then come in while
 * the layer's other work runs, and wait in the last-level cache. */
void linnet_attention_prefetch(int type, long KVH, long D, const void *k, const void *v, long row_stride,
                               long pos_stride, long batch, long max_seq, const int32_t *rows,
                               const int32_t *positions, long window, long n) {
    long elem = type_bytes(type);
    for (long i = 0; i < n; i++) {
        long j0 = first_visible(i, rows, positions, batch, max_seq, window), base = rows[i] * row_stride * elem;
        if (j0 < 0)
            continue;
        prefetch_span((const char *)k + base, j0, positions[i] + 1, pos_stride * elem, KVH * D * elem);
        prefetch_span((const char *)v + base, j0, positions[i] + 1, pos_stride * elem, KVH * D * elem);
    }
}

/* Parts a token's span is computed in: one below 2 SPAN_PART positions, else one a SPAN_PART
 * positions, up to MOST_PARTS, each part's softmax kept with its largest score and sum and the parts
 * merged after (`merge_parts`). A token's parts follow from its own span alone, never from the
 * call's other tokens or its threads, so its result is the same bits whoever runs its parts and
 * whatever else the call holds (batch invariance: they were once split only where a call's units
 * were few, and a long prompt's row alone and among others differed in the last bits). Few units
 * (one or two rows decoding over a long prompt, whose KV heads would leave threads idle: SmolLM2's 3
 * on 2 threads, one idle a third of the time; at position 3000, 5.6 ms of attention a token for 30
 * layers, 4.05 split) spread their parts over the threads; many units each take theirs in turn. */
#define SPAN_PART 256
#define MOST_PARTS 8

static inline long token_parts(long i, const int32_t *rows, const int32_t *positions, long batch, long max_seq,
                               long window) {
    long j0 = first_visible(i, rows, positions, batch, max_seq, window);
    long parts = j0 < 0 ? 1 : (positions[i] + 1 - j0) / SPAN_PART;
    return parts < 1 ? 1 : parts < MOST_PARTS ? parts : MOST_PARTS;
}

/* A unit's G heads from its P parts, each normalized over its positions, with stats (top, sum):
 * the softmax over the whole span, with each head's sink logit in the sum, into out at `at`. */
static AVX2 void merge_parts(int q_type, long P, long G, long D, const float *parts, const float *stats,
                             const float *sinks, void *out, long at) {
    for (long g = 0; g < G; g++) {
        float top = sinks ? sinks[g] : -INFINITY, weight[MOST_PARTS], total = 0.0f;
        for (long p = 0; p < P; p++)
            top = stats[2 * (p * G + g)] > top ? stats[2 * (p * G + g)] : top;
        for (long p = 0; p < P; p++) { /* a part's share: its sum, on the whole span's scale */
            weight[p] = stats[2 * (p * G + g) + 1] * expf(stats[2 * (p * G + g)] - top);
            total += weight[p];
        }
        total += sinks ? expf(sinks[g] - top) : 0.0f;
        for (long d = 0; d < D; d += 8) {
            __m256 acc = _mm256_setzero_ps();
            for (long p = 0; p < P; p++)
                acc = _mm256_fmadd_ps(_mm256_set1_ps(weight[p]), _mm256_loadu_ps(parts + (p * G + g) * D + d), acc);
            store8(out, q_type, at + g * D + d, _mm256_mul_ps(acc, _mm256_set1_ps(1.0f / total)));
        }
    }
}

/* Part p of `parts` of token i's KV head h, whose span starts at j0: its G heads over its share of
 * the span, outputs normalized over the part into o (G x D) and (top, sum) pairs into stats (2G). */
static AVX2 void attend_part(int type, int q_type, const void *q, long H, long KVH, long D, const void *k,
                             const void *v, long row_stride, long pos_stride, const int32_t *rows,
                             const int32_t *positions, long i, long h, long j0, long p, long parts, float scale,
                             float softcap, float *o, float *stats, float *scores, float *staging) {
    long span = positions[i] + 1 - j0;
    attend_head(type, q_type, q, H, KVH, D, k, v, row_stride, pos_stride, rows, i, h, j0 + span * p / parts,
                j0 + span * (p + 1) / parts, NULL, scale, softcap, o, stats, scores, staging);
}

/* The floats `parts_of_a_unit` parts of a unit take: each part's G x D outputs, then each part's G
 * (largest score, sum) pairs. */
static long part_floats(long G, long D, long parts_of_a_unit) {
    return parts_of_a_unit * G * (D + 2);
}

/* Units [u0, u1) on the calling thread, unit u being token u / KVH's KV head u % KVH (its G query
 * heads); q and out are of q_type. `scores` holds G * max_seq floats; `staging`, for a q_type
 * other than F32, 2 * G * D: a unit's queries widened and its output before it is rounded; `parted`
 * part_floats(G, D, MOST_PARTS): the parts of a unit whose span has several (`token_parts`). */
static AVX2 void attend_units(int type, int q_type, const void *q, long H, long KVH, long D, const void *k,
                              const void *v, long row_stride, long pos_stride, long batch, long max_seq,
                              const int32_t *rows, const int32_t *positions, long window, const float *sinks,
                              float scale, float softcap, void *out, long u0, long u1, float *scores,
                              float *staging, float *parted) {
    long G = H / KVH;
    for (long u = u0; u < u1; u++) {
        long i = u / KVH, h = u % KVH, pos = positions[i], at = (i * H + h * G) * D;
        long j0 = first_visible(i, rows, positions, batch, max_seq, window);
        if (j0 < 0) {
            memset((char *)out + at * type_bytes(q_type), 0, G * D * type_bytes(q_type));
            continue;
        }
        long parts = token_parts(i, rows, positions, batch, max_seq, window);
        if (parts > 1) {
            float *stats = parted + MOST_PARTS * G * D;
            for (long p = 0; p < parts; p++)
                attend_part(type, q_type, q, H, KVH, D, k, v, row_stride, pos_stride, rows, positions, i, h, j0, p,
                            parts, scale, softcap, parted + p * G * D, stats + p * 2 * G, scores, staging);
            merge_parts(q_type, parts, G, D, parted, stats, sinks ? sinks + h * G : NULL, out, at);
            continue;
        }
        float *o = q_type == F32 ? (float *)out + at : staging + G * D;
        attend_head(type, q_type, q, H, KVH, D, k, v, row_stride, pos_stride, rows, i, h, j0, pos + 1,
                    sinks ? sinks + h * G : NULL, scale, softcap, o, NULL, scores, staging);
        if (q_type != F32)
            for (long e = 0; e < G * D; e += 8)
                store8(out, q_type, at + e, _mm256_loadu_ps(o + e));
    }
}

/* One linnet_attention call, for its chunks: runs of whole units (P == 1), or of items, the units'
 * parts spread over the threads (P, the most parts a token has: item it is unit it / P's part
 * it % P, its outputs and stats in `parted` as part_floats lays out P parts a unit, then merged). */
struct attention_job {
    int type, q_type;
    const void *q;
    long n, H, KVH, D;
    const void *k, *v;
    long row_stride, pos_stride, batch, max_seq;
    const int32_t *rows, *positions;
    long window;
    const float *sinks;
    float scale, softcap;
    void *out;
    long P, items;
    float *parted;
};

/* Item it of a job of parts: a part of a unit with several, or the whole of one with a single. */
static AVX2 void attend_item(const struct attention_job *t, long it, float *scores, float *staging, float *local) {
    long G = t->H / t->KVH, u = it / t->P, p = it % t->P, i = u / t->KVH, h = u % t->KVH;
    long parts = token_parts(i, t->rows, t->positions, t->batch, t->max_seq, t->window);
    if (parts == 1) {
        if (p == 0)
            attend_units(t->type, t->q_type, t->q, t->H, t->KVH, t->D, t->k, t->v, t->row_stride, t->pos_stride,
                         t->batch, t->max_seq, t->rows, t->positions, t->window, t->sinks, t->scale, t->softcap,
                         t->out, u, u + 1, scores, staging, local);
        return;
    }
    if (p >= parts)
        return;
    float *unit = t->parted + u * part_floats(G, t->D, t->P);
    long j0 = first_visible(i, t->rows, t->positions, t->batch, t->max_seq, t->window);
    attend_part(t->type, t->q_type, t->q, t->H, t->KVH, t->D, t->k, t->v, t->row_stride, t->pos_stride, t->rows,
                t->positions, i, h, j0, p, parts, t->scale, t->softcap, unit + p * G * t->D,
                unit + t->P * G * t->D + p * 2 * G, scores, staging);
}

static int attention_chunk(void *data, long c, long chunks) {
    const struct attention_job *t = data;
    long G = t->H / t->KVH, it0 = t->items * c / chunks, it1 = t->items * (c + 1) / chunks;
    long staged = t->q_type == F32 ? 0 : 2 * G * t->D;
    /* the chunk's scores, staging and a unit's parts, for all its items */
    float *scores = malloc((G * t->max_seq + staged + part_floats(G, t->D, MOST_PARTS)) * sizeof(float));
    if (!scores)
        return -1;
    float *staging = scores + G * t->max_seq, *local = staging + staged;
    if (t->P == 1)
        attend_units(t->type, t->q_type, t->q, t->H, t->KVH, t->D, t->k, t->v, t->row_stride, t->pos_stride, t->batch,
                     t->max_seq, t->rows, t->positions, t->window, t->sinks, t->scale, t->softcap, t->out, it0,
                     it1, scores, staging, local);
    else
        for (long it = it0; it < it1; it++)
            attend_item(t, it, scores, staging, local);
    free(scores);
    return 0;
}

/* Chunks of items a thread: claimed as threads come free, they even out tokens of unequal spans
 * (a packed prompt's last tokens see the most keys). */
#define ATTENTION_CHUNKS_A_THREAD 8

/* q [n, H, D] and out [n, H, D] of q_type (F32, BF16 or F16); k and v point at position 0 of row
 * 0, KV head 0 of one layer's cache, whose rows are row_stride elements apart and positions
 * pos_stride apart (KV heads D apart). A token at a position >= max_seq is padding, and one whose
 * row is not in [0, batch) reads nothing: their output is zero. sinks: [H] or NULL. softcap > 0 caps
 * each scaled score s as softcap * tanh(s / softcap) before the softmax (0: none). The work goes
 * to `run` on `pool` (of `threads` threads) in runs of units (a token's KV heads: one token's
 * heads can go to several threads), or, where units are fewer than twice the threads, of the
 * parts of their spans (`token_parts`), merged once all are in. Returns -1 if out of memory. */
int linnet_attention_run(linnet_runner run, void *pool, long threads, int type, int q_type, const void *q, long n,
                         long H, long KVH, long D, const void *k, const void *v, long row_stride, long pos_stride,
                         long batch, long max_seq, const int32_t *rows, const int32_t *positions, long window,
                         const float *sinks, float scale, float softcap, void *out) {
    long units = n * KVH, G = H / KVH, P = 1;
    if (units < 2 * threads)
        for (long i = 0; i < n; i++) {
            long parts = token_parts(i, rows, positions, batch, max_seq, window);
            P = parts > P ? parts : P;
        }
    /* (without memory for the parts, each unit takes its own in turn: the same bits, fewer threads) */
    float *parted = P > 1 ? malloc(units * part_floats(G, D, P) * sizeof(float)) : NULL;
    if (!parted)
        P = 1;
    struct attention_job job = {type, q_type, q, n, H, KVH, D, k, v, row_stride, pos_stride, batch, max_seq, rows,
                                positions, window, sinks, scale, softcap, out, P, units * P, parted};
    long most = threads * ATTENTION_CHUNKS_A_THREAD;
    int status = units ? run(pool, attention_chunk, &job, job.items < most ? job.items : most) : 0;
    for (long u = 0; P > 1 && !status && u < units; u++) { /* every part is in */
        long i = u / KVH, h = u % KVH, parts = token_parts(i, rows, positions, batch, max_seq, window);
        float *unit = parted + u * part_floats(G, D, P);
        if (parts > 1)
            merge_parts(q_type, parts, G, D, unit, unit + P * G * D, sinks ? sinks + h * G : NULL, out,
                        (i * H + h * G) * D);
    }
    free(parted);
    return status ? -1 : 0;
}

/* linnet_attention_run on `threads` threads of pool.c's. */
int linnet_attention(int type, int q_type, const void *q, long n, long H, long KVH, long D, const void *k,
                     const void *v, long row_stride, long pos_stride, long batch, long max_seq, const int32_t *rows,
                     const int32_t *positions, long window, const float *sinks, float scale, float softcap,
                     void *out, int threads) {
    return linnet_attention_run(linnet_on_threads, &threads, threads, type, q_type, q, n, H, KVH, D, k, v, row_stride,
                                pos_stride, batch, max_seq, rows, positions, window, sinks, scale, softcap, out);
}
