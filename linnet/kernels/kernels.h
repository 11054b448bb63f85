/* What Linnet's CPU kernels export: for their Python callers (ctypes) and their XLA handlers. */
#ifndef LINNET_KERNELS_H
#define LINNET_KERNELS_H

#include <stdint.h>

/* cpu_linear.c */
int linnet_cpu_supported(void);
int linnet_linear(int type, const float *x, long M, long K, long P, const void *const *panels, const long *cols,
                  const int *widths, float *y, long N, int threads);
int linnet_linear_panels(int type, const float *x, long M, long K, const void *const *panels, const long *cols,
                         const int *widths, float *y, long N, long p0, long p1);
int linnet_pack_panels(int elem, void *w, long N, long K, int threads);

/* cpu_attention.c */
int linnet_attention(int type, const float *q, long n, long H, long KVH, long D, const void *k, const void *v,
                     long row_stride, long pos_stride, long batch, long max_seq, const int32_t *rows,
                     const int32_t *positions, long window, const float *sinks, float scale, float *out, int threads);
int linnet_attention_tokens(int type, const float *q, long H, long KVH, long D, const void *k, const void *v,
                            long row_stride, long pos_stride, long batch, long max_seq, const int32_t *rows,
                            const int32_t *positions, long window, const float *sinks, float scale, float *out,
                            long i0, long i1);

#endif
