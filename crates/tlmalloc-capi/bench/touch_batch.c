/* Batch mode through whatever malloc the process has (LD_PRELOAD):
 * `touch_batch SIZE N [BATCH]` runs N rounds of BATCH (default 64) mallocs
 * of SIZE bytes, each touched at its first and last byte, then frees them
 * all in allocation order, and prints the mean ns per malloc/touch/free.
 * Unlike touch_pair.c, whose loop gets the same block back every time,
 * each round needs BATCH blocks at once, so a round crosses pages (and at
 * medium sizes several of them) in both directions: the refill and the
 * release paths, not only the lists' heads. scripts/pair-time.sh runs it
 * (BENCH=touch_batch) for every allocator, interleaved. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define BATCH_MAX 4096

int main(int argc, char **argv) {
    size_t size = argc > 1 ? (size_t)atol(argv[1]) : 4096;
    long n = argc > 2 ? atol(argv[2]) : 100000;
    int batch = argc > 3 ? atoi(argv[3]) : 64;
    static char *blocks[BATCH_MAX];
    if (size < 1) size = 1;
    if (batch < 1 || batch > BATCH_MAX) batch = 64;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long round = 0; round < n; round++) {
        for (int k = 0; k < batch; k++) {
            char *q = malloc(size);
            if (!q) return 1;
            q[0] = (char)k;
            q[size - 1] = (char)round;
            blocks[k] = q;
        }
        for (int k = 0; k < batch; k++) free(blocks[k]);
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ns = (double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec);
    printf("%.2f\n", ns / (double)n / batch);
    return 0;
}
