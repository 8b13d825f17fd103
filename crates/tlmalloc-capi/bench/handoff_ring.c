/* Producer/consumer hand-off through whatever malloc the process has
 * (LD_PRELOAD): one thread mallocs SIZE bytes (default 64), writes a byte
 * and hands the block through a spinning ring of 8192 slots; the other
 * reads it and frees it, so every free is a remote (cross-thread) free.
 * Prints the slowest malloc in TSC cycles, how many mallocs took over
 * 20 000 cycles (a multi-microsecond stall: a refill that walked a long
 * remote-free list, a mapping, a preemption) and the ns per block.
 *
 *   cc -O2 -pthread -o /tmp/handoff crates/tlmalloc-capi/bench/handoff_ring.c
 *   LD_PRELOAD=target/release/libtlmalloc.so /tmp/handoff [SIZE]
 *
 * Both threads spin: on a shared 2-core machine the ns per block swings
 * 10x with the host's load, so compare interleaved runs by their median;
 * the count of slow mallocs is the steadier figure. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <x86intrin.h>

#define RING 8192
#define BLOCKS 20000000L

static void *ring[RING];
static _Atomic long head, tail;
static size_t size = 64;
static unsigned long long slowest, stalls;

static void *producer(void *arg) {
    (void)arg;
    for (long i = 0; i < BLOCKS; i++) {
        unsigned long long t0 = __rdtsc();
        char *p = malloc(size);
        unsigned long long cycles = __rdtsc() - t0;
        if (cycles > slowest) slowest = cycles;
        if (cycles > 20000) stalls++;
        p[0] = (char)i;
        while (i - atomic_load_explicit(&tail, memory_order_acquire) >= RING) {
        }
        ring[i % RING] = p;
        atomic_store_explicit(&head, i + 1, memory_order_release);
    }
    return NULL;
}

static void *consumer(void *arg) {
    long sum = 0;
    (void)arg;
    for (long i = 0; i < BLOCKS; i++) {
        while (atomic_load_explicit(&head, memory_order_acquire) <= i) {
        }
        char *p = ring[i % RING];
        sum += p[0];
        free(p);
        atomic_store_explicit(&tail, i + 1, memory_order_release);
    }
    return (void *)sum;
}

int main(int argc, char **argv) {
    if (argc > 1) size = (size_t)atol(argv[1]);
    struct timespec t0, t1;
    pthread_t a, b;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pthread_create(&a, NULL, producer, NULL);
    pthread_create(&b, NULL, consumer, NULL);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ns = (t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec);
    printf("slowest malloc %llu cycles, mallocs over 20k cycles %llu, %.1f ns per block\n",
           slowest, stalls, ns / BLOCKS);
    return 0;
}
