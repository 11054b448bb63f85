/* Linnet's CPU linear kernel: what cpu_linear.c exports, for its XLA handler (xla_linear.c). */
#ifndef LINNET_CPU_LINEAR_H
#define LINNET_CPU_LINEAR_H

#include <stdatomic.h>

/* One product split in chunks of panels that any thread may claim (see linnet_chunks). */
struct linnet_job {
    int type; /* 0 f32, 1 bf16, 2 f16 */
    const float *x;
    long M, K, P, N;
    const void *const *panels;
    const long *cols;
    const int *widths;
    float *y;
    long chunks;
    atomic_long next, done;
    atomic_int refs, failed;
};

int linnet_cpu_supported(void);
int linnet_linear(int type, const float *x, long M, long K, long P, const void *const *panels, const long *cols,
                  const int *widths, float *y, long N, int threads);
void linnet_chunks(struct linnet_job *job);
void linnet_release(struct linnet_job *job);
int linnet_pack_panels(int elem, void *w, long N, long K, int threads);

#endif
