/* A C program linked with libtlmalloc.a for valgrind --tool=memcheck: one
 * mistake per mode, so that a library built with the `valgrind` feature
 * can be seen to report each (tests/valgrind.rs builds and runs it).
 *
 *   clean           every kind of allocation, all freed: no error
 *   leak            100 bytes of malloc, 300,000 of calloc and 200 of a
 *                   tl_heap never freed
 *   use-after-free  a read of a freed 512-byte block
 *   overflow        a write one byte past a 100-byte request (its block
 *                   holds 112)
 */
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tlmalloc.h"

static void check(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "memcheck.c: %s\n", what);
        exit(3);
    }
}

/* Frees another thread's blocks, and hands one of its own back. */
static void *free_all(void *arg) {
    void **blocks = arg;
    for (int i = 0; i < 1000; i++)
        free(blocks[i]);
    return malloc(64);
}

static void clean(void) {
    /* realloc: within the block's slack, down, up to large, to nothing. */
    char *p = malloc(100);
    memset(p, 1, 100);
    p = realloc(p, 110);
    memset(p + 100, 2, 10);
    check(p[99] + p[109] == 3, "realloc in place kept the bytes");
    p = realloc(p, 40);
    p = realloc(p, 500000);
    p[499999] = 3;
    check(p[39] + p[499999] == 4, "realloc to large kept the bytes");
    p = realloc(p, 1000);
    check(p[0] == 1, "realloc down kept the bytes");
    check(realloc(p, 0) == NULL, "realloc(p, 0) frees");
    p = realloc(NULL, 10);
    free(p);
    free(NULL);

    /* Zeroed memory is defined: small, and large (fresh from the OS). */
    int *z = calloc(250, sizeof(int));
    int *zl = calloc(100000, sizeof(int));
    check(z[249] == 0 && zl[99999] == 0, "calloc zeroes");
    free(z);
    free(zl);

    /* malloc_usable_size is the requested size under memcheck. */
    char *u = malloc(100);
    size_t n = malloc_usable_size(u);
    memset(u, 5, n);
    check(u[n - 1] == 5, "usable bytes are usable");
    free(u);

    /* Aligned blocks, one of them 4 MiB-aligned (header below). */
    void *a = NULL;
    check(posix_memalign(&a, 4096, 300) == 0, "posix_memalign");
    memset(a, 0, 300);
    free(a);
    char *huge = aligned_alloc(4 << 20, 1 << 20);
    huge[(1 << 20) - 1] = 1;
    free(huge);

    /* Frees on another thread (the remote path). */
    void *blocks[1000];
    for (int i = 0; i < 1000; i++) {
        blocks[i] = malloc(48);
        memset(blocks[i], i, 48);
    }
    pthread_t t;
    void *theirs = NULL;
    check(pthread_create(&t, NULL, free_all, blocks) == 0, "pthread_create");
    pthread_join(t, &theirs);
    free(theirs);
    for (int i = 0; i < 1000; i++) { /* the thread's pages, refilled */
        blocks[i] = malloc(48);
        free(blocks[i]);
    }
    /* Free memory in a program that had two heaps: what starts the
     * background purger, whose thread would still run at exit (and its
     * thread-local storage be reported as possibly lost). */
    free(malloc(1 << 20));

    /* A user heap: a live block freed with free, the rest by destroy. */
    tl_heap_t *h = tl_heap_new();
    char *kept = tl_heap_malloc(h, 300);
    char *gone = tl_heap_calloc(h, 3, 100);
    char *big = tl_heap_malloc(h, 300000);
    memset(kept, 7, 300);
    check(gone[299] == 0, "tl_heap_calloc zeroes");
    big[299999] = 1;
    free(gone);
    tl_heap_destroy(h);
}

static void leak(void) {
    void *p = malloc(100);
    memset(p, 1, 100);
    void *q = calloc(300000, 1);
    tl_heap_t *h = tl_heap_new();
    void *r = tl_heap_malloc(h, 200);
    check(p && q && r, "allocations");
    p = q = r = NULL;
}

static void use_after_free(void) { /* 64 bytes in: clear of the neighbours */
    int *p = malloc(512);
    p[16] = 1;
    free(p);
    volatile int x = p[16];
    (void)x;
}

static void overflow(void) {
    char *p = malloc(100);
    p[100] = 1;
    free(p);
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, "clean"))
        clean();
    else if (!strcmp(mode, "leak"))
        leak();
    else if (!strcmp(mode, "use-after-free"))
        use_after_free();
    else if (!strcmp(mode, "overflow"))
        overflow();
    else {
        fprintf(stderr, "usage: memcheck clean|leak|use-after-free|overflow\n");
        return 2;
    }
    printf("%s: done\n", mode);
    return 0;
}
