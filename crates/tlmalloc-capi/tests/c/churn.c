/* Thread churn: rounds of short-lived threads that allocate, free most of
 * it, and hand a quarter to the next round, where another thread frees it
 * after its owner exited (so its pages were abandoned, and are adopted or
 * released). Nothing is leaked, so memory must stay bounded: the resident
 * set after all rounds is checked against the one after round 20. Prints
 * "churn ok". */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rss.h"

#define THREADS 8
#define BLOCKS 2000

struct work {
    unsigned seed;
    void **inbox;  /* blocks from the previous round, to free */
    void **outbox; /* blocks for the next round */
};

static void *run(void *arg) {
    struct work *w = arg;
    if (w->inbox) {
        for (int i = 0; i < BLOCKS / 4; i++) {
            unsigned char *b = w->inbox[i];
            if (b && b[0] != (unsigned char)i) abort();
            free(b);
        }
        free(w->inbox);
    }
    void *mine[BLOCKS];
    for (int i = 0; i < BLOCKS; i++) {
        w->seed = w->seed * 1103515245 + 12345;
        size_t n = 1 + (w->seed >> 8) % ((w->seed & 0x100) ? 20000 : 600);
        mine[i] = malloc(n);
        memset(mine[i], i, n < 16 ? n : 16);
    }
    w->outbox = malloc(sizeof(void *) * (BLOCKS / 4));
    for (int i = 0; i < BLOCKS; i++) {
        if (i % 4 == 0) {
            unsigned char *b = mine[i];
            b[0] = (unsigned char)(i / 4);
            w->outbox[i / 4] = b;
        } else {
            free(mine[i]);
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 300;
    struct work w[THREADS];
    memset(w, 0, sizeof w);
    size_t rss_early = 0;
    for (int r = 0; r < rounds; r++) {
        pthread_t t[THREADS];
        void **boxes[THREADS];
        for (int i = 0; i < THREADS; i++) boxes[i] = w[i].outbox;
        for (int i = 0; i < THREADS; i++) {
            w[i].seed = (unsigned)(r * THREADS + i + 1);
            w[i].inbox = boxes[(i + 1) % THREADS]; /* another thread's blocks */
            w[i].outbox = NULL;
            if (pthread_create(&t[i], NULL, run, &w[i]) != 0) return 1;
        }
        for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
        if (r == 20) rss_early = rss_kib();
    }
    for (int i = 0; i < THREADS; i++) {
        for (int k = 0; k < BLOCKS / 4; k++) free(w[i].outbox[k]);
        free(w[i].outbox);
    }
    size_t rss_end = rss_kib();
    /* A round keeps about 8 * 500 blocks (~10 MiB) alive into the next one;
     * memory that is never reused would grow by that much every round. */
    size_t limit = rss_early * 2 + 64 * 1024;
    printf("rss after round 20: %zu KiB, at the end: %zu KiB (limit %zu KiB)\n", rss_early, rss_end, limit);
    if (rss_end > limit) {
        fprintf(stderr, "churn: resident memory grew to %zu KiB\n", rss_end);
        return 1;
    }
    printf("churn ok\n");
    return 0;
}
