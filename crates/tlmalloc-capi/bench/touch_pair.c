/* Time of a malloc/touch/free pair through whatever malloc the process has
 * (LD_PRELOAD): `touch_pair SIZE N` runs N iterations of p = malloc(SIZE);
 * p[0] = 1; free(p) and prints the mean ns per pair. The loop is bound by
 * the latency of the allocator's loads and stores (the same block comes
 * back every time), so it shows what instruction counts do not: a long
 * dependency chain, or a load held back as possibly aliasing a store.
 * scripts/pair-time.sh runs it for every allocator, interleaved. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int main(int argc, char **argv) {
    size_t size = argc > 1 ? (size_t)atol(argv[1]) : 64;
    long n = argc > 2 ? atol(argv[2]) : 20000000;
    for (int i = 0; i < 100; i++) free(malloc(size)); /* the thread's heap is set up */
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++) {
        volatile char *p = malloc(size);
        if (!p) return 1;
        p[0] = 1;
        free((void *)p);
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ns = (double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec);
    printf("%.2f\n", ns / (double)n);
    return 0;
}
