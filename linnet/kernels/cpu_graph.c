/* A decode step on the CPU replayed as one call: the kernel calls a step made, recorded once with
 * their arguments (cpu_graph.py), run again in order. The CPU's counterpart of a CUDA graph: the
 * step's tensors keep their addresses, the inputs are copied into the captured ones, and what
 * each kernel reads that changes from step to step (tokens, positions) it reads from memory.
 *
 * Each kernel has a task here that takes its arguments as one array of 64-bit words, in the
 * order the kernel takes them (floats as their bits, pointers as addresses), so the replay can
 * call any of them through one pointer type.
 */
#include <stdint.h>
#include <string.h>

#include "kernels.h"

typedef int (*linnet_task)(const int64_t *a);

#define P(i) ((void *)(intptr_t)a[i])

static float as_float(int64_t word) {
    float f;
    uint32_t bits = (uint32_t)word;
    memcpy(&f, &bits, 4);
    return f;
}

int linnet_task_linear(const int64_t *a) {
    return linnet_linear((int)a[0], (int)a[1], P(2), a[3], a[4], a[5], P(6), P(7), P(8), (int)a[9], P(10), a[11],
                         (int)a[12]);
}

int linnet_task_qlinear(const int64_t *a) {
    return linnet_qlinear((int)a[0], (int)a[1], P(2), a[3], a[4], a[5], P(6), P(7), P(8), (int)a[9], P(10), a[11],
                          (int)a[12]);
}

int linnet_task_qgather(const int64_t *a) {
    return linnet_qgather((int)a[0], a[1], a[2], P(3), a[4], P(5), a[6], (int)a[7], (int)a[8], P(9), (int)a[10]);
}

int linnet_task_attention(const int64_t *a) {
    return linnet_attention((int)a[0], (int)a[1], P(2), a[3], a[4], a[5], a[6], P(7), P(8), a[9], a[10], a[11], a[12],
                            P(13), P(14), a[15], P(16), as_float(a[17]), as_float(a[18]), P(19), (int)a[20]);
}

int linnet_task_rmsnorm(const int64_t *a) {
    linnet_rmsnorm((int)a[0], P(1), a[2], a[3], a[4], (int)a[5], P(6), as_float(a[7]), (int)a[8], P(9), (int)a[10]);
    return 0;
}

int linnet_task_layer_norm(const int64_t *a) {
    linnet_layer_norm((int)a[0], P(1), a[2], a[3], a[4], (int)a[5], P(6), P(7), as_float(a[8]), P(9), (int)a[10]);
    return 0;
}

int linnet_task_rope(const int64_t *a) {
    linnet_rope((int)a[0], P(1), a[2], a[3], a[4], a[5], a[6], P(7), P(8), a[9], P(10), (int)a[11]);
    return 0;
}

int linnet_task_put_rows(const int64_t *a) {
    linnet_put_rows((int)a[0], P(1), a[2], P(3), a[4], a[5], P(6), a[7], a[8], a[9], (int)a[10], P(11), a[12],
                    a[13], (int)a[14]);
    return 0;
}

int linnet_task_elementwise(const int64_t *a) {
    linnet_elementwise((int)a[0], (int)a[1], P(2), a[3], (int)a[4], P(5), a[6], (int)a[7], P(8), a[9], a[10], a[11],
                       (int)a[12]);
    return 0;
}

int linnet_task_gather_rows(const int64_t *a) {
    linnet_gather_rows((int)a[0], P(1), a[2], a[3], P(4), a[5], (int)a[6], P(7), (int)a[8]);
    return 0;
}

/* Runs tasks[0 .. count) on their arguments in order; returns -1, or the index of the first that
 * failed (out of memory), where the replay stopped. */
long linnet_replay(long count, const linnet_task *tasks, const int64_t *const *args) {
    for (long i = 0; i < count; i++)
        if (tasks[i](args[i]))
            return i;
    return -1;
}
