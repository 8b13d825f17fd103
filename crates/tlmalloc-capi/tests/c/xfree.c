/* Cross-thread frees: producers allocate and fill blocks, consumers check
 * and free (or realloc, then free) them. Memory freed by other threads must
 * be reused: resident memory is checked at the end. Prints "xfree ok". */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rss.h"

#define PRODUCERS 3
#define CONSUMERS 3
#define RING 4096

static void *ring[RING];
static size_t ring_size[RING];
static unsigned head, tail;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t not_full = PTHREAD_COND_INITIALIZER, not_empty = PTHREAD_COND_INITIALIZER;
static int producers_left = PRODUCERS;
static long per_producer;
static volatile long consumed, bad;

static void *producer(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg;
    for (long i = 0; i < per_producer; i++) {
        seed = seed * 1103515245 + 12345;
        unsigned r = seed >> 8;
        size_t n = r % 64 == 0 ? 150000 + r % 500000 : 1 + r % (r % 8 == 0 ? 16384 : 512);
        unsigned char *p = malloc(n);
        if (!p) abort();
        memset(p, (int)(n & 0xff), n < 256 ? n : 256);
        pthread_mutex_lock(&lock);
        while (head - tail == RING) pthread_cond_wait(&not_full, &lock);
        ring[head % RING] = p;
        ring_size[head % RING] = n;
        head++;
        pthread_cond_signal(&not_empty);
        pthread_mutex_unlock(&lock);
    }
    pthread_mutex_lock(&lock);
    producers_left--;
    pthread_cond_broadcast(&not_empty);
    pthread_mutex_unlock(&lock);
    return NULL;
}

static void *consumer(void *arg) {
    int realloc_some = (int)(uintptr_t)arg;
    for (;;) {
        pthread_mutex_lock(&lock);
        while (head == tail && producers_left > 0) pthread_cond_wait(&not_empty, &lock);
        if (head == tail) {
            pthread_mutex_unlock(&lock);
            return NULL;
        }
        unsigned char *p = ring[tail % RING];
        size_t n = ring_size[tail % RING];
        tail++;
        pthread_cond_signal(&not_full);
        pthread_mutex_unlock(&lock);
        size_t check = n < 256 ? n : 256;
        for (size_t i = 0; i < check; i++)
            if (p[i] != (unsigned char)(n & 0xff)) {
                __atomic_fetch_add(&bad, 1, __ATOMIC_RELAXED);
                break;
            }
        if (realloc_some && (n & 3) == 0) {
            p = realloc(p, n * 2 + 1);
            if (!p || p[0] != (unsigned char)(n & 0xff)) __atomic_fetch_add(&bad, 1, __ATOMIC_RELAXED);
        }
        free(p);
        __atomic_fetch_add(&consumed, 1, __ATOMIC_RELAXED);
    }
}

int main(int argc, char **argv) {
    per_producer = argc > 1 ? atol(argv[1]) : 200000;
    size_t rss_start = rss_kib();
    pthread_t p[PRODUCERS], c[CONSUMERS];
    for (int i = 0; i < CONSUMERS; i++) pthread_create(&c[i], NULL, consumer, (void *)(uintptr_t)(i == 0));
    for (int i = 0; i < PRODUCERS; i++) pthread_create(&p[i], NULL, producer, (void *)(uintptr_t)(i + 1));
    for (int i = 0; i < PRODUCERS; i++) pthread_join(p[i], NULL);
    for (int i = 0; i < CONSUMERS; i++) pthread_join(c[i], NULL);
    size_t rss_end = rss_kib();
    printf("consumed %ld of %ld, rss %zu -> %zu KiB\n", consumed, per_producer * PRODUCERS, rss_start, rss_end);
    if (bad || consumed != per_producer * PRODUCERS) {
        fprintf(stderr, "xfree: %ld corrupted blocks\n", bad);
        return 1;
    }
    /* At most RING blocks are in flight (~4096 * 20 KiB average worst case);
     * without reuse of remotely freed blocks this would be gigabytes. */
    if (rss_end > rss_start + 512 * 1024) {
        fprintf(stderr, "xfree: resident memory grew to %zu KiB\n", rss_end);
        return 1;
    }
    printf("xfree ok\n");
    return 0;
}
