/* Time of a batch of small objects built and torn down through whatever
 * malloc the process has (LD_PRELOAD): `clear_batch SIZE N` runs N rounds
 * of 14 blocks of SIZE bytes, each cleared with the C library's memset
 * right after malloc and linked into a list, then freed from the list's
 * head (the reverse of allocation order), and prints the mean ns per
 * malloc/memset/free. With glibc on an AVX-512 machine, memset clears a
 * block under 64 bytes with one masked 64-byte store; the allocator's
 * next malloc must not have to read memory under that store (the link of
 * the adjacent block), or it waits until the store reaches the cache.
 * scripts/pair-time.sh runs it (BENCH=clear_batch) for every allocator,
 * interleaved. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BATCH 14

int main(int argc, char **argv) {
    volatile size_t size = argc > 1 ? (size_t)atol(argv[1]) : 48;
    long n = argc > 2 ? atol(argv[2]) : 1000000;
    if (size < sizeof(void *)) size = sizeof(void *);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long round = 0; round < n; round++) {
        void *head = NULL;
        for (int k = 0; k < BATCH; k++) {
            size_t s = size; /* volatile: memset is called, not inlined */
            void **q = malloc(s);
            if (!q) return 1;
            memset(q, 0, s);
            *q = head;
            head = q;
        }
        while (head) {
            void *next = *(void **)head;
            free(head);
            head = next;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ns = (double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec);
    printf("%.2f\n", ns / (double)n / BATCH);
    return 0;
}
