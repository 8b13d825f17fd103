/* Producer/consumer hand-off in batches through whatever malloc the process
 * has (LD_PRELOAD): one thread mallocs 4,096 blocks of SIZE bytes and writes
 * a byte of each, the other frees them all, double-buffered, ROUNDS times.
 * Every free is a remote (cross-thread) free, and consecutive ones fall in
 * the same page, so this shows what a remote free costs the freeing thread
 * (unlike handoff_ring.c, which is bound by its ring's cache line).
 * Prints the ns per block.
 *
 *   cc -O2 -pthread -o /tmp/handoff_batch crates/tlmalloc-capi/bench/handoff_batch.c
 *   LD_PRELOAD=target/release/libtlmalloc.so /tmp/handoff_batch 1000 64 [CONSUMER_MALLOCS]
 *
 * With CONSUMER_MALLOCS = 1 the consumer mallocs (and frees) one block
 * before it starts; by default it never mallocs, as a C consumer thread
 * need not. On a shared 2-core machine compare interleaved runs by their
 * median. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define N 4096

static void *blocks[2][N];
static atomic_int ready[2], freed[2];
static int rounds, consumer_mallocs;
static size_t size;

static void *consumer(void *arg) {
    (void)arg;
    if (consumer_mallocs) {
        void *volatile q = malloc(8);
        free(q);
    }
    for (int r = 0; r < rounds; r++) {
        int b = r & 1;
        while (atomic_load_explicit(&ready[b], memory_order_acquire) != r + 1) {
        }
        for (int i = 0; i < N; i++) free(blocks[b][i]);
        atomic_store_explicit(&freed[b], r + 1, memory_order_release);
    }
    return NULL;
}

int main(int argc, char **argv) {
    rounds = argc > 1 ? atoi(argv[1]) : 1000;
    size = argc > 2 ? (size_t)atol(argv[2]) : 64;
    consumer_mallocs = argc > 3 ? atoi(argv[3]) : 0;
    pthread_t t;
    if (pthread_create(&t, NULL, consumer, NULL) != 0) return 1;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int r = 0; r < rounds; r++) {
        int k = r & 1;
        if (r >= 2)
            while (atomic_load_explicit(&freed[k], memory_order_acquire) != r - 1) {
            }
        for (int i = 0; i < N; i++) {
            char *p = malloc(size);
            if (!p) return 1;
            p[0] = (char)i;
            blocks[k][i] = p;
        }
        atomic_store_explicit(&ready[k], r + 1, memory_order_release);
    }
    pthread_join(t, NULL);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ns = (double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec);
    printf("%.2f\n", ns / ((double)rounds * N));
    return 0;
}
