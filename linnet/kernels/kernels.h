/* What Linnet's CPU kernels export, for their Python callers (ctypes) and their XLA handlers, and
 * what the kernels share: the weight / cache types and how one is widened to f32. */
#ifndef LINNET_KERNELS_H
#define LINNET_KERNELS_H

#include <immintrin.h>
#include <stdint.h>

/* Kernels carry target attributes, not global -m flags: linnet_cpu_supported() runs on any x86-64. */
#define AVX2 __attribute__((target("avx2,fma,f16c")))

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

/* cpu_linear.c */
int linnet_cpu_supported(void);
int linnet_panel_pairs(int type, long K);
const void *linnet_linear_input(int type, int x_type, const void *x, long M, long K, void **scratch);
int linnet_linear(int type, int x_type, const void *x, long M, long K, long P, const void *const *panels,
                  const long *cols, const int *widths, float *y, long N, int threads);
int linnet_linear_panels(int type, const void *x, long M, long K, const void *const *panels, const long *cols,
                         const int *widths, float *y, long N, long p0, long p1);
int linnet_pack_panels(int type, void *w, long N, long K, int threads);

/* cpu_attention.c */
int linnet_attention(int type, const float *q, long n, long H, long KVH, long D, const void *k, const void *v,
                     long row_stride, long pos_stride, long batch, long max_seq, const int32_t *rows,
                     const int32_t *positions, long window, const float *sinks, float scale, float *out, int threads);
int linnet_attention_units(int type, const float *q, long H, long KVH, long D, const void *k, const void *v,
                           long row_stride, long pos_stride, long batch, long max_seq, const int32_t *rows,
                           const int32_t *positions, long window, const float *sinks, float scale, float *out,
                           long u0, long u1);
void linnet_attention_prefetch(int type, long KVH, long D, const void *k, const void *v, long row_stride,
                               long pos_stride, long batch, long max_seq, const int32_t *rows,
                               const int32_t *positions, long window, long n);

#endif
