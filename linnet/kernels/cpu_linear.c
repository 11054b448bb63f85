/* Linnet's CPU matmul for linear weights: y[M, N] = x[M, K] @ w[N, K]^T, in f32 arithmetic.
 *
 * The weight is packed once, at load and in its own memory, in panels of 16 output columns:
 * panel p holds w[16p : 16p + 16, :] transposed, K rows of 16 values, so a step over K reads one
 * contiguous 64-byte (f32) or 32-byte (bf16 / f16) line. A 6x16 register tile (12 AVX2
 * accumulators) walks K once for six input rows; threads split the panels, which the caller
 * lists (pointer, width, output column), so one call can run the weights of a fused group.
 * Nothing is packed per call: at the few rows of a decode step, packing a library does per
 * call costs as much as the product.
 *
 * bf16 / f16 weights are widened in registers (bf16 by unpacking with zeros, in the column order
 * BF16_PLACES gives; f16 by F16C), so one row reads half the bytes of f32; on AVX2 alone, from 12
 * rows on, each thread widens its panel once into an f32 buffer.
 *
 * On AVX-512, panels over 4 rows or more go through a 12-row tile of two panels (bf16 / f16 widened
 * in registers as each row loads); with AVX-512
 * BF16 a bf16 weight of even K is packed in pairs of K for VDPBF16PS, and with AMX those pairs are
 * AMX's own operand layout, multiplied in 16 x 16 tiles at any row count (sections below).
 *
 * Batch invariance: a row's sums are bitwise the same whatever other rows its call holds. Each
 * path sums an output over K in one order at every row count: one chain, k after k, in every f32
 * tile (tile1, tile, tile_wide: the same FMAs in the same order), one VDPBF16PS chain in every
 * pair tile, and AMX's tiles for one row as for many (TDPBF16PS's sums differ from VDPBF16PS's
 * in their last bits), so a greedy request gives the same tokens alone as beside others.
 *
 * Kernels carry target attributes, not global -m flags: linnet_cpu_supported() runs on any
 * x86-64 and tells the caller whether the rest may run.
 */
#include <cpuid.h>
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kernels.h"

#define NR 16     /* output columns a panel */
#define MR 6      /* input rows a register tile */
#define MC 240    /* input rows a block: its x stays in cache while every panel passes */
#define PREFETCH_ROWS 32  /* a one-row bf16 / f16 product asks for its panel 1 KB ahead: 17.5 ms, not 19.4, for SmolLM2 */
#define PREFETCH_ROWS_F32 64  /* and an f32 one 4 KB ahead: one SmolLM2 request 34 -> 45 tokens/s (2-core Xeon) */
#define WIDEN_FROM 12  /* rows from which a bf16 / f16 panel is widened once, not at each tile */

int linnet_cpu_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

static int amx_granted(void);

/* LINNET_CPU_ISA's level, in any case: unset (or "amx"), no cap. Python checks the spelling
 * first (`build.isa_cap`). */
static int isa_cap(void) {
    const char *cap = getenv("LINNET_CPU_ISA");
    if (!cap || !*cap)
        return ISA_AMX;
    if (!strcasecmp(cap, "avx2"))
        return ISA_AVX2;
    if (!strcasecmp(cap, "avx512"))
        return ISA_AVX512;
    return !strcasecmp(cap, "avx512_bf16") ? ISA_AVX512_BF16 : ISA_AMX;
}

/* The CPU's level, no higher than `cap`; AMX's tiles are asked for only where the cap allows them. */
static int cpu_isa(int cap) {
    __builtin_cpu_init();
    if (!linnet_cpu_supported())
        return ISA_NONE;
    if (cap < ISA_AVX512 || !__builtin_cpu_supports("avx512f"))
        return ISA_AVX2;
    if (cap < ISA_AVX512_BF16 || !__builtin_cpu_supports("avx512bw") || !__builtin_cpu_supports("avx512vl") ||
        !__builtin_cpu_supports("avx512bf16"))
        return ISA_AVX512;
    return cap < ISA_AMX || !amx_granted() ? ISA_AVX512_BF16 : ISA_AMX;
}

int linnet_isa(void) {
    static int level = -1; /* read and written atomically: XLA's threads may make their first calls at once */
    int known = __atomic_load_n(&level, __ATOMIC_RELAXED);
    if (known < 0) {
        known = cpu_isa(isa_cap());
        __atomic_store_n(&level, known, __ATOMIC_RELAXED);
    }
    return known;
}

/* Whether a weight of `type` and K is packed in pairs of K (see the top): the one rule, which the
 * packers (here and in Python) and the kernel all follow. */
int linnet_panel_pairs(int type, long K) {
    return type == BF16 && K % 2 == 0 && linnet_isa() >= ISA_AVX512_BF16;
}

/* The column a bf16 panel row holds at each of its 16 places: interleaving a row's 16 values with
 * zeros (unpack, which works within 128-bit halves) puts each in the high half of an f32 in this
 * order, which gives columns 0-7 and 8-15 in one load and two instructions. Widening in column
 * order took four, and kept a one-row bf16 product from reading at memory speed. */
static const int BF16_PLACES[NR] = {0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15};

/* Panel row k as two 8-wide f32 vectors: columns 0-7 and 8-15. */
static inline AVX2 __attribute__((always_inline)) void load_row(const void *panel, int type, long k,
                                                                __m256 *lo, __m256 *hi) {
    if (type == BF16) {
        __m256i v = _mm256_loadu_si256((const __m256i *)((const uint16_t *)panel + k * NR));
        *lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(_mm256_setzero_si256(), v));
        *hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(_mm256_setzero_si256(), v));
        return;
    }
    *lo = load8(panel, type, k * NR);
    *hi = load8(panel, type, k * NR + 8);
}

#define ROW(r)                                                    \
    if (mr > r) {                                                 \
        __m256 a = _mm256_broadcast_ss(x + (long)r * K + k);      \
        c##r##0 = _mm256_fmadd_ps(a, lo, c##r##0);                \
        c##r##1 = _mm256_fmadd_ps(a, hi, c##r##1);                \
    }
#define STORE(r)                                                                  \
    if (mr > r) {                                                                 \
        _mm256_storeu_ps(out + (long)r * ldo, c##r##0);                           \
        _mm256_storeu_ps(out + (long)r * ldo + 8, c##r##1);                       \
    }

/* mr (1..6) rows of x [., K] times one panel: out[r, 0:16], rows ldo apart. mr and type are
 * constants at each call site below, so the compiler drops the branches. `ahead`, if not NULL,
 * is the next panel, asked for a row (`ahead_row` bytes) at each k: read from memory while this
 * one computes, it is in cache when its turn comes. */
static inline AVX2 __attribute__((always_inline)) void tile(int mr, int type, const float *x, const void *panel,
                                                            long K, float *out, long ldo, const char *ahead,
                                                            long ahead_row) {
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00,
           c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    for (long k = 0; k < K; k++) {
        __m256 lo, hi;
        if (ahead)
            _mm_prefetch(ahead + k * ahead_row, _MM_HINT_T0);
        load_row(panel, type, k, &lo, &hi);
        ROW(0) ROW(1) ROW(2) ROW(3) ROW(4) ROW(5)
    }
    STORE(0) STORE(1) STORE(2) STORE(3) STORE(4) STORE(5)
}

/* One row times one panel, which is all a one-token decode step does, so it is read at memory
 * speed: the panel asked for ahead (PREFETCH_ROWS, PREFETCH_ROWS_F32). Each column sums over K in
 * one chain, k after k, as `tile` and `tile_wide` do, so that a row's result does not depend on
 * how many rows its call has (split over four chains, one row's sums differed in the last bits
 * from the same row's beside others). Two chains of FMAs (4 cycles each) still outrun one core's
 * memory reads. */
static inline AVX2 __attribute__((always_inline)) void tile1(int type, const float *x, const void *panel, long K,
                                                             float *out) {
    __m256 c0 = _mm256_setzero_ps(), c1 = c0;
    long bytes = type_bytes(type) * NR;
    for (long k = 0; k < K; k++) {
        if (!(k & 3)) { /* the four rows' lines, PREFETCH_ROWS(_F32) ahead: 2 (16-bit) or 4 (f32) */
            const char *ahead = (const char *)panel + (k + (type == F32 ? PREFETCH_ROWS_F32 : PREFETCH_ROWS)) * bytes;
            for (long line = 0; line < 4 * bytes; line += 64)
                _mm_prefetch(ahead + line, _MM_HINT_T0);
        }
        __m256 lo, hi, a = _mm256_broadcast_ss(x + k);
        load_row(panel, type, k, &lo, &hi);
        c0 = _mm256_fmadd_ps(a, lo, c0);
        c1 = _mm256_fmadd_ps(a, hi, c1);
    }
    _mm256_storeu_ps(out, c0);
    _mm256_storeu_ps(out + 8, c1);
}

static inline AVX2 __attribute__((always_inline)) void tile_any(int mr, int type, const float *x,
                                                                const void *panel, long K, float *out, long ldo,
                                                                const char *ahead, long ahead_row) {
    switch (mr) {
    case 6: tile(6, type, x, panel, K, out, ldo, ahead, ahead_row); break;
    case 5: tile(5, type, x, panel, K, out, ldo, ahead, ahead_row); break;
    case 4: tile(4, type, x, panel, K, out, ldo, ahead, ahead_row); break;
    case 3: tile(3, type, x, panel, K, out, ldo, ahead, ahead_row); break;
    case 2: tile(2, type, x, panel, K, out, ldo, ahead, ahead_row); break;
    default: tile1(type, x, panel, K, out); break;
    }
}

/* rows [m0, m1) of x times one panel of `width` (<= 16) columns, into y's columns from `col`;
 * a panel narrower than 16 goes through a scratch tile. The first tile asks for the next panel
 * (`ahead`, rows of `ahead_row` bytes), so that a few rows' product, which reads each panel from
 * memory once, overlaps the reading with the arithmetic. */
static inline AVX2 __attribute__((always_inline)) void rows_times_panel(int type, const float *x, long m0, long m1,
                                                                        const void *panel, int width, long K,
                                                                        float *y, long N, long col,
                                                                        const char *ahead, long ahead_row) {
    for (long m = m0; m < m1; m += MR) {
        int mr = m1 - m < MR ? (int)(m1 - m) : MR;
        const char *next = m == m0 ? ahead : NULL;
        if (width == NR) {
            tile_any(mr, type, x + m * K, panel, K, y + m * N + col, N, next, ahead_row);
        } else {
            float scratch[MR * NR];
            tile_any(mr, type, x + m * K, panel, K, scratch, NR, next, ahead_row);
            for (int r = 0; r < mr; r++)
                memcpy(y + (m + r) * N + col, scratch + r * NR, width * sizeof(float));
        }
    }
}

/* A bf16 / f16 panel widened into wide, an f32 panel (K x 16). */
static AVX2 void widen_panel(int type, const void *panel, long K, float *wide) {
    for (long k = 0; k < K; k++) {
        __m256 lo, hi;
        if (type == BF16) load_row(panel, BF16, k, &lo, &hi);
        else load_row(panel, F16, k, &lo, &hi);
        _mm256_storeu_ps(wide + k * NR, lo);
        _mm256_storeu_ps(wide + k * NR + 8, hi);
    }
}

/* Panels [p0, p1) times every row of x. `wide`: a K x 16 f32 buffer where a bf16 / f16 panel
 * is widened once (from WIDEN_FROM rows), or NULL. */
static AVX2 void panel_range(int type, const float *x, long M, long K, const void *const *panels,
                             const long *cols, const int *widths, float *y, long N, long p0, long p1,
                             float *wide) {
    long row = NR * type_bytes(type);
    for (long m0 = 0; m0 < M; m0 += MC) {
        long m1 = m0 + MC < M ? m0 + MC : M;
        for (long p = p0; p < p1; p++) {
            const char *next = p + 1 < p1 ? (const char *)panels[p + 1] : NULL;
            if (!wide) {
                if (type == F32) rows_times_panel(F32, x, m0, m1, panels[p], widths[p], K, y, N, cols[p], next, row);
                else if (type == BF16) rows_times_panel(BF16, x, m0, m1, panels[p], widths[p], K, y, N, cols[p], next, row);
                else rows_times_panel(F16, x, m0, m1, panels[p], widths[p], K, y, N, cols[p], next, row);
                continue;
            }
            widen_panel(type, panels[p], K, wide);
            rows_times_panel(F32, x, m0, m1, wide, widths[p], K, y, N, cols[p], next, row);
        }
    }
}

/* ---- bf16 weights in pairs of K, on AVX-512 BF16 (see the top) */

#define PREFETCH_PAIRS 32 /* a one-row product asks for its panels this many pair-rows (2 KB) ahead: 4 (256 B) ran one
                            * SmolLM2 bf16 request at 76 tokens/s on a 2-core Xeon, 32 at 86 */
#define MRP 12 /* input rows a pair tile: 12 x 2 panels are 24 of the 32 vector registers */

/* Output columns [0, width) of a panel, as a store mask. */
static inline __mmask16 width_mask(int width) { return (__mmask16)((1u << width) - 1); }

/* mr (1..MRP) rows of xp (bf16 pairs, K2 a row) times one or two panels (a; b when two): out_a and
 * out_b get the rows' 16 columns each, masked to their widths, rows ldo apart. The tile asks for
 * the next two panels (na, nb, if not NULL) a line at each pair-row. */
static inline AVX512BF16 __attribute__((always_inline)) void tile_pairs(
    int mr, int two, const uint32_t *xp, long K2, const __m512i *a, const __m512i *b, float *out_a, float *out_b,
    long ldo, __mmask16 mask_a, __mmask16 mask_b, const char *na, const char *nb) {
    __m512 ca[MRP], cb[MRP];
    for (int r = 0; r < MRP; r++)
        ca[r] = cb[r] = _mm512_setzero_ps();
    for (long j = 0; j < K2; j++) {
        if (na) {
            _mm_prefetch(na + j * 64, _MM_HINT_T0);
            if (nb) _mm_prefetch(nb + j * 64, _MM_HINT_T0);
        }
        __m512bh wa = (__m512bh)_mm512_loadu_si512(a + j), wb;
        if (two) wb = (__m512bh)_mm512_loadu_si512(b + j);
        for (int r = 0; r < MRP; r++) {
            if (r >= mr) break;
            __m512bh xr = (__m512bh)_mm512_set1_epi32((int)xp[r * K2 + j]);
            ca[r] = _mm512_dpbf16_ps(ca[r], xr, wa);
            if (two) cb[r] = _mm512_dpbf16_ps(cb[r], xr, wb);
        }
    }
    for (int r = 0; r < MRP; r++) {
        if (r >= mr) break;
        _mm512_mask_storeu_ps(out_a + r * ldo, mask_a, ca[r]);
        if (two) _mm512_mask_storeu_ps(out_b + r * ldo, mask_b, cb[r]);
    }
}

/* One row times one panel, a pair-row (a line) a step in one chain, as `tile_pairs` sums (two
 * chains, summed at the end, gave a row alone other last bits than the same row beside others),
 * the panel asked for PREFETCH_PAIRS pair-rows ahead. The panels are read one after another: with the
 * weights on huge pages (`kernels/pages.py`) one stream reads fastest; on 4 KB pages, eight panels read side
 * by side were as fast, not faster. A jitted chain of SmolLM2's 121 one-row linears: 7.2 ms on
 * huge pages, 8.7 on 4 KB pages (both ways), in the same process. */
static inline AVX512BF16 void tile1_pairs(const uint32_t *xp, long K2, const __m512i *panel, float *out,
                                          __mmask16 mask) {
    __m512 c = _mm512_setzero_ps();
    for (long j = 0; j < K2; j++) {
        _mm_prefetch((const char *)(panel + j + PREFETCH_PAIRS), _MM_HINT_T0);
        c = _mm512_dpbf16_ps(c, (__m512bh)_mm512_set1_epi32((int)xp[j]), (__m512bh)_mm512_loadu_si512(panel + j));
    }
    _mm512_mask_storeu_ps(out, mask, c);
}

#define PAIR_TILE(mr)                                                                                    \
    case mr:                                                                                             \
        if (two) tile_pairs(mr, 1, xp + m * K2, K2, a, b, oa, ob, N, ma, mb, na, nb);                   \
        else tile_pairs(mr, 0, xp + m * K2, K2, a, a, oa, oa, N, ma, ma, na, NULL);                      \
        break;

/* Panels [p0, p1), two at a time, times every row of x (bf16, K a row, K even). */
static AVX512BF16 void pair_range(const uint16_t *x, long M, long K, const void *const *panels, const long *cols,
                                  const int *widths, float *y, long N, long p0, long p1) {
    const uint32_t *xp = (const uint32_t *)x;
    long K2 = K / 2;
    if (M == 1) {
        for (long p = p0; p < p1; p++)
            tile1_pairs(xp, K2, panels[p], y + cols[p], width_mask(widths[p]));
        return;
    }
    for (long m0 = 0; m0 < M; m0 += MC) {
        long m1 = m0 + MC < M ? m0 + MC : M;
        for (long p = p0; p < p1; p += 2) {
            int two = p + 1 < p1;
            const __m512i *a = panels[p], *b = two ? panels[p + 1] : NULL;
            __mmask16 ma = width_mask(widths[p]), mb = two ? width_mask(widths[p + 1]) : 0;
            for (long m = m0; m < m1; m += MRP) {
                float *oa = y + m * N + cols[p], *ob = two ? y + m * N + cols[p + 1] : NULL;
                const char *na = NULL, *nb = NULL;
                if (m == m0 && p + 2 < p1) {
                    na = panels[p + 2];
                    nb = p + 3 < p1 ? panels[p + 3] : NULL;
                }
                switch (m1 - m < MRP ? m1 - m : MRP) {
                    PAIR_TILE(1) PAIR_TILE(2) PAIR_TILE(3) PAIR_TILE(4) PAIR_TILE(5) PAIR_TILE(6)
                    PAIR_TILE(7) PAIR_TILE(8) PAIR_TILE(9) PAIR_TILE(10) PAIR_TILE(11) PAIR_TILE(12)
                }
            }
        }
    }
}

/* ---- bf16 pairs over many rows, on AMX */

/* A pair panel is already AMX's operand: 16 of its pair-rows (1 KB, rows 64 bytes apart) are a B
 * tile of 32 K by 16 columns, as TDPBF16PS reads it; 16 rows of x, 32 K each, are an A tile. A
 * block of 32 rows by two panels keeps four C tiles (16 x 16 f32) over K, with two A and two B
 * tiles: the eight tiles there are. TDPBF16PS does 16 x 16 x 32 multiply-adds where VDPBF16PS does
 * 16 x 2: SmolLM2's [368, 576] x [576, 1536] on two cores of a Xeon with AMX, 0.30 ms against the pair
 * tile's 3.4 (oneDNN's AMX kernel: 0.34). A bf16 out is rounded from each tile as it is stored, not
 * from an f32 copy of the whole product after (0.59 ms so). The first block of rows asks for the next
 * two panels as it reads these: a 16-row decode step reads the weights at memory speed only so. */
#if !defined(LINNET_NO_AMX) && ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && __GNUC__ >= 11))
#define LINNET_AMX 1 /* AMX's intrinsics: GCC 11, Clang 12 on; an older compiler keeps the pair tile, and so
                        does a build with LINNET_NO_AMX (build.py's second try, for an assembler without them) */
#endif
#define AMX_FROM 1    /* rows from which bf16 pairs take this path: every row count (see amx_range) */
#define AMX_K 32      /* K a tile step: K must be a multiple of it */

#ifdef LINNET_AMX
#define AMX_BF16 __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")))
#define AMX_ROWS 32   /* input rows a block: two A tiles */
#define AMX_MC 256    /* input rows a pass over a thread's panels: their x (288 KB at K 576) stays in L2 */
#define ARCH_REQ_XCOMP_PERM 0x1023 /* Linux: ask for a state component (asm/prctl.h) */
#define XFEATURE_XTILEDATA 18

/* AMX-TILE and AMX-BF16 here, and Linux lets this process use the tile registers (asked once, by
 * `linnet_isa`; a process must ask before its first tile instruction). */
static int amx_granted(void) {
    unsigned a, b, c, d;
    int cpu = __get_cpuid_max(0, NULL) >= 7 && __get_cpuid_count(7, 0, &a, &b, &c, &d) &&
              (d >> 22 & 1) && (d >> 24 & 1); /* AMX-BF16, AMX-TILE */
    return cpu && syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

/* GCC's tile intrinsics are asm that names no memory (a load's address is a register operand):
 * without this the compiler may drop or move the stores a tile instruction reads (the config, a
 * padded copy of x) or read before a tile store (the scratch tile). */
#define MEMORY_BARRIER() __asm__ volatile("" ::: "memory")

struct tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

/* Tiles 0-3: C (16 rows of 16 f32), 4-5: A, 6-7: B; every one 16 rows of 64 bytes. */
static AMX_BF16 void amx_configure(void) {
    struct tile_config config;
    memset(&config, 0, sizeof config);
    config.palette = 1;
    for (int t = 0; t < 8; t++) {
        config.colsb[t] = 64;
        config.rows[t] = 16;
    }
    MEMORY_BARRIER();
    _tile_loadconfig(&config);
}

/* Rows [0, rows) (at most 16), columns [0, width) of a 16 x 16 f32 tile in `scratch` into out (of
 * out_type, rows ld apart) from element `at`, rounded to out's type there. */
static AMX_BF16 void tile_out(const float *scratch, long rows, int width, int out_type, void *out, long at,
                              long ld) {
    __mmask16 mask = width_mask(width);
    for (long r = 0; r < rows && r < 16; r++) {
        __m512 v = _mm512_loadu_ps(scratch + r * NR);
        long i = at + r * ld;
        if (out_type == F32)
            _mm512_mask_storeu_ps((float *)out + i, mask, v);
        else if (out_type == BF16)
            _mm256_mask_storeu_epi16((uint16_t *)out + i, mask, (__m256i)_mm512_cvtneps_pbh(v));
        else
            _mm256_mask_storeu_epi16((uint16_t *)out + i, mask, _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    }
}

/* C tile `t`: out's rows from element `at` (16 of them, `rows` of which are x's), `width`
 * columns. Straight into an f32 out where the block is whole; else through a scratch tile,
 * rounded to out's type as it is copied. */
#define AMX_STORE(t, at, rows, width)                                                        \
    do {                                                                                     \
        if (out_type == F32 && (rows) >= 16 && (width) == NR) {                              \
            _tile_stored(t, (float *)out + (at), N * (long)sizeof(float));                   \
        } else if ((rows) > 0) {                                                             \
            _tile_stored(t, scratch, NR * (long)sizeof(float));                              \
            MEMORY_BARRIER();                                                                \
            tile_out(scratch, rows, width, out_type, out, at, N);                            \
        }                                                                                    \
    } while (0)

/* x's last rows, fewer than 16, zero-padded to 16 in a buffer of the thread's own, kept between
 * calls (a decode step's rows come to this every call); NULL if out of memory. Past the values
 * the last call wrote (`written`) the buffer holds zeros, so only those are cleared: a one-row
 * decode step takes this path at every linear (batch invariance), where clearing 15 rows of a
 * K of 14336 each time would write 430 KB a call. */
static const uint16_t *padded_rows(const uint16_t *x, long rows, long K) {
    static __thread uint16_t *buffer;
    static __thread long held, written;
    if (held < 16 * K) {
        uint16_t *grown = realloc(buffer, 16 * K * sizeof *buffer);
        if (!grown)
            return NULL;
        memset(grown + held, 0, (16 * K - held) * sizeof *buffer);
        buffer = grown, held = 16 * K;
    }
    long used = rows * K;
    memcpy(buffer, x, used * sizeof *buffer);
    if (written > used)
        memset(buffer + used, 0, (written - used) * sizeof *buffer);
    written = used;
    MEMORY_BARRIER();
    return buffer;
}

/* One block of rows (16, or 32 with `both`: x0's and x1's, ldx bytes a row) times panels a and b
 * over K into C tiles 0 (x0 a), 1 (x0 b) and, with `both`, 2 (x1 a), 3 (x1 b). The first block of
 * a pass asks for the next two panels (na, nb, if not NULL) as it reads these. */
static inline AMX_BF16 __attribute__((always_inline)) void amx_block(int both, const char *x0, const char *x1,
                                                                     long ldx, const char *a, const char *b, long K,
                                                                     const char *na, const char *nb) {
    _tile_zero(0);
    _tile_zero(1);
    if (both) {
        _tile_zero(2);
        _tile_zero(3);
    }
    for (long k = 0; k < K; k += AMX_K) {
        if (na)
            for (int line = 0; line < 16; line++) {
                _mm_prefetch(na + k * 32 + line * 64, _MM_HINT_T1);
                _mm_prefetch(nb + k * 32 + line * 64, _MM_HINT_T1);
            }
        /* each load just before its first use, so that it overlaps the products before */
        _tile_loadd(4, x0 + k * 2, ldx);
        _tile_loadd(6, a + k * 32, 64); /* pair-row k / 2, 64 bytes each */
        _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(7, b + k * 32, 64);
        _tile_dpbf16ps(1, 4, 7);
        if (both) {
            _tile_loadd(5, x1 + k * 2, ldx);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
    }
}

/* Panels [p0, p1), two at a time, times every row of x (bf16, K a row, K % AMX_K == 0), into out
 * [M, N] of out_type (the f32 sums rounded once): blocks of 32 rows, then 16, then the last
 * M % 16 rows zero-padded to 16 (`padded_rows`), so that every A tile reads 16 whole rows. -1 if
 * out of memory. */
static AMX_BF16 int amx_range(const uint16_t *x, long M, long K, const void *const *panels, const long *cols,
                              const int *widths, int out_type, void *out, long N, long p0, long p1) {
    long whole = M / 16 * 16, ldx = K * 2;
    const uint16_t *tail = whole < M ? padded_rows(x + whole * K, M - whole, K) : NULL;
    if (whole < M && !tail)
        return -1;
    float scratch[16 * NR];
    amx_configure();
    for (long m0 = 0; m0 < M; m0 += AMX_MC) {
        long m1 = m0 + AMX_MC < M ? m0 + AMX_MC : M;
        for (long p = p0; p < p1; p += 2) {
            int two = p + 1 < p1;
            const char *a = panels[p], *b = panels[two ? p + 1 : p];
            const char *na = m0 == 0 && p + 2 < p1 ? panels[p + 2] : NULL;
            const char *nb = na && p + 3 < p1 ? panels[p + 3] : na;
            for (long m = m0; m < m1; m += AMX_ROWS) {
                int both = m1 - m > 16; /* a second block of 16 rows, whole or padded */
                const char *x0 = m < whole ? (const char *)(x + m * K) : (const char *)tail;
                const char *x1 = m + 16 < whole ? (const char *)(x + (m + 16) * K) : (const char *)tail;
                amx_block(both, x0, x1, ldx, a, b, K, m == m0 ? na : NULL, nb);
                long rows = M - m, at = m * N + cols[p];
                AMX_STORE(0, at, rows, widths[p]);
                if (both)
                    AMX_STORE(2, at + 16 * N, rows - 16, widths[p]);
                if (two) {
                    at = m * N + cols[p + 1];
                    AMX_STORE(1, at, rows, widths[p + 1]);
                    if (both)
                        AMX_STORE(3, at + 16 * N, rows - 16, widths[p + 1]);
                }
            }
        }
    }
    _tile_release();
    return 0;
}

#else
static int amx_granted(void) { return 0; }
static int amx_range(const uint16_t *x, long M, long K, const void *const *panels, const long *cols,
                     const int *widths, int out_type, void *out, long N, long p0, long p1) {
    return -1; /* never called: linnet_isa() is below ISA_AMX */
}
#endif /* LINNET_AMX */

/* x [M, K] f32 rounded to bf16 (to nearest, even), as the pair kernel reads it. */
static AVX512BF16 void round_to_bf16(const float *x, long count, uint16_t *out) {
    long i = 0;
    for (; i + 16 <= count; i += 16)
        _mm256_storeu_si256((__m256i *)(out + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + i)));
    if (i < count) {
        __mmask16 m = (__mmask16)((1u << (count - i)) - 1);
        _mm256_mask_storeu_epi16(out + i, m, (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, x + i)));
    }
}

/* ---- f32, bf16 and f16 weights over several rows, on AVX-512 */

/* A panel row is one 512-bit vector, so a tile of MRF rows by two panels keeps 24 accumulators and
 * does twice the AVX2 tile's arithmetic a cycle. SmolLM2's [368, 576] x [576, 1536] on two Xeon
 * cores: 2.07 ms (MKL's sgemm 2.14; one panel a tile 2.62, the AVX2 tile about 3.4); a 16-row
 * decode step's [16, 576] x [576, 1536] 0.11 ms against the AVX2 tile's 0.16. One or two rows
 * keep the AVX2 path, whose one-row tile reads the weight at memory speed.
 * bf16 / f16 panels (AVX-512 without BF16's pairs: Skylake-SP to Ice Lake) are widened in
 * registers as each row is loaded, two instructions a row that a dozen rows' FMAs share: widening
 * each panel into an f32 buffer first, as the AVX2 path does, wrote and read back four times
 * the bytes the panel holds, and a 16-row bf16 decode step ran at 0.57x f32's (SmolLM2, this
 * host's instructions capped to AVX-512). */
#define AVX512F32 __attribute__((target("avx512f,avx2,fma,f16c")))
#define MRF 12         /* input rows a tile: 12 of the 32 vector registers accumulate */
#define WIDE_FROM 4    /* rows from which panels take this path */

/* Row k of a panel of `type` as 16 f32s: f32 and f16 in column order, bf16 in its panels' order
 * (BF16_PLACES, which `in_columns` undoes once a tile's sums are done). */
static inline AVX512F32 __attribute__((always_inline)) __m512 load16(int type, const void *panel, long k) {
    if (type == F32)
        return _mm512_loadu_ps((const float *)panel + k * NR);
    __m256i v = _mm256_loadu_si256((const __m256i *)((const uint16_t *)panel + k * NR));
    if (type == BF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
    return _mm512_cvtph_ps(v);
}

static inline AVX512F32 __attribute__((always_inline)) __m512 in_columns(int type, __m512 sums) {
    /* BF16_PLACES swaps columns 4-7 with 8-11: its own inverse */
    return type == BF16 ? _mm512_permutexvar_ps(_mm512_loadu_si512(BF16_PLACES), sums) : sums;
}

/* mr (1..MRF) rows of x [., K] times one or two panels of `type` (a; b when `two`): out_a and out_b
 * get the rows' columns [0, width), masked, rows ldo apart. Two panels make 24 accumulators, which
 * each broadcast of x feeds twice: a step over K loads 2 panel rows and mr values of x for 2 * mr
 * FMAs (one panel: 1 + mr loads for mr, which the load ports bound). mr, two and type are
 * constants at each call site, so the loops unroll and the branches go. `na`, `nb`: the next
 * panels, asked for a line at a time while this tile computes. */
static inline AVX512F32 __attribute__((always_inline)) void tile_wide(int mr, int two, int type, const float *x,
                                                                    const void *a, const void *b, long K,
                                                                    float *out_a, float *out_b, long ldo,
                                                                    __mmask16 mask_a, __mmask16 mask_b,
                                                                    const char *na, const char *nb) {
    __m512 ca[MRF], cb[MRF];
    long row = NR * type_bytes(type);
    for (int r = 0; r < MRF; r++)
        ca[r] = cb[r] = _mm512_setzero_ps();
    for (long k = 0; k < K; k++) {
        if (na && (type == F32 || !(k & 1))) { /* a 16-bit panel's line holds two rows */
            _mm_prefetch(na + k * row, _MM_HINT_T0);
            _mm_prefetch(nb + k * row, _MM_HINT_T0);
        }
        __m512 wa = load16(type, a, k), wb = two ? load16(type, b, k) : wa;
        for (int r = 0; r < MRF; r++)
            if (r < mr) {
                __m512 xr = _mm512_set1_ps(x[(long)r * K + k]);
                ca[r] = _mm512_fmadd_ps(xr, wa, ca[r]);
                if (two) cb[r] = _mm512_fmadd_ps(xr, wb, cb[r]);
            }
    }
    for (int r = 0; r < MRF; r++)
        if (r < mr) {
            _mm512_mask_storeu_ps(out_a + (long)r * ldo, mask_a, in_columns(type, ca[r]));
            if (two) _mm512_mask_storeu_ps(out_b + (long)r * ldo, mask_b, in_columns(type, cb[r]));
        }
}

#define TILE_WIDE(mr)                                                                                      \
    case mr:                                                                                               \
        if (two) tile_wide(mr, 1, type, xm, a, b, K, oa, oa + cols[p + 1] - cols[p], N, ma, mb, na, nb);    \
        else tile_wide(mr, 0, type, xm, a, a, K, oa, oa, N, ma, ma, na, nb);                               \
        break;

/* Panels [p0, p1) of `type` (a constant where it is called), two at a time, times every row of x,
 * in blocks of MC rows: the block's first tile of a pair asks for the next pair. */
static inline AVX512F32 __attribute__((always_inline)) void wide_range_of(int type, const float *x, long M, long K,
                                                                        const void *const *panels, const long *cols,
                                                                        const int *widths, float *y, long N, long p0,
                                                                        long p1) {
    for (long m0 = 0; m0 < M; m0 += MC) {
        long m1 = m0 + MC < M ? m0 + MC : M;
        for (long p = p0; p < p1; p += 2) {
            int two = p + 1 < p1;
            const void *a = panels[p], *b = two ? panels[p + 1] : a;
            __mmask16 ma = width_mask(widths[p]), mb = two ? width_mask(widths[p + 1]) : 0;
            for (long m = m0; m < m1; m += MRF) {
                const float *xm = x + m * K;
                const char *na = NULL, *nb = NULL;
                float *oa = y + m * N + cols[p];
                if (m == m0 && p + 2 < p1) {
                    na = panels[p + 2];
                    nb = panels[p + 3 < p1 ? p + 3 : p + 2];
                }
                switch (m1 - m < MRF ? (int)(m1 - m) : MRF) {
                    TILE_WIDE(12) TILE_WIDE(11) TILE_WIDE(10) TILE_WIDE(9) TILE_WIDE(8) TILE_WIDE(7)
                    TILE_WIDE(6) TILE_WIDE(5) TILE_WIDE(4) TILE_WIDE(3) TILE_WIDE(2) TILE_WIDE(1)
                }
            }
        }
    }
}

static AVX512F32 void wide_range(int type, const float *x, long M, long K, const void *const *panels,
                                 const long *cols, const int *widths, float *y, long N, long p0, long p1) {
    if (type == F32) wide_range_of(F32, x, M, K, panels, cols, widths, y, N, p0, p1);
    else if (type == BF16) wide_range_of(BF16, x, M, K, panels, cols, widths, y, N, p0, p1);
    else wide_range_of(F16, x, M, K, panels, cols, widths, y, N, p0, p1);
}

static int widens(int type, long M) { return type != F32 && M >= WIDEN_FROM; }

/* x [M, K] of x_type (F32 or BF16) as the kernel for `type` panels reads it: bf16 for pairs, f32
 * otherwise. Returns x itself, or a copy in *scratch, which the caller frees; NULL if out of memory. */
static const void *linear_input(int type, int x_type, const void *x, long M, long K, void **scratch) {
    int pairs = linnet_panel_pairs(type, K);
    long count = M * K;
    *scratch = NULL;
    if (x_type == (pairs ? BF16 : F32))
        return x;
    if (!(*scratch = malloc(count * (pairs ? 2 : 4))))
        return NULL;
    if (pairs)
        round_to_bf16(x, count, *scratch);
    else
        for (long i = 0; i < count; i++) /* bf16 to f32: exact */
            ((uint32_t *)*scratch)[i] = (uint32_t)((const uint16_t *)x)[i] << 16;
    return *scratch;
}

/* Whether bf16 pairs of this K over M rows take AMX tiles here. */
static int takes_amx(int type, long M, long K) {
    return linnet_panel_pairs(type, K) && M >= AMX_FROM && K % AMX_K == 0 && linnet_isa() >= ISA_AMX;
}

/* Panels [p0, p1) times every row of x into y [M, N]: f32 sums, or, where the kernel rounds
 * as it stores (`takes_amx`), y_type. -1 if out of memory. */
static int panels_into(int type, const void *x, long M, long K, const void *const *panels, const long *cols,
                       const int *widths, int y_type, void *y, long N, long p0, long p1) {
    if (takes_amx(type, M, K))
        return amx_range(x, M, K, panels, cols, widths, y_type, y, N, p0, p1);
    if (linnet_panel_pairs(type, K)) {
        pair_range(x, M, K, panels, cols, widths, y, N, p0, p1);
        return 0;
    }
    if (linnet_isa() >= ISA_AVX512 && M >= WIDE_FROM) {
        wide_range(type, x, M, K, panels, cols, widths, y, N, p0, p1);
        return 0;
    }
    float *wide = widens(type, M) ? (float *)malloc(K * NR * sizeof(float)) : NULL;
    if (widens(type, M) && !wide)
        return -1;
    panel_range(type, x, M, K, panels, cols, widths, y, N, p0, p1, wide);
    free(wide);
    return 0;
}

/* Columns of panels [p0, p1) of y [M, N] f32 rounded into out, of out_type. */
static AVX2 void round_columns(const float *y, long M, long N, const long *cols, const int *widths, long p0, long p1,
                               int out_type, void *out) {
    for (long p = p0; p < p1; p++)
        for (long m = 0; m < M; m++) {
            long at = m * N + cols[p], j = 0;
            for (; j + 8 <= widths[p]; j += 8)
                store8(out, out_type, at + j, _mm256_loadu_ps(y + at + j));
            for (; j < widths[p]; j++)
                store1(out, out_type, at + j, y[at + j]);
        }
}

/* One linnet_linear call, for its chunks: runs of panels, each also rounding its own columns. */
struct linear_job {
    int type, direct, y_type;
    const void *x;
    long M, K, N, P;
    const void *const *panels;
    const long *cols;
    const int *widths;
    float *sums;
    void *y;
};

static int linear_chunk(void *data, long c, long chunks) {
    struct linear_job *t = data;
    long p0 = t->P * c / chunks, p1 = t->P * (c + 1) / chunks;
    int failed = panels_into(t->type, t->x, t->M, t->K, t->panels, t->cols, t->widths, t->direct ? t->y_type : F32,
                             t->sums, t->N, p0, p1);
    if (!t->direct)
        round_columns(t->sums, t->M, t->N, t->cols, t->widths, p0, p1, t->y_type, t->y);
    return failed;
}

/* y [M, N] (y_type: F32, BF16 or F16) = x [M, K] (f32 or bf16: x_type) times P panels of `type`:
 * panel p is K rows of 16 values and gives y's columns cols[p] .. cols[p] + widths[p]. The panels
 * of several weights (a fused group) can be listed together: their outputs land side by side, in
 * one pass over x. Sums are f32's, rounded once to y_type. The work goes to `run` on `pool` (of
 * `threads` threads: pool.c's, or XLA's) in equal runs of panels, one a thread: claimed
 * dynamically, four each ran SmolLM2's JAX load 4-5% slower (bf16 539 -> 560, f32 211 -> 222
 * tokens/s, medians of four alternating runs on 2 cores). Returns -1 if out of memory. */
int linnet_linear_run(linnet_runner run, void *pool, long threads, int type, int x_type, const void *x, long M,
                      long K, long P, const void *const *panels, const long *cols, const int *widths, int y_type,
                      void *y, long N) {
    if (M == 0 || P == 0)
        return 0;
    void *scratch;
    const void *input = linear_input(type, x_type, x, M, K, &scratch);
    /* f32 sums, rounded to y_type after, unless the kernel rounds as it stores */
    int direct = y_type == F32 || takes_amx(type, M, K);
    float *sums = direct ? (float *)y : (float *)malloc(M * N * sizeof(float));
    int status = -1;
    if (input && sums) {
        struct linear_job job = {type, direct, y_type, input, M, K, N, P, panels, cols, widths, sums, y};
        status = run(pool, linear_chunk, &job, P < threads ? P : threads);
    }
    free(scratch);
    if (!direct)
        free(sums);
    return status ? -1 : 0;
}

/* linnet_linear_run on `threads` threads of pool.c's. */
int linnet_linear(int type, int x_type, const void *x, long M, long K, long P, const void *const *panels,
                  const long *cols, const int *widths, int y_type, void *y, long N, int threads) {
    return linnet_linear_run(linnet_on_threads, &threads, threads, type, x_type, x, M, K, P, panels, cols, widths,
                             y_type, y, N);
}

#define TRANSPOSE(E, column)                                          \
    for (long k = 0; k < K; k++)                                      \
        for (int r = 0; r < NR; r++)                                  \
            ((E *)dst)[k * NR + r] = ((const E *)block)[(column) * K + k]

/* Pair-row j of a panel: column r's values at K = 2j and 2j + 1, side by side. */
#define PAIR_UP()                                                                   \
    for (long k = 0; k < K; k++)                                                    \
        for (int r = 0; r < NR; r++)                                                \
            ((uint16_t *)dst)[(k / 2) * 2 * NR + 2 * r + k % 2] = ((const uint16_t *)block)[r * K + k]

/* In place: each of the N / 16 blocks of 16 rows of w [N, K] of `type` becomes its panel, K rows
 * of 16 (bf16's in BF16_PLACES' order, or in pairs of K: linnet_panel_pairs), through a
 * block-sized buffer a thread. */
int linnet_pack_panels(int type, void *w, long N, long K, int threads) {
    long blocks = N / NR, bytes = NR * K * type_bytes(type);
    int pairs = linnet_panel_pairs(type, K);
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        char *block = (char *)malloc(bytes);
        if (!block) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (long b = 0; b < blocks; b++) {
            if (!block) continue;
            char *dst = (char *)w + b * bytes;
            memcpy(block, dst, bytes);
            if (type == F32) TRANSPOSE(uint32_t, r);
            else if (pairs) PAIR_UP();
            else if (type == BF16) TRANSPOSE(uint16_t, BF16_PLACES[r]);
            else TRANSPOSE(uint16_t, r);
        }
        free(block);
    }
    return failed ? -1 : 0;
}
