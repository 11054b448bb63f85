/* Linnet's CPU matmul for a GGUF's quantized linear weights, kept in their blocks:
 * y[M, N] = x[M, K] @ w[N, K]^T, w's blocks decoded as it runs, sums in f32.
 *
 * GGUF holds each weight row as blocks along K: Q8_0 a f16 scale d and 32 int8 q (w = d q), Q4_1 a f16 scale d, a f16
 * minimum m and 32 4-bit q (w = d q + m; byte i holds q_i in its low nibble and q_{i+16} in its high one); the
 * K-quants, super-blocks of 256 (Q4_K: 8 sub-blocks of 32, each w = d sc q - dmin mn with 6-bit sc, mn; Q5_K as Q4_K
 * with 5-bit q; Q6_K: 16 of 16, w = d sc q, sc int8, q 6-bit less 32). Q4_0 (w = d (q - 8), 4-bit q) is repacked as a
 * Q4_K sub-block, d and -8 d its scale and minimum, Q5_1 (w = d q + m, 5-bit q) as a Q5_K one, Q3_K (16 of 16, w = d sc
 * q, sc and q less 32 and 4) as Q6_K: no type of their own here. Q5_0 (a f16 d, 32 5-bit q, w = d (q - 16)) has its
 * own, as Q5_K's below. IQ4_NL (a f16 d, 32 4-bit indices into a table of 16 levels, w = d level) has its own, its
 * nibbles looked up as they are decoded, and takes IQ4_XS (8 blocks of 32 a super-block, d (sc - 32) level) with each
 * block's scale worked out as f32. At load the blocks of 16 rows are repacked into a panel (cpu_qlinear.py), block of
 * 32 after block along K, each panel block holding the 16 rows' scales (and minimums) side by side and then their
 * quants K-major: for each k of the block, the 16 rows' bytes in one 16-byte line (4-bit quants: k and k + 16 share a
 * line, as they share a byte). A K-quant's block is one of its sub-blocks as Q4_1's or Q8_0's would hold it, the scale
 * d sc (and minimum -dmin mn) worked out at load as f32, which holds them exactly (a product of 11 and at most 8
 * significant bits); Q5_K's block is Q4_K's (q's low 4 bits as its nibbles) and then a plane of the 16 rows' fifth
 * bits, 64 bytes laid out so that a pair step's 32 lanes load theirs as one mask (`FIFTH_BITS`), and Q5_0's is Q8_0's
 * f16 scales with such nibbles and plane, its value q - 16 (no minimum); Q6_K's block is Q8_0's quants (q - 32 as int8)
 * with two f32 scales, one a half. One pass over a panel then gives 16 outputs, and a decode step reads few bytes:
 * Q4_1's 20 per 32 values, Q8_0's 34, Q4_K's 24 (Q4_0's too; the files' 18), IQ4_NL's 20 (the file's 18; IQ4_XS's 17),
 * Q5_0's 22 (the file's), Q5_K's 28 (Q5_1's too; the files' 22 and 24; as int8, before the plane, Q5_0's 34 in Q8_0's
 * panels and the others' 40), Q6_K's 40 (the file's 26.25; Q3_K's 13.75), bf16's 64.
 *
 * Each output sums, block by block, d * (sum of q x) (+ m * sum of x, Q4_1, Q4_K and Q5_K; Q6_K: a sum for
 * each half apart, each times its d): the same operations in the same order for a row whatever other rows its
 * call holds (batch invariance, as cpu_linear.c keeps it). A bf16 x on AVX-512 BF16 multiplies pairs of k by
 * VDPBF16PS (q is exact in bf16, so are the products), the inner sum one f32 chain, up to 6 rows by two
 * panels a tile; otherwise x is f32 (a bf16 x widened, exactly) and each product is an FMA, the inner sum
 * in two chains, on AVX-512 (a panel row one vector, up to 4 rows a tile) or AVX2 (two 8-column halves, up
 * to 2 rows). Each path rounds its sums its own way. By FMAs one row once ran 2x faster than in pairs, and
 * 16 rows 1.4x slower; the pairs now run both faster (SmolLM2's shapes: `benchmarks/qlinear_rows.py`).
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#define QNR 16 /* output columns a panel */
#define QK 32  /* values a block */
#define QMC 64 /* input rows a block of x: kept in cache while the chunk's panels pass */
#define AVX512Q __attribute__((target("avx512f,avx2,fma,f16c")))

/* What a type's panel block holds: 4-bit quants (k and k + 16 in a byte; IQ4_NL's index IQ4_LEVELS; Q5_0's and Q5_K's
 * with a fifth bit each in a plane after them) or 8-bit ones (a k a line); a minimum to add (times the block's sum of
 * x); one scale or two (Q6_K's, for k below 16 and above). */
static inline int nibbles(int qtype) {
    return qtype == QTYPE_Q4_1 || qtype == QTYPE_Q4_K || qtype == QTYPE_Q5_0 || qtype == QTYPE_Q5_K ||
           qtype == QTYPE_IQ4_NL;
}
/* Q5_0's and Q5_K's nibbles come with a plane of fifth bits after them (`FIFTH_BITS`); Q5_0's value is q - 16. */
static inline int fifth_bits(int qtype) { return qtype == QTYPE_Q5_0 || qtype == QTYPE_Q5_K; }
static inline int has_min(int qtype) { return qtype == QTYPE_Q4_1 || qtype == QTYPE_Q4_K || qtype == QTYPE_Q5_K; }
static inline int halves(int qtype) { return qtype == QTYPE_Q6_K ? 2 : 1; }

/* Where a panel block's 16 scales for half h lie, and its 16 minimums (Q4_1, Q4_K, Q5_K): f16 for Q8_0, Q4_1
 * and Q5_0, f32 for the K-quants (`f16_scales`); the vector loads below and `panel_value` read them here. */
static inline int f16_scales(int qtype) { return qtype == QTYPE_Q8_0 || qtype == QTYPE_Q4_1 || qtype == QTYPE_Q5_0; }
static inline long scales_at(int qtype, int h) { return f16_scales(qtype) ? 0 : QNR * 4 * h; }
static inline long mins_at(int qtype) { return qtype == QTYPE_Q4_1 ? QNR * 2 : QNR * 4; }

static inline AVX512Q __attribute__((always_inline)) __m512 scale16(int qtype, const uint8_t *block, int h) {
    if (f16_scales(qtype))
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(block + scales_at(qtype, h))));
    return _mm512_loadu_ps((const float *)(block + scales_at(qtype, h)));
}

static inline AVX512Q __attribute__((always_inline)) __m512 min16(int qtype, const uint8_t *block) {
    if (qtype == QTYPE_Q4_1)
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(block + mins_at(qtype))));
    return has_min(qtype) ? _mm512_loadu_ps((const float *)(block + mins_at(qtype))) : _mm512_setzero_ps();
}
/* The loops over a block's k are unrolled 4 times, not 16: unrolled whole, GCC hoisted every x
 * broadcast of a 4-row tile out of them and spilled them (a 7 KB frame), and a 16-row product ran
 * 3.4x slower than now (SmolLM2's [16, 576] x [1536, 576] Q4_1: 6.8 against 2.0 ms, a busy host). */

/* Bytes one block of a panel takes: its 16 rows' scales (f16; f32 for the K-quants and IQ4_NL, two for Q6_K's
 * halves), minimums (Q4_1, Q4_K, Q5_K), and quants (Q5_0, Q5_K: and fifth bits). */
long linnet_qpanel_block_bytes(int qtype) {
    switch (qtype) {
    case QTYPE_Q8_0: return QNR * 2 + QK * QNR;
    case QTYPE_Q4_1: return QNR * 2 * 2 + QK / 2 * QNR;
    case QTYPE_Q4_K: return QNR * 4 * 2 + QK / 2 * QNR;
    case QTYPE_IQ4_NL: return QNR * 4 + QK / 2 * QNR;
    case QTYPE_Q5_0: return QNR * 2 + QK / 2 * QNR + QK * QNR / 8;
    case QTYPE_Q5_K: return QNR * 4 * 2 + QK / 2 * QNR + QK * QNR / 8;
    case QTYPE_Q6_K: return QNR * 4 * 2 + QK * QNR;
    default: return 0;
    }
}

static inline long quants_at(int qtype) {
    if (qtype == QTYPE_Q8_0 || qtype == QTYPE_Q5_0)
        return QNR * 2;
    return qtype == QTYPE_Q4_1 || qtype == QTYPE_IQ4_NL ? QNR * 4 : QNR * 8;
}

/* FIFTH_BITS: Q5_0's and Q5_K's fifth bits, after their nibble lines, as 16 words of 32 bits laid out for the pairs'
 * steps (`five_bit_pairs`): word 2s + h holds, at bit 2j + e, the fifth bit of row j's value k = 2s + e + 16 h, so a
 * step's 32 lanes (row j's pair in lanes 2j, 2j + 1) load theirs as one mask. */
static inline const uint32_t *fifth_words(int qtype, const uint8_t *block) {
    return (const uint32_t *)(block + quants_at(qtype) + QK / 2 * QNR);
}

/* The word and bit shift of value k (0 .. 31) of row j's fifth bit: the other tiles read them so too. */
static inline int fifth_word(int k) { return (k % (QK / 2)) / 2 * 2 + k / (QK / 2); }
static inline int fifth_shift(int j, int k) { return 2 * j + k % 2; }

/* IQ4_NL's (and IQ4_XS's) 16 levels, which its 4-bit quants index: llama.cpp's kvalues_iq4nl. */
static const float IQ4_LEVELS[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

/* A nibble (0 .. 15 in each lane) as the f32 value a panel of `qtype` holds for it: itself, or IQ4_NL's level. */
static inline AVX512Q __attribute__((always_inline)) __m512 nibble16(int qtype, __m512i q) {
    if (qtype == QTYPE_IQ4_NL)
        return _mm512_permutexvar_ps(q, _mm512_loadu_ps(IQ4_LEVELS));
    return _mm512_cvtepi32_ps(q);
}

static inline AVX2 __attribute__((always_inline)) __m256 nibble8(int qtype, __m256i q) {
    if (qtype == QTYPE_IQ4_NL) { /* levels 0 .. 7 or 8 .. 15 by bit 3, moved to the sign bit blendv reads */
        __m256 low = _mm256_permutevar8x32_ps(_mm256_loadu_ps(IQ4_LEVELS), q);
        __m256 high = _mm256_permutevar8x32_ps(_mm256_loadu_ps(IQ4_LEVELS + 8), q);
        return _mm256_blendv_ps(low, high, _mm256_castsi256_ps(_mm256_slli_epi32(q, 28)));
    }
    return _mm256_cvtepi32_ps(q);
}

/* Each lane j's shift of its fifth bit for k (`fifth_shift`): 2j + k % 2, lanes 0 .. 15, or 8 .. 15 (`hi`) of 8. */
static inline AVX512Q __attribute__((always_inline)) __m512i fifth_shifts512(int k) {
    __m512i j = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    return _mm512_add_epi32(_mm512_slli_epi32(j, 1), _mm512_set1_epi32(k % 2));
}

static inline AVX2 __attribute__((always_inline)) __m256i fifth_shifts256(int k, int hi) {
    __m256i j = _mm256_add_epi32(_mm256_set_epi32(7, 6, 5, 4, 3, 2, 1, 0), _mm256_set1_epi32(8 * hi));
    return _mm256_add_epi32(_mm256_slli_epi32(j, 1), _mm256_set1_epi32(k % 2));
}

/* A nibble vector of rows 8 hi .. 8 hi + 7 plus 16 where their fifth bit of value k is set (Q5_0: less 16 where it
 * is clear); AVX2 has no mask registers: the word broadcast, each lane's bit kept and compared with it. */
static inline AVX2 __attribute__((always_inline)) __m256i with_fifth8(int qtype, __m256i n, const uint8_t *block,
                                                                      int k, int hi) {
    __m256i bit = _mm256_sllv_epi32(_mm256_set1_epi32(1), fifth_shifts256(k, hi));
    __m256i word = _mm256_set1_epi32((int)fifth_words(qtype, block)[fifth_word(k)]);
    __m256i set = _mm256_cmpeq_epi32(_mm256_and_si256(word, bit), bit), sixteen = _mm256_set1_epi32(16);
    if (qtype == QTYPE_Q5_0)
        return _mm256_sub_epi32(n, _mm256_andnot_si256(set, sixteen));
    return _mm256_add_epi32(n, _mm256_and_si256(set, sixteen));
}

/* Columns [8 hi, 8 hi + 8) of a block's scales for half h, and of its minimums, as f32. */
static inline AVX2 __attribute__((always_inline)) __m256 scale8(int qtype, const uint8_t *block, int h, int hi) {
    if (f16_scales(qtype))
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(block + scales_at(qtype, h)) + hi));
    return _mm256_loadu_ps((const float *)(block + scales_at(qtype, h)) + 8 * hi);
}

static inline AVX2 __attribute__((always_inline)) __m256 min8(int qtype, const uint8_t *block, int hi) {
    if (qtype == QTYPE_Q4_1)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(block + mins_at(qtype)) + hi));
    return _mm256_loadu_ps((const float *)(block + mins_at(qtype)) + 8 * hi);
}

/* ---- AVX-512: one vector holds a panel row's 16 columns */

/* Rows [0, mr) of x (row stride K, mr <= 4, f32) times one panel into sums[r][16]. */
static inline AVX512Q __attribute__((always_inline)) void qtile512(int qtype, int mr, const float *x, long K,
                                                                   const float *xsum, const uint8_t *panel,
                                                                   float sums[4][QNR]) {
    long blocks = K / QK, bytes = linnet_qpanel_block_bytes(qtype);
    __m512 total[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (long b = 0; b < blocks; b++) {
        const uint8_t *block = panel + b * bytes;
        __m512 a[4], e[4];
        for (int h = 0; h < halves(qtype); h++) {
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++)
                a[r] = e[r] = _mm512_setzero_ps();
            if (!nibbles(qtype)) { /* a: even k, e: odd k (Q6_K: of its half) */
                const int8_t *q = (const int8_t *)(block + quants_at(qtype));
#pragma GCC unroll 4
                for (int i = h * QK / halves(qtype); i < (h + 1) * QK / halves(qtype); i += 2) {
                    __m512 q0 = _mm512_cvtepi32_ps(
                        _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + i * QNR))));
                    __m512 q1 = _mm512_cvtepi32_ps(
                        _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + (i + 1) * QNR))));
#pragma GCC unroll 4
                    for (int r = 0; r < 4; r++)
                        if (r < mr) {
                            const float *xr = x + r * K + b * QK;
                            a[r] = _mm512_fmadd_ps(q0, _mm512_set1_ps(xr[i]), a[r]);
                            e[r] = _mm512_fmadd_ps(q1, _mm512_set1_ps(xr[i + 1]), e[r]);
                        }
                }
            } else { /* a: the low nibbles (k below 16), e: the high ones (Q5_K: each with its fifth bit; Q5_0: less
                      * 16 where that is clear) */
                const uint8_t *q = block + quants_at(qtype);
                __m512i low = _mm512_set1_epi32(15), sixteen = _mm512_set1_epi32(16);
#pragma GCC unroll 4
                for (int i = 0; i < QK / 2; i++) {
                    __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(q + i * QNR)));
                    __m512i n0 = _mm512_and_si512(v, low), n1 = _mm512_srli_epi32(v, 4);
                    if (fifth_bits(qtype)) { /* lane j's bit 2j + i % 2 of the words of k = i and i + 16 */
                        const uint32_t *words = fifth_words(qtype, block);
                        __m512i bit = _mm512_sllv_epi32(_mm512_set1_epi32(1), fifth_shifts512(i));
                        __mmask16 f0 = _mm512_test_epi32_mask(_mm512_set1_epi32((int)words[fifth_word(i)]), bit);
                        __mmask16 f1 = _mm512_test_epi32_mask(_mm512_set1_epi32((int)words[fifth_word(i + 16)]), bit);
                        if (qtype == QTYPE_Q5_0) {
                            n0 = _mm512_mask_sub_epi32(n0, (__mmask16)~f0, n0, sixteen);
                            n1 = _mm512_mask_sub_epi32(n1, (__mmask16)~f1, n1, sixteen);
                        } else {
                            n0 = _mm512_mask_add_epi32(n0, f0, n0, sixteen);
                            n1 = _mm512_mask_add_epi32(n1, f1, n1, sixteen);
                        }
                    }
                    __m512 q0 = nibble16(qtype, n0);
                    __m512 q1 = nibble16(qtype, n1);
#pragma GCC unroll 4
                    for (int r = 0; r < 4; r++)
                        if (r < mr) {
                            const float *xr = x + r * K + b * QK;
                            a[r] = _mm512_fmadd_ps(q0, _mm512_set1_ps(xr[i]), a[r]);
                            e[r] = _mm512_fmadd_ps(q1, _mm512_set1_ps(xr[i + QK / 2]), e[r]);
                        }
                }
            }
            __m512 d = scale16(qtype, block, h);
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++)
                if (r < mr)
                    total[r] = _mm512_fmadd_ps(d, _mm512_add_ps(a[r], e[r]), total[r]);
        }
        if (has_min(qtype)) {
            __m512 m = min16(qtype, block);
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++)
                if (r < mr)
                    total[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(xsum[r * blocks + b]), total[r]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
        if (r < mr)
            _mm512_storeu_ps(sums[r], total[r]);
}

/* A call of `tile` for each block type, the type a constant in each (its loops then branch on nothing). */
#define BY_TYPE(qtype, tile, ...)                                      \
    switch (qtype) {                                                   \
    case QTYPE_Q8_0: tile(QTYPE_Q8_0, __VA_ARGS__); break;             \
    case QTYPE_Q4_1: tile(QTYPE_Q4_1, __VA_ARGS__); break;             \
    case QTYPE_Q5_0: tile(QTYPE_Q5_0, __VA_ARGS__); break;             \
    case QTYPE_Q4_K: tile(QTYPE_Q4_K, __VA_ARGS__); break;             \
    case QTYPE_Q5_K: tile(QTYPE_Q5_K, __VA_ARGS__); break;             \
    case QTYPE_IQ4_NL: tile(QTYPE_IQ4_NL, __VA_ARGS__); break;         \
    default: tile(QTYPE_Q6_K, __VA_ARGS__);                            \
    }

static AVX512Q void qtile512_rows(int qtype, int mr, const float *x, long K, const float *xsum, const uint8_t *panel,
                                  float sums[4][QNR]) {
    switch (mr) { /* a tile a row count: its accumulators stay in registers */
    case 4: BY_TYPE(qtype, qtile512, 4, x, K, xsum, panel, sums) break;
    case 3: BY_TYPE(qtype, qtile512, 3, x, K, xsum, panel, sums) break;
    case 2: BY_TYPE(qtype, qtile512, 2, x, K, xsum, panel, sums) break;
    default: BY_TYPE(qtype, qtile512, 1, x, K, xsum, panel, sums)
    }
}

/* ---- AVX-512 BF16, x in bf16: pairs of k multiplied by VDPBF16PS. A quant is an integer of at most 8 bits, exact
 * in bf16, so each product q x is exact and only the sums round, in f32 as above; VDPBF16PS does twice an FMA's
 * multiplications, which bound the f32 tiles over many rows. A tile is up to PAIR_ROWS rows by two panels, one
 * accumulator (and one total) each: for each pair of k, two loads of the panels' pairs and a broadcast a row for two
 * VDPBF16PS a row, as cpu_linear.c's bf16 pair tile (a tile of 8 rows by one panel, two chains a row, loaded one
 * pair and broadcast 2 a VDPBF16PS: a 16-row decode step ran 1.4x bf16's time). A block's quants are decoded to bf16
 * pairs (`block_step`) in registers as the tile runs; from DECODE_FROM rows, a pair of panels' first row tile also
 * keeps them in a buffer (DECODE_AND_KEEP) which the others read (READ_DECODED), as bf16 panels are read, for each
 * DECODED_ROWS rows. The decode runs beside the first tile's products: a separate pass over each panel cost 0.85x a
 * 6-row tile's time (24 against 28 ns a block of Q8_0, one core); beside it, 0.1-0.15x. Both give the same bf16
 * values in the same lanes, and every tile sums them in the same order. The first tile asks for the next two panels'
 * blocks as it reads these (into L2: into L1, or 4 blocks ahead in these panels, a one-row product of [49152, 576]
 * Q8_0, out of memory, ran 1.5x the time of one panel a tile with no prefetch). */
#define AVX512Q_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")))
#define PAIR_ROWS 6 /* rows of x a tile, times two panels: an accumulator and a total each, 24 of the 32 vector
                     * registers */
#define DECODE_FROM (PAIR_ROWS + 1) /* rows from which a call keeps each panel decoded: more than one tile */
#define PREFETCH_HINT _MM_HINT_T1 /* where a first tile asks for the next panels: L2 */
#define DECODED_ROWS 256 /* rows of x a kept panel serves before the next (x's bf16 rows stay in L2: 288 KB at K
                          * 576; a long prompt's x whole went through memory again at each panel) */

/* Decoding a block's quants to bf16 pairs, lane j column j's: an integer q of 8 bits at most is exact in f32 and in
 * bf16, whose bits are the f32's top 16. Q8_0's int8 are widened to f32 and the pairs' top halves put side by side
 * (`int8_pairs`); the smaller quants are looked up in a table of bf16 words by VPERMW / VPERMT2W, which read an
 * index's low 5 / 6 bits: Q6_K's -32 .. 31 (as int8: their low 6 bits, two's complement) in one of 64
 * (`six_bit_pairs`), a nibble in one of 32 whose entry i is i & 15 (`nibble_pairs`), a Q5_K or Q5_0 nibble with 16
 * added under its fifth bits' mask in one of 0 .. 31 or -16 .. 15 (`five_bit_pairs`). Fewer
 * instructions than widening every quant to f32 and rounding pairs of vectors to bf16: a pass decoding a panel
 * of K 1024 took 16.3 ns a block for Q8_0, 13.6 for Q4_1 and 16.4 for Q6_K, against 24.0, 24.2 and 23.1 so
 * (one Zen 4 core, one process). */

/* bf16 words of the integers first .. first + 31. */
static inline AVX512Q_BF16 __attribute__((always_inline)) __m512i bf16_counting(int first) {
    __m512 low = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3,
                                                                      2, 1, 0),
                                                     _mm512_set1_epi32(first)));
    return (__m512i)_mm512_cvtne2ps_pbh(_mm512_add_ps(low, _mm512_set1_ps(16)), low); /* low's words first */
}

/* Words [a0 .. a15, b0 .. b15] (two lines' 16 rows, as VPMOVZXBW widens them) as pairs: lane j (a_j, b_j). */
static inline AVX512Q_BF16 __attribute__((always_inline)) __m512i side_by_side(__m512i words) {
    __m512i j = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    __m512i from = _mm512_or_si512(j, _mm512_slli_epi32(_mm512_add_epi32(j, _mm512_set1_epi32(QNR)), 16));
    return _mm512_permutexvar_epi16(from, words);
}

/* Lines a and a + 1 of int8 quants (Q8_0's) as pairs: lane j row j's value from line a (low word), a + 1. */
static inline AVX512Q_BF16 __attribute__((always_inline)) __m512bh int8_pairs(const __m128i *a) {
    __m512i fa = _mm512_castps_si512(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(a))));
    __m512i fb = _mm512_castps_si512(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(a + 1))));
    __m512i j2 = _mm512_slli_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), 1);
    __m512i tops = _mm512_or_si512(_mm512_add_epi32(j2, _mm512_set1_epi32(1)), /* word 2j + 1 of fa, of fb */
                                   _mm512_slli_epi32(_mm512_add_epi32(j2, _mm512_set1_epi32(33)), 16));
    return (__m512bh)_mm512_permutex2var_epi16(fa, tops, fb);
}

/* Lines a and a + 1 of quants of 6 bits at most (Q6_K's) as pairs, as `int8_pairs`. */
static inline AVX512Q_BF16 __attribute__((always_inline)) __m512bh six_bit_pairs(const __m128i *a) {
    __m512i q = side_by_side(_mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)a)));
    return (__m512bh)_mm512_permutex2var_epi16(bf16_counting(0), q, bf16_counting(-32));
}

/* Lines a and a + 1 of nibbles (Q4_1's, Q4_K's, IQ4_NL's) as pairs, as `int8_pairs`: their low nibbles (*low) and
 * their high ones (*high), each the value `nibble16` gives it. */
static inline AVX512Q_BF16 __attribute__((always_inline)) void nibble_pairs(int qtype, const __m128i *a,
                                                                           __m512bh *low, __m512bh *high) {
    __m512i q = side_by_side(_mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)a)));
    __m512i table; /* entries 16 .. 31 as 0 .. 15 (VPERMW reads 5 bits: a low nibble's byte's fifth too) */
    if (qtype == QTYPE_IQ4_NL) {
        __m512 levels = _mm512_loadu_ps(IQ4_LEVELS); /* (integers of 8 bits at most: exact in bf16) */
        table = (__m512i)_mm512_cvtne2ps_pbh(levels, levels);
    } else {
        table = bf16_counting(0);
        table = _mm512_shuffle_i64x2(table, table, 0x44);
    }
    *low = (__m512bh)_mm512_permutexvar_epi16(q, table);
    *high = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(q, 4), table);
}

/* Step s's lines 2s and 2s + 1 of Q5_0's or Q5_K's nibbles as pairs, as `nibble_pairs`, each with its fifth bit:
 * words 2s and 2s + 1 (`FIFTH_BITS`) are the low and the high nibbles' 32 lanes' bits, a mask each, 16 added where
 * set; the table is 0 .. 31 (Q5_0's -16 .. 15). */
static inline AVX512Q_BF16 __attribute__((always_inline)) void five_bit_pairs(int qtype, const uint8_t *block, int s,
                                                                             __m512bh *low, __m512bh *high) {
    const __m128i *line = (const __m128i *)(block + quants_at(qtype)) + 2 * s;
    __m512i q = side_by_side(_mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)line)));
    const uint32_t *words = fifth_words(qtype, block) + 2 * s;
    __m512i sixteen = _mm512_set1_epi16(16), table = bf16_counting(qtype == QTYPE_Q5_0 ? -16 : 0);
    __m512i n0 = _mm512_and_si512(q, _mm512_set1_epi16(15)), n1 = _mm512_srli_epi16(q, 4);
    n0 = _mm512_mask_add_epi16(n0, (__mmask32)words[0], n0, sixteen);
    n1 = _mm512_mask_add_epi16(n1, (__mmask32)words[1], n1, sixteen);
    *low = (__m512bh)_mm512_permutexvar_epi16(n0, table);
    *high = (__m512bh)_mm512_permutexvar_epi16(n1, table);
}

/* Step s (0 .. 7) of a panel block's quants as two vectors of bf16 pairs (lane j column j's), w0 and w1, summed in that
 * order: 8-bit quants' (Q8_0, Q6_K) pairs 2s and 2s + 1 (k = 4s .. 4s + 3, lines 4s .. 4s + 3); 4-bit ones' (Q4_1,
 * Q4_K, IQ4_NL; Q5_0's and Q5_K's with their fifth bits) pairs s and s + 8 (k = 2s, 2s + 1 and 2s + 16, 2s + 17: the
 * low and the high nibbles of lines 2s and 2s + 1, unpacked once). */
static inline AVX512Q_BF16 __attribute__((always_inline)) void block_step(int qtype, const uint8_t *block, int s,
                                                                         __m512bh *w0, __m512bh *w1) {
    const __m128i *line = (const __m128i *)(block + quants_at(qtype));
    if (fifth_bits(qtype))
        five_bit_pairs(qtype, block, s, w0, w1);
    else if (nibbles(qtype))
        nibble_pairs(qtype, line + 2 * s, w0, w1);
    else if (qtype == QTYPE_Q6_K) /* (the type whose quants are known to fit 6 bits) */
        *w0 = six_bit_pairs(line + 4 * s), *w1 = six_bit_pairs(line + 4 * s + 2);
    else /* any int8 */
        *w0 = int8_pairs(line + 4 * s), *w1 = int8_pairs(line + 4 * s + 2);
}

/* The pair of x (its words k, k + 1 as one) that step s's w0 (`second` 0) or w1 (1) multiplies. */
static inline int step_pair(int qtype, int s, int second) {
    return nibbles(qtype) ? s + second * QK / 4 : 2 * s + second;
}

/* A panel block decoded and kept (DECODE_AND_KEEP): w[2s] and w[2s + 1] its step s (block_step), d the columns'
 * scales (of each half: Q6_K's two) and m their minimums (Q4_1, Q4_K, Q5_K) as f32 (all exact). */
struct decoded_block {
    __m512bh w[QK / 2];
    __m512 d[2], m;
};

/* How a pair tile takes its panels' blocks: decoded in registers (one tile's rows, all a call has), so and
 * kept in `decoded` too (a panel's first row tile of more), or read from there (its other row tiles). */
enum { DECODE, DECODE_AND_KEEP, READ_DECODED };

/* Rows [0, mr) of x (bf16, row stride K, mr <= PAIR_ROWS) times two panels (c 0 and 1; the same one
 * twice where a run of panels is odd) into sums[r][c][16]: their blocks decoded here in registers (and kept in
 * decoded[c], `mode`), or read from there; `next` the panels to ask for (or NULL). A block's sum of q x runs
 * in one chain, an accumulator a row and panel, its steps' w0 then w1 step after step, then total += d * sum
 * (+ m sum of x); Q6_K's, a sum for each half (steps 0 .. 3, then 4 .. 7), each times its own d. An output's
 * chain is the same whatever tile, row or panel slot it takes. */
static inline AVX512Q_BF16 __attribute__((always_inline)) void qtile_pairs(int qtype, int mr, int mode,
                                                                          const uint16_t *x, long K,
                                                                          const float *xsum,
                                                                          const uint8_t *const panel[2],
                                                                          const uint8_t *const next[2],
                                                                          struct decoded_block *const decoded[2],
                                                                          float sums[PAIR_ROWS][2][QNR]) {
    long blocks = K / QK, bytes = linnet_qpanel_block_bytes(qtype);
    const uint32_t *xp = (const uint32_t *)x;
    __m512 total[PAIR_ROWS][2], acc[PAIR_ROWS][2];
#pragma GCC unroll 8
    for (int r = 0; r < PAIR_ROWS; r++)
        total[r][0] = total[r][1] = _mm512_setzero_ps();
    for (long b = 0; b < blocks; b++) {
        const uint8_t *block[2] = {panel[0] + b * bytes, panel[1] + b * bytes};
        int from_buffer = mode == READ_DECODED;
        if (next)
#pragma GCC unroll 2
            for (int c = 0; c < 2; c++)
                for (long at = 0; at < bytes; at += 64)
                    _mm_prefetch((const char *)next[c] + b * bytes + at, PREFETCH_HINT);
        struct decoded_block *here[2] = {NULL, NULL}; /* the blocks kept, or to keep */
        if (mode != DECODE)
            here[0] = decoded[0] + b, here[1] = decoded[1] + b;
        for (int h = 0; h < halves(qtype); h++) {
#pragma GCC unroll 8
            for (int r = 0; r < PAIR_ROWS; r++)
                acc[r][0] = acc[r][1] = _mm512_setzero_ps();
#pragma GCC unroll 4
            for (int s = h * QK / 4 / halves(qtype); s < (h + 1) * QK / 4 / halves(qtype); s++) {
                __m512bh w[2][2]; /* [panel][w0, w1] */
#pragma GCC unroll 2
                for (int c = 0; c < 2; c++)
                    if (from_buffer) {
                        w[c][0] = here[c]->w[2 * s], w[c][1] = here[c]->w[2 * s + 1];
                    } else {
                        block_step(qtype, block[c], s, &w[c][0], &w[c][1]);
                        if (mode == DECODE_AND_KEEP)
                            here[c]->w[2 * s] = w[c][0], here[c]->w[2 * s + 1] = w[c][1];
                    }
#pragma GCC unroll 2
                for (int i = 0; i < 2; i++) {
                    int pair = step_pair(qtype, s, i);
#pragma GCC unroll 8
                    for (int r = 0; r < PAIR_ROWS; r++)
                        if (r < mr) {
                            __m512bh xr = (__m512bh)_mm512_set1_epi32((int)xp[r * K / 2 + b * QK / 2 + pair]);
                            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], w[0][i], xr);
                            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], w[1][i], xr);
                        }
                }
            }
#pragma GCC unroll 2
            for (int c = 0; c < 2; c++) {
                __m512 d = from_buffer ? here[c]->d[h] : scale16(qtype, block[c], h);
                if (mode == DECODE_AND_KEEP)
                    here[c]->d[h] = d;
#pragma GCC unroll 8
                for (int r = 0; r < PAIR_ROWS; r++)
                    if (r < mr)
                        total[r][c] = _mm512_fmadd_ps(d, acc[r][c], total[r][c]);
            }
        }
        if (has_min(qtype)) {
#pragma GCC unroll 2
            for (int c = 0; c < 2; c++) {
                __m512 m = from_buffer ? here[c]->m : min16(qtype, block[c]);
                if (mode == DECODE_AND_KEEP)
                    here[c]->m = m;
#pragma GCC unroll 8
                for (int r = 0; r < PAIR_ROWS; r++)
                    if (r < mr)
                        total[r][c] = _mm512_fmadd_ps(m, _mm512_set1_ps(xsum[r * blocks + b]), total[r][c]);
            }
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < PAIR_ROWS; r++)
        if (r < mr)
            _mm512_storeu_ps(sums[r][0], total[r][0]), _mm512_storeu_ps(sums[r][1], total[r][1]);
}

#define PAIR_TILE(qtype, mr, mode) qtile_pairs(qtype, mr, mode, x, K, xsum, panel, next, decoded, sums)
#define PAIR_CASE(mr)                                                                                 \
    case mr:                                                                                          \
        if (mode == DECODE) BY_TYPE(qtype, PAIR_TILE, mr, DECODE)                                      \
        else BY_TYPE(qtype, PAIR_TILE, mr, READ_DECODED)                                               \
        break;

static AVX512Q_BF16 void qtile_pairs_rows(int qtype, int mr, const uint16_t *x, long K, const float *xsum,
                                          const uint8_t *const panel[2], const uint8_t *const next[2], int mode,
                                          struct decoded_block *const decoded[2], float sums[PAIR_ROWS][2][QNR]) {
    if (mode == DECODE_AND_KEEP) /* (a panel's first row tile, whole, of more rows than one holds) */
        BY_TYPE(qtype, PAIR_TILE, PAIR_ROWS, DECODE_AND_KEEP)
    else switch (mr) { /* a tile a row count, type and mode: its accumulators stay in registers */
        PAIR_CASE(6) PAIR_CASE(5) PAIR_CASE(4) PAIR_CASE(3) PAIR_CASE(2) PAIR_CASE(1)
    }
}

/* ---- AVX2: a panel row's 16 columns as two 8-wide halves */

static inline AVX2 __attribute__((always_inline)) void qtile256(int qtype, int mr, const float *x, long K,
                                                                const float *xsum, const uint8_t *panel,
                                                                float sums[4][QNR]) {
    long blocks = K / QK, bytes = linnet_qpanel_block_bytes(qtype);
    __m256 lo_total[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    __m256 hi_total[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (long b = 0; b < blocks; b++) {
        const uint8_t *block = panel + b * bytes;
        const uint8_t *q = block + quants_at(qtype);
        for (int h = 0; h < halves(qtype); h++) {
            __m256 a_lo[2], a_hi[2], e_lo[2], e_hi[2];
#pragma GCC unroll 2
            for (int r = 0; r < 2; r++)
                a_lo[r] = a_hi[r] = e_lo[r] = e_hi[r] = _mm256_setzero_ps();
#pragma GCC unroll 4
            for (int s = h * QK / 2 / halves(qtype); s < (h + 1) * QK / 2 / halves(qtype); s++) {
                /* 8-bit quants: k = 2s and 2s + 1; 4-bit ones: k = s and s + 16 */
                __m256 q0_lo, q0_hi, q1_lo, q1_hi;
                long k0, k1;
                if (!nibbles(qtype)) { /* even and odd k: lines 2s and 2s + 1 */
                    __m128i v0 = _mm_loadu_si128((const __m128i *)(q + 2 * s * QNR));
                    __m128i v1 = _mm_loadu_si128((const __m128i *)(q + (2 * s + 1) * QNR));
                    q0_lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v0));
                    q0_hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v0, 8)));
                    q1_lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v1));
                    q1_hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v1, 8)));
                    k0 = 2 * s, k1 = 2 * s + 1;
                } else { /* the low and high nibbles of line s: k = s and s + 16 */
                    __m128i v = _mm_loadu_si128((const __m128i *)(q + s * QNR));
                    __m256i w_lo = _mm256_cvtepu8_epi32(v), w_hi = _mm256_cvtepu8_epi32(_mm_srli_si128(v, 8));
                    __m256i low = _mm256_set1_epi32(15);
                    __m256i n0_lo = _mm256_and_si256(w_lo, low), n0_hi = _mm256_and_si256(w_hi, low);
                    __m256i n1_lo = _mm256_srli_epi32(w_lo, 4), n1_hi = _mm256_srli_epi32(w_hi, 4);
                    if (fifth_bits(qtype)) {
                        n0_lo = with_fifth8(qtype, n0_lo, block, s, 0);
                        n0_hi = with_fifth8(qtype, n0_hi, block, s, 1);
                        n1_lo = with_fifth8(qtype, n1_lo, block, s + 16, 0);
                        n1_hi = with_fifth8(qtype, n1_hi, block, s + 16, 1);
                    }
                    q0_lo = nibble8(qtype, n0_lo);
                    q0_hi = nibble8(qtype, n0_hi);
                    q1_lo = nibble8(qtype, n1_lo);
                    q1_hi = nibble8(qtype, n1_hi);
                    k0 = s, k1 = s + QK / 2;
                }
#pragma GCC unroll 2
                for (int r = 0; r < 2; r++)
                    if (r < mr) {
                        const float *xr = x + r * K + b * QK;
                        __m256 x0 = _mm256_set1_ps(xr[k0]), x1 = _mm256_set1_ps(xr[k1]);
                        a_lo[r] = _mm256_fmadd_ps(q0_lo, x0, a_lo[r]);
                        a_hi[r] = _mm256_fmadd_ps(q0_hi, x0, a_hi[r]);
                        e_lo[r] = _mm256_fmadd_ps(q1_lo, x1, e_lo[r]);
                        e_hi[r] = _mm256_fmadd_ps(q1_hi, x1, e_hi[r]);
                    }
            }
            __m256 d_lo = scale8(qtype, block, h, 0), d_hi = scale8(qtype, block, h, 1);
#pragma GCC unroll 2
            for (int r = 0; r < 2; r++)
                if (r < mr) {
                    lo_total[r] = _mm256_fmadd_ps(d_lo, _mm256_add_ps(a_lo[r], e_lo[r]), lo_total[r]);
                    hi_total[r] = _mm256_fmadd_ps(d_hi, _mm256_add_ps(a_hi[r], e_hi[r]), hi_total[r]);
                }
        }
        if (has_min(qtype)) {
#pragma GCC unroll 2
            for (int r = 0; r < 2; r++)
                if (r < mr) {
                    __m256 s = _mm256_set1_ps(xsum[r * blocks + b]);
                    lo_total[r] = _mm256_fmadd_ps(min8(qtype, block, 0), s, lo_total[r]);
                    hi_total[r] = _mm256_fmadd_ps(min8(qtype, block, 1), s, hi_total[r]);
                }
        }
    }
#pragma GCC unroll 2
    for (int r = 0; r < 2; r++)
        if (r < mr) {
            _mm256_storeu_ps(sums[r], lo_total[r]);
            _mm256_storeu_ps(sums[r] + 8, hi_total[r]);
        }
}

static AVX2 void qtile256_rows(int qtype, int mr, const float *x, long K, const float *xsum, const uint8_t *panel,
                               float sums[4][QNR]) {
    if (mr >= 2)
        BY_TYPE(qtype, qtile256, 2, x, K, xsum, panel, sums)
    else
        BY_TYPE(qtype, qtile256, 1, x, K, xsum, panel, sums)
}

/* ---- the call */

enum { PATH_AVX2, PATH_AVX512, PATH_PAIRS }; /* the tiles a call takes */

struct qlinear_job {
    int qtype, y_type, path;
    const void *x; /* f32, or bf16 for PATH_PAIRS */
    const float *xsum;
    long M, K, N, P;
    const void *const *panels;
    const long *cols;
    const int *widths;
    void *y;
};

/* Panels [p0, p1) of chunk c times every row of x, each tile's sums rounded into y as they are stored. The pair
 * tiles take two panels at a time (the last of an odd run twice, its second sums dropped). */
static AVX2 int qlinear_chunk(void *data, long c, long chunks) {
    const struct qlinear_job *t = data;
    long p0 = t->P * c / chunks, p1 = t->P * (c + 1) / chunks, blocks = t->K / QK;
    int pairs = t->path == PATH_PAIRS;
    int tile_rows = pairs ? PAIR_ROWS : t->path == PATH_AVX512 ? 4 : 2, step = pairs ? 2 : 1;
    long x_bytes = pairs ? 2 : 4;
    float sums[PAIR_ROWS][2][QNR];
    /* the pairs' two panels decoded once (two at a time; without the memory, each tile decodes its own) */
    struct decoded_block *decoded = NULL;
    if (pairs && t->M >= DECODE_FROM)
        decoded = aligned_alloc(64, 2 * blocks * sizeof(struct decoded_block));
    /* x in blocks of rows kept in cache while the chunk's panels pass: QMC, or DECODED_ROWS where each
     * panel is decoded again for each block */
    long row_block = decoded ? DECODED_ROWS : QMC;
    for (long m0 = 0; m0 < t->M; m0 += row_block) {
        long m1 = m0 + row_block < t->M ? m0 + row_block : t->M;
        for (long p = p0; p < p1; p += step) {
            int two = pairs && p + 1 < p1;
            const uint8_t *panel[2] = {t->panels[p], t->panels[two ? p + 1 : p]};
            /* the next two panels, which the first row tile asks for as it decodes these (none at the run's end) */
            const uint8_t *next[2] = {p + 2 < p1 ? t->panels[p + 2] : NULL, NULL};
            next[1] = p + 3 < p1 ? t->panels[p + 3] : next[0];
            struct decoded_block *kept[2] = {decoded, decoded ? decoded + (two ? blocks : 0) : NULL};
            for (long m = m0; m < m1; m += tile_rows) {
                int mr = m1 - m < tile_rows ? (int)(m1 - m) : tile_rows;
                const void *x = (const char *)t->x + m * t->K * x_bytes;
                const float *xsum = t->xsum ? t->xsum + m * blocks : NULL;
                if (pairs) {
                    int mode = !decoded || m1 - m0 <= PAIR_ROWS ? DECODE : m == m0 ? DECODE_AND_KEEP : READ_DECODED;
                    qtile_pairs_rows(t->qtype, mr, x, t->K, xsum, panel, next[0] && m == m0 ? next : NULL, mode, kept,
                                     sums);
                }
                else if (t->path == PATH_AVX512)
                    qtile512_rows(t->qtype, mr, x, t->K, xsum, panel[0], (float(*)[QNR])sums);
                else
                    qtile256_rows(t->qtype, mr, x, t->K, xsum, panel[0], (float(*)[QNR])sums);
                for (int r = 0; r < mr; r++)
                    for (int q = 0; q < 1 + two; q++)
                        for (int j = 0; j < t->widths[p + q]; j++)
                            store1(t->y, t->y_type, (m + r) * t->N + t->cols[p + q] + j,
                                   pairs ? sums[r][q][j] : ((float(*)[QNR])sums)[r][j]);
            }
        }
    }
    free(decoded);
    return 0;
}

/* Each row's sum over each block of 32 of x [M, K] (f32 or bf16: x_type; Q4_1's, Q4_K's and Q5_K's minimums
 * multiply them): in one order whatever M is. */
static AVX2 void block_sums(int x_type, const void *x, long M, long K, float *out) {
    for (long m = 0; m < M; m++)
        for (long b = 0; b < K / QK; b++) {
            long at = m * K + b * QK;
            __m256 s = _mm256_add_ps(_mm256_add_ps(load8(x, x_type, at), load8(x, x_type, at + 8)),
                                     _mm256_add_ps(load8(x, x_type, at + 16), load8(x, x_type, at + 24)));
            out[m * (K / QK) + b] = hsum8(s);
        }
}

/* y [M, N] (y_type: F32, BF16 or F16) = x [M, K] (F32 or BF16: x_type; K a multiple of 32) times P panels of qtype
 * (QTYPE_Q8_0, Q4_1, Q5_0, Q4_K, Q5_K, Q6_K or IQ4_NL, laid out as the top says): panel p gives y's columns cols[p] ..
 * cols[p] + widths[p], so one call can run a fused group's weights. Sums are f32's, rounded once to y_type. Threads
 * split the panels in equal runs, as linnet_linear's do. Returns -1 if out of memory, -2 for a type or K the kernel
 * does not take. */
int linnet_qlinear(int qtype, int x_type, const void *x, long M, long K, long P, const void *const *panels,
                   const long *cols, const int *widths, int y_type, void *y, long N, int threads) {
    if (!linnet_qpanel_block_bytes(qtype) || K % QK)
        return -2;
    if (M == 0 || P == 0)
        return 0;
    float *wide_x = NULL, *xsum = NULL;
    const void *input = x;
    int path = linnet_isa() < ISA_AVX512 ? PATH_AVX2 : x_type == BF16 && linnet_isa() >= ISA_AVX512_BF16 ? PATH_PAIRS
                                                                                                         : PATH_AVX512;
    if (x_type != F32 && path != PATH_PAIRS) {
        if (!(wide_x = malloc(M * K * sizeof(float))))
            return -1;
        for (long i = 0; i < M * K; i++) /* bf16 to f32: exact */
            ((uint32_t *)wide_x)[i] = (uint32_t)((const uint16_t *)x)[i] << 16;
        input = wide_x;
    }
    int status = -1;
    if (has_min(qtype) && !(xsum = malloc(M * (K / QK) * sizeof(float))))
        goto done;
    if (xsum)
        block_sums(input == x ? x_type : F32, input, M, K, xsum);
    struct qlinear_job job = {qtype, y_type, path, input, xsum, M, K, N, P, panels, cols, widths, y};
    status = linnet_parallel(qlinear_chunk, &job, P < threads ? P : threads, threads) ? -1 : 0;
done:
    free(wide_x);
    free(xsum);
    return status;
}

/* ---- rows of a weight's panels, decoded: the gather of an embedding whose tied head runs in them */

/* Value k (0 .. 31) of row j (0 .. 15) of a panel block, as gguf's decoder gives it: d q (Q4_1, Q4_K,
 * Q5_K: + m). d q is exact in f32 (11 by at most 8 significant bits, times a quant of at most 8; Q6_K's d sc
 * q rounds once, as gguf's product does), so with or without a fused add the sum is rounded once. */
static inline AVX2 float panel_value(int qtype, const uint8_t *block, int j, int k) {
    const uint8_t *q = block + quants_at(qtype);
    int h = halves(qtype) == 2 && k >= QK / 2; /* (Q6_K's second scale) */
    float d = f16_scales(qtype) ? _cvtsh_ss(((const uint16_t *)(block + scales_at(qtype, h)))[j])
                                : ((const float *)(block + scales_at(qtype, h)))[j];
    float level;
    if (!nibbles(qtype)) {
        level = (float)((const int8_t *)q)[k * QNR + j];
    } else {
        uint8_t byte = q[(k % (QK / 2)) * QNR + j], nibble = k < QK / 2 ? byte & 15 : byte >> 4;
        if (fifth_bits(qtype))
            nibble |= (fifth_words(qtype, block)[fifth_word(k)] >> fifth_shift(j, k) & 1) << 4;
        level = qtype == QTYPE_IQ4_NL ? IQ4_LEVELS[nibble] : qtype == QTYPE_Q5_0 ? nibble - 16.0f : (float)nibble;
    }
    if (!has_min(qtype))
        return d * level;
    float m = qtype == QTYPE_Q4_1 ? _cvtsh_ss(((const uint16_t *)(block + mins_at(qtype)))[j])
                                  : ((const float *)(block + mins_at(qtype)))[j]; /* the K-quants': -dmin mn */
    return d * level + m;
}

struct qgather_job {
    int qtype, value_type, out_type;
    long K, N, n;
    const void *const *panels;
    const int32_t *ids;
    void *out;
};

static AVX2 int qgather_chunk(void *data, long c, long chunks) {
    const struct qgather_job *g = data;
    long i0 = g->n * c / chunks, i1 = g->n * (c + 1) / chunks, bytes = linnet_qpanel_block_bytes(g->qtype);
    for (long i = i0; i < i1; i++) {
        long id = g->ids[i], o = i * g->K;
        if (id < 0 || id >= g->N) {
            memset((char *)g->out + o * type_bytes(g->out_type), 0, g->K * type_bytes(g->out_type));
            continue;
        }
        const uint8_t *panel = g->panels[id / QNR];
        for (long b = 0; b < g->K / QK; b++)
            for (int k = 0; k < QK; k++)
                store1(g->out, g->out_type, o + b * QK + k,
                       round_to(g->value_type, panel_value(g->qtype, panel + b * bytes, (int)(id % QNR), k)));
    }
    return 0;
}

#define QGATHER_PARALLEL_FROM (1L << 16) /* values below which one thread gathers (a decode step's few rows) */

/* out [n, K] (out_type) = rows ids of a weight [N, K] of qtype in P panels (panel p its rows 16p ..
 * 16p + 15, as `linnet_qlinear` reads them: one weight's, not a joined group's), each value decoded as
 * gguf's decoder gives it, then rounded to value_type (the param's type: the value a decoded table of
 * that type would hold); an id outside [0, N) gives a row of zeros, as linnet_gather_rows does. Returns
 * -2 for a type or K the kernel does not take. */
int linnet_qgather(int qtype, long K, long P, const void *const *panels, long N, const int32_t *ids, long n,
                   int value_type, int out_type, void *out, int threads) {
    if (!linnet_qpanel_block_bytes(qtype) || K % QK || N > P * QNR)
        return -2;
    struct qgather_job job = {qtype, value_type, out_type, K, N, n, panels, ids, out};
    long chunks = n < threads ? n : threads;
    if (n * K < QGATHER_PARALLEL_FROM || chunks <= 1 || linnet_parallel(qgather_chunk, &job, chunks, threads))
        qgather_chunk(&job, 0, 1); /* (linnet_parallel fails only before any chunk ran: out of memory) */
    return 0;
}
