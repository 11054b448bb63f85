/* What Linnet's CPU kernels export, for their Python callers (ctypes) and their XLA handlers, and
 * what the kernels share: the weight / cache types and how one is widened to f32. */
#ifndef LINNET_KERNELS_H
#define LINNET_KERNELS_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

/* Kernels carry target attributes, not global -m flags: linnet_cpu_supported() runs on any x86-64. */
#define AVX2 __attribute__((target("avx2,fma,f16c")))
/* AVX-512 BF16's instructions (VDPBF16PS), where `linnet_isa()` is ISA_AVX512_BF16 or more. */
#define AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")))

enum { F32 = 0, BF16 = 1, F16 = 2 }; /* the type codes callers pass */

static inline long type_bytes(int type) { return type == F32 ? 4 : 2; }

/* Elements i .. i + 7 of an array of `type` as eight f32: bf16 is f32's high half (widen and
 * shift), f16 goes through F16C. */
static inline AVX2 __attribute__((always_inline)) __m256 load8(const void *p, int type, long i) {
    if (type == F32)
        return _mm256_loadu_ps((const float *)p + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
    if (type == BF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

/* The sum of eight floats' lanes. */
static inline AVX2 __attribute__((always_inline)) float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* Element i of an array of `type` as f32, and set to f (rounded): load8 and store8 one at a time. */
static inline AVX2 float load1(const void *p, int type, long i) {
    if (type == F32)
        return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    if (type == F16)
        return _cvtsh_ss(h);
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline AVX2 void store1(void *p, int type, long i, float f) {
    if (type == F32) {
        ((float *)p)[i] = f;
        return;
    }
    if (type == F16) {
        ((uint16_t *)p)[i] = _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
        return;
    }
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN stays NaN (quiet), whatever its low bits */
        u = (u >> 16 | 0x40u) << 16;
    else
        u += 0x7fffu + ((u >> 16) & 1u);
    ((uint16_t *)p)[i] = (uint16_t)(u >> 16);
}

/* f rounded to `type` and back: the value a tensor of that type holds. */
static inline AVX2 float round_to(int type, float f) {
    if (type == F32)
        return f;
    uint16_t h;
    store1(&h, type, 0, f);
    return load1(&h, type, 0);
}

/* Eight f32 rounded to bf16 (nearest, ties to even; NaN kept quiet), still as f32 bit patterns
 * whose low halves are zero. */
static inline AVX2 __attribute__((always_inline)) __m256i bf16_bits8(__m256 v) {
    __m256i u = _mm256_castps_si256(v);
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i rounded = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd));
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                     _mm256_set1_epi32(0x7f800000));
    rounded = _mm256_blendv_epi8(rounded, _mm256_or_si256(u, _mm256_set1_epi32(0x400000)), nan);
    return _mm256_and_si256(rounded, _mm256_set1_epi32((int)0xffff0000u));
}

static inline AVX2 __attribute__((always_inline)) __m256 round8(int type, __m256 v) {
    if (type == BF16)
        return _mm256_castsi256_ps(bf16_bits8(v));
    if (type == F16)
        return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    return v;
}

/* Elements i .. i + 7 of an array of `type` set to v, rounded (load8's inverse). */
static inline AVX2 __attribute__((always_inline)) void store8(void *p, int type, long i, __m256 v) {
    if (type == F32) {
        _mm256_storeu_ps((float *)p + i, v);
        return;
    }
    __m128i h;
    if (type == F16) {
        h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
    } else {
        __m256i top = _mm256_srli_epi32(bf16_bits8(v), 16);
        h = _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(top, top), 0x08));
    }
    _mm_storeu_si128((__m128i *)((uint16_t *)p + i), h);
}

/* e^x of eight floats, for the softmax (x <= 0 there) and SiLU (x <= 88): x = n ln2 + r with |r| <= ln2 / 2, e^r by
 * Cephes' polynomial (within 2 ulp of expf), 2^n put into the exponent bits. x below -87 (e^x
 * under f32's normal range) is taken as -87: about 1e-38, where a softmax weight is 0. */
static inline AVX2 __attribute__((always_inline)) __m256 exp8(__m256 x) {
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

/* tanh of eight, as Cephes' tanhf (within 4 ulp of tanh: tests against f64): below |x| = 0.625 an odd polynomial
 * (1 - e^-2|x| would cancel there), above 1 - 2 / (e^2|x| + 1), each with x's sign; e^2|x| taken at
 * most at 88 (tanh is 1 in f32 from |x| = 9); a NaN stays NaN. Attention's soft cap (cpu_attention.c) and the
 * replayed step's TANH (cpu_ops.c); libm's tanhf, one score at a time, made a 16-row layer's attention at
 * position 1000 4.5x as slow. */
static inline AVX2 __attribute__((always_inline)) __m256 tanh8(__m256 x) {
    __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
    __m256 ax = _mm256_andnot_ps(sign, x);
    __m256 e = exp8(_mm256_min_ps(_mm256_add_ps(ax, ax), _mm256_set1_ps(88.0f)));
    __m256 large = _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, one)));
    __m256 z = _mm256_mul_ps(x, x), p = _mm256_set1_ps(-5.70498872745e-3f);
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(2.06390887954e-2f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-5.37397155531e-2f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(1.33314422036e-1f));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-3.33332819422e-1f));
    __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(p, z), x, x);
    __m256 t = _mm256_blendv_ps(large, small, _mm256_cmp_ps(ax, _mm256_set1_ps(0.625f), _CMP_LT_OQ));
    t = _mm256_or_ps(_mm256_andnot_ps(sign, t), _mm256_and_ps(sign, x)); /* x's sign, -0 at -0 too */
    return _mm256_blendv_ps(t, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

/* pool.c: work(task, c, chunks) for each chunk c < chunks, on the calling thread and up to
 * threads - 1 helpers; returns once all are done: -1 if out of memory, -2 if a chunk returned
 * nonzero. */
typedef int (*linnet_work)(void *task, long chunk, long chunks);
int linnet_parallel(linnet_work work, void *task, long chunks, int threads);
/* A job, for a caller with a pool of its own (XLA's): made with one reference, the caller's;
 * shared once for each helper it schedules, each of which calls linnet_job_help; the caller then
 * calls linnet_job_finish, which claims chunks too and returns once all are done, as above. */
struct linnet_job;
struct linnet_job *linnet_job_new(linnet_work work, void *task, long chunks);
void linnet_job_share(struct linnet_job *job);
void linnet_job_help(struct linnet_job *job);
int linnet_job_finish(struct linnet_job *job);
/* Runs work's chunks on `pool` (linnet_parallel's threads or XLA's), as linnet_parallel does;
 * linnet_on_threads is linnet_parallel's, its pool an int: how many threads. */
typedef int (*linnet_runner)(void *pool, linnet_work work, void *task, long chunks);
int linnet_on_threads(void *threads, linnet_work work, void *task, long chunks);

/* cpu_linear.c */
int linnet_cpu_supported(void);
/* The instruction sets the kernels take here, each level holding the ones below it: the CPU's (with
 * AMX, Linux's leave to use its tiles), capped by LINNET_CPU_ISA ("avx2", "avx512", "avx512_bf16"),
 * so that the paths an older CPU takes run, and are tested, on a newer one. */
enum { ISA_NONE = 0, ISA_AVX2 = 1, ISA_AVX512 = 2, ISA_AVX512_BF16 = 3, ISA_AMX = 4 };
int linnet_isa(void);
int linnet_panel_pairs(int type, long K);
int linnet_linear(int type, int x_type, const void *x, long M, long K, long P, const void *const *panels,
                  const long *cols, const int *widths, int y_type, void *y, long N, int threads);
int linnet_linear_run(linnet_runner run, void *pool, long threads, int type, int x_type, const void *x, long M,
                      long K, long P, const void *const *panels, const long *cols, const int *widths, int y_type,
                      void *y, long N);
int linnet_pack_panels(int type, void *w, long N, long K, int threads);

/* cpu_qlinear.c: a GGUF's Q8_0 / Q4_1 / Q5_0 / Q4_K / Q5_K / Q6_K / IQ4_NL weights in their blocks (type codes:
 * GGML's own; Q4_0's are repacked as Q4_K's, Q5_1's as Q5_K's, Q3_K's as Q6_K's, IQ4_XS's as IQ4_NL's) */
enum { QTYPE_Q4_1 = 3, QTYPE_Q5_0 = 6, QTYPE_Q8_0 = 8, QTYPE_Q4_K = 12, QTYPE_Q5_K = 13, QTYPE_Q6_K = 14,
       QTYPE_IQ4_NL = 20 };
long linnet_qpanel_block_bytes(int qtype);
int linnet_qlinear(int qtype, int x_type, const void *x, long M, long K, long P, const void *const *panels,
                   const long *cols, const int *widths, int y_type, void *y, long N, int threads);
int linnet_qgather(int qtype, long K, long P, const void *const *panels, long N, const int32_t *ids, long n,
                   int value_type, int out_type, void *out, int threads);

/* cpu_attention.c */
int linnet_attention(int type, int q_type, const void *q, long n, long H, long KVH, long D, const void *k, const void *v,
                     long row_stride, long pos_stride, long batch, long max_seq, const int32_t *rows,
                     const int32_t *positions, long window, const float *sinks, float scale, float softcap,
                     void *out, int threads);
int linnet_attention_run(linnet_runner run, void *pool, long threads, int type, int q_type, const void *q, long n,
                         long H, long KVH, long D, const void *k, const void *v, long row_stride, long pos_stride,
                         long batch, long max_seq, const int32_t *rows, const int32_t *positions, long window,
                         const float *sinks, float scale, float softcap, void *out);
void linnet_attention_prefetch(int type, long KVH, long D, const void *k, const void *v, long row_stride,
                               long pos_stride, long batch, long max_seq, const int32_t *rows,
                               const int32_t *positions, long window, long n);

/* cpu_ops.c */
enum { OP_ADD = 0, OP_MUL = 1, OP_SILU = 2, OP_COPY = 3, OP_SILU_MUL = 4, OP_GELU_TANH = 5, OP_DIV = 6,
       OP_TANH = 7 }; /* linnet_elementwise's */
void linnet_rmsnorm(int x_type, const void *x, long x_stride, long n, long d, int w_type, const void *w, float eps,
                    int out_type, void *out, int threads);
void linnet_layer_norm(int x_type, const void *x, long x_stride, long n, long d, int w_type, const void *w,
                       const void *b, float eps, void *out, int threads);
void linnet_rope(int type, const void *x, long n, long H, long D, long token_stride, long head_stride,
                 const int32_t *positions, const float *table, long rows, void *out, int threads);
void linnet_put_rows(int state_type, void *state, long offset, const int32_t *a, long a_stride, long a_limit,
                     const int32_t *b, long b_stride, long b_limit, long n, int value_type, const void *value,
                     long value_stride, long block, int threads);
void linnet_elementwise(int op, int type, const void *a, long a_stride, int b_type, const void *b, long b_stride,
                        int out_type, void *out, long out_stride, long rows, long cols, int threads);
void linnet_gather_rows(int type, const void *table, long rows, long width, const int32_t *ids, long n, int out_type,
                        void *out, int threads);

#endif
