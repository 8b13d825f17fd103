/* The tl_ extensions of tlmalloc.h: sized frees, typed pools, heaps,
 * tl_stats and tl_collect. Linked against libtlmalloc.so (-ltlmalloc; the
 * test picks the library with LD_LIBRARY_PATH). Without an argument it runs
 * every check and prints "N passed, N failed" (exit status 1 on a failure;
 * a failed REQUIRE aborts at once). With one of the wrong-size modes it
 * frees a block with a wrong size and, when the library did not abort,
 * prints "not detected" (a library built with the core's `check` feature
 * must report it and abort). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tlmalloc.h"
#include "check.h"

/* C23; glibc before 2.39 does not declare them. */
void free_sized(void *p, size_t size);
void free_aligned_sized(void *p, size_t alignment, size_t size);

/* Fatal: the checks that follow could not run (or would crash). */
#define REQUIRE(cond)                                                                  \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "%s:%d: REQUIRE failed: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                                   \
        }                                                                              \
    } while (0)

/* ---- tl_stats_t layout: the formula the library asserts at compile time
 * (crates/tlmalloc-capi/src/stats_api.rs): two uint32_t, the uint64_t
 * scalars, then the classes. */
#define STATS_SCALARS 26
_Static_assert(sizeof(tl_class_stats_t) == 24, "tl_class_stats_t is three uint64_t");
_Static_assert(sizeof(tl_stats_t) == 8 + 8 * STATS_SCALARS + 24 * TL_STATS_CLASSES,
               "tl_stats_t size differs from the library's Stats");
_Static_assert(offsetof(tl_stats_t, classes) == 8 + 8 * STATS_SCALARS,
               "tl_stats_t.classes offset differs from the library's Stats");
_Static_assert(offsetof(tl_stats_t, counters_enabled) == 8, "first scalar after the two uint32_t");
_Static_assert(TL_STATS_CLASSES == 96, "the number of size classes");
_Static_assert(TL_STATS_VERSION == 2, "the layout checked here");

/* Whether the library counts every allocation and free (built with the
 * `stats` feature): the checks of those counters run only then. */
static int counting;
#define COUNTED(cond)              \
    do {                           \
        if (counting) CHECK(cond); \
    } while (0)
#define COUNTEDF(cond, ...)                      \
    do {                                         \
        if (counting) CHECKF(cond, __VA_ARGS__); \
    } while (0)

static tl_stats_t snap(void) {
    tl_stats_t s;
    memset(&s, 0, sizeof s);
    s.version = TL_STATS_VERSION;
    REQUIRE(tl_stats(&s) == 0);
    return s;
}

static int64_t diff(uint64_t after, uint64_t before) { return (int64_t)(after - before); }

/* Whether the function `fn` comes from libtlmalloc.so (the copy through
 * memcpy keeps ISO C's -pedantic quiet). */
static int resolves_to_tlmalloc(void (*fn)(void)) {
    void *addr;
    memcpy(&addr, &fn, sizeof addr);
    Dl_info info;
    if (dladdr(addr, &info) == 0 || info.dli_fname == NULL) return 0;
    /* Linked with -ltlmalloc, the loader opens the library by its SONAME. */
    return ends_with(info.dli_fname, "libtlmalloc.so.0");
}

static void run_thread(void *(*fn)(void *), void *arg) {
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, fn, arg) == 0);
    REQUIRE(pthread_join(t, NULL) == 0);
}

/* A pattern over [p, p+n) depending on `seed`: every byte of blocks up to
 * 4 KiB; of bigger ones the first and last 2 KiB and every 509th byte. */
static size_t pattern_next(size_t i, size_t n) {
    if (n <= 4096 || i < 2048 || i + 2048 >= n) return i + 1;
    size_t next = i + 509;
    return next + 2048 < n ? next : n - 2048;
}

static unsigned char pattern_at(size_t i, unsigned seed) {
    return (unsigned char)(i * 31 + seed * 7 + 1);
}

static void fill(void *p, size_t n, unsigned seed) {
    unsigned char *b = p;
    for (size_t i = 0; i < n; i = pattern_next(i, n)) b[i] = pattern_at(i, seed);
}

static int intact(const void *p, size_t n, unsigned seed) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i = pattern_next(i, n))
        if (b[i] != pattern_at(i, seed)) return 0;
    return 1;
}

/* Sizes the compiler cannot see (it warns about a constant too large). */
static volatile size_t v_size_max = SIZE_MAX, v_half = SIZE_MAX / 2;
static volatile size_t v_top_align = (SIZE_MAX >> 1) + 1;

/* Four threads alive at once, so glibc's stack cache holds four stacks
 * afterwards: a thread with a fresh stack costs a live DTV block (calloc,
 * kept with the cached stack), a thread on a cached one nothing. Every
 * measurement below starts after this. */
static pthread_barrier_t warm_barrier;

static void *warm_thread(void *arg) {
    pthread_barrier_wait(&warm_barrier);
    return arg;
}

static void warm_up_threads(void) {
    pthread_t ts[4];
    REQUIRE(pthread_barrier_init(&warm_barrier, NULL, 4) == 0);
    for (int i = 0; i < 4; i++) REQUIRE(pthread_create(&ts[i], NULL, warm_thread, NULL) == 0);
    for (int i = 0; i < 4; i++) REQUIRE(pthread_join(ts[i], NULL) == 0);
    pthread_barrier_destroy(&warm_barrier);
}

/* ======================================================================
 * Sized frees
 * ====================================================================== */

/* Whether the library is the `check` build: it pads every request for its
 * slack canary and answers the requested size as the usable size (a
 * 1-byte block is 16 bytes otherwise). */
static int is_check_build(void) {
    unsigned char *p = malloc(1);
    if (p == NULL) return 0;
    p[0] = 1;
    size_t usable = tl_usable_size(p);
    free(p);
    return usable == 1;
}

static void test_sized(void) {
    static const size_t sizes[] = {0,    1,     7,      8,      9,      16,      17,
                                   100,  1000,  4096,   65536,  131072, 131073,  1 << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t n = sizes[i];
        void *p = tl_malloc_sized(n);
        REQUIRE(p != NULL);
        CHECKF(tl_usable_size(p) == (is_check_build() ? n : tl_good_size(n)),
               "tl_malloc_sized(%zu)", n);
        fill(p, n, 3);
        CHECK(intact(p, n, 3));
        tl_free_sized(p, n);

        /* C23 names, blocks of malloc, calloc and realloc. */
        p = malloc(n);
        REQUIRE(p != NULL);
        free_sized(p, n);
        p = calloc(n, 3);
        REQUIRE(p != NULL);
        CHECK(all_zero(p, n * 3));
        free_sized(p, n * 3);
        p = realloc(NULL, n);
        REQUIRE(p != NULL);
        p = realloc(p, n * 2 + 1);
        REQUIRE(p != NULL);
        free_sized(p, n * 2 + 1);
        p = tl_malloc_sized(n);
        REQUIRE(p != NULL);
        p = tl_realloc(p, n + 5000);
        REQUIRE(p != NULL);
        tl_free_sized(p, n + 5000);
    }
    static const size_t aligns[] = {8, 16, 32, 64, 4096, 65536, 1 << 22};
    for (size_t a = 0; a < sizeof aligns / sizeof aligns[0]; a++) {
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
            size_t n = sizes[i], al = aligns[a];
            void *p = tl_malloc_aligned(n, al);
            REQUIRE(p != NULL);
            CHECK(aligned(p, al));
            tl_free_aligned_sized(p, al, n);
            p = aligned_alloc(al, n);
            REQUIRE(p != NULL);
            CHECK(aligned(p, al));
            free_aligned_sized(p, al, n);
        }
    }
    tl_free_sized(NULL, 10);
    tl_free_aligned_sized(NULL, 64, 10);
    free_sized(NULL, 0);
    free_aligned_sized(NULL, 16, 0);

    /* The sized free frees: the frees counter grows by each one. */
    enum { ROUNDS = 1000 };
    tl_stats_t before = snap();
    for (int i = 0; i < ROUNDS; i++) {
        void *p = tl_malloc_sized(48);
        REQUIRE(p != NULL);
        tl_free_sized(p, 48);
    }
    tl_stats_t after = snap();
    COUNTED(diff(after.allocs, before.allocs) == ROUNDS);
    COUNTED(diff(after.frees, before.frees) == ROUNDS);
    COUNTED(after.live_bytes == before.live_bytes);
}

/* ======================================================================
 * Typed pools
 * ====================================================================== */

struct node {
    uint64_t key;
    uint32_t words[5];
    struct node *next;
};

struct wide {
    _Alignas(64) unsigned char bytes[96];
};

static tl_pool_t node_pool = TL_POOL(struct node);
static const tl_pool_t wide_pool = TL_POOL_INIT(struct wide);

#define NOBJ 10000
static struct node *nodes[NOBJ];
static struct wide *wides[NOBJ];

static void node_fill(struct node *n, uint64_t i) {
    n->key = i * 0x9E3779B97F4A7C15ull;
    for (uint32_t k = 0; k < 5; k++) n->words[k] = (uint32_t)(i * 7 + k);
    n->next = (struct node *)(uintptr_t)~i;
}

static int node_ok(const struct node *n, uint64_t i) {
    if (n->key != i * 0x9E3779B97F4A7C15ull) return 0;
    for (uint32_t k = 0; k < 5; k++)
        if (n->words[k] != (uint32_t)(i * 7 + k)) return 0;
    return n->next == (struct node *)(uintptr_t)~i;
}

static void wide_fill(struct wide *w, unsigned i) {
    for (size_t k = 0; k < sizeof w->bytes; k++) w->bytes[k] = (unsigned char)(i + k * 13);
}

static int wide_ok(const struct wide *w, unsigned i) {
    for (size_t k = 0; k < sizeof w->bytes; k++)
        if (w->bytes[k] != (unsigned char)(i + k * 13)) return 0;
    return 1;
}

static void alloc_nodes(void) {
    size_t expected = tl_good_size(sizeof(struct node));
    int bad_align = 0, bad_size = 0;
    for (int i = 0; i < NOBJ; i++) {
        nodes[i] = tl_pool_alloc(&node_pool);
        REQUIRE(nodes[i] != NULL);
        bad_align += !aligned(nodes[i], _Alignof(struct node));
        bad_size += tl_usable_size(nodes[i]) != expected;
        node_fill(nodes[i], (uint64_t)i);
    }
    CHECK(bad_align == 0);
    CHECK(bad_size == 0);
}

static int nodes_ok(int from, int to, int step) {
    int bad = 0;
    for (int i = from; i < to; i += step) bad += !node_ok(nodes[i], (uint64_t)i);
    return bad == 0;
}

static void *free_nodes_thread(void *arg) {
    (void)arg;
    int bad = 0;
    for (int i = 0; i < NOBJ; i++) {
        bad += !node_ok(nodes[i], (uint64_t)i);
        tl_pool_free(&node_pool, nodes[i]);
        nodes[i] = NULL;
    }
    return (void *)(intptr_t)bad;
}

static void *free_wides_thread(void *arg) {
    (void)arg;
    for (int i = NOBJ - 1; i >= 0; i--) tl_pool_free(&wide_pool, wides[i]);
    return NULL;
}

static void test_pools(void) {
    CHECK(node_pool.size == sizeof(struct node));
    CHECK(node_pool.align == _Alignof(struct node));
    CHECK(strcmp(node_pool.name, "struct node") == 0);
    CHECK(wide_pool.size == sizeof(struct wide) && wide_pool.align == 64);

    tl_stats_t s0 = snap();

    /* 10,000 objects, patterned and verified, freed in reverse order. */
    alloc_nodes();
    CHECK(nodes_ok(0, NOBJ, 1));
    for (int i = NOBJ - 1; i >= 0; i--) {
        if (!node_ok(nodes[i], (uint64_t)i)) check_failed++;
        tl_pool_free(&node_pool, nodes[i]);
    }

    /* Again, freed interleaved: the even ones first, the odd ones intact
     * meanwhile, then the odd ones from the top. */
    alloc_nodes();
    for (int i = 0; i < NOBJ; i += 2) tl_pool_free(&node_pool, nodes[i]);
    CHECK(nodes_ok(1, NOBJ, 2));
    /* New objects fill the holes without touching the live ones. */
    for (int i = 0; i < NOBJ; i += 2) {
        nodes[i] = tl_pool_alloc(&node_pool);
        REQUIRE(nodes[i] != NULL);
        node_fill(nodes[i], (uint64_t)i);
    }
    CHECK(nodes_ok(0, NOBJ, 1));
    for (int i = NOBJ - 1; i >= 1; i -= 2) tl_pool_free(&node_pool, nodes[i]);
    for (int i = 0; i < NOBJ; i += 2) tl_pool_free(&node_pool, nodes[i]);

    /* Freed by another thread, then allocated again here. */
    alloc_nodes();
    pthread_t t;
    void *bad = NULL;
    REQUIRE(pthread_create(&t, NULL, free_nodes_thread, NULL) == 0);
    REQUIRE(pthread_join(t, &bad) == 0);
    CHECK(bad == NULL);
    alloc_nodes();
    CHECK(nodes_ok(0, NOBJ, 1));
    for (int i = 0; i < NOBJ; i++) tl_pool_free(&node_pool, nodes[i]);

    /* An over-aligned type. */
    int bad_align = 0;
    for (int i = 0; i < NOBJ; i++) {
        wides[i] = tl_pool_alloc(&wide_pool);
        REQUIRE(wides[i] != NULL);
        bad_align += !aligned(wides[i], 64);
        wide_fill(wides[i], (unsigned)i);
    }
    CHECK(bad_align == 0);
    int bad_wide = 0;
    for (int i = 0; i < NOBJ; i++) bad_wide += !wide_ok(wides[i], (unsigned)i);
    CHECK(bad_wide == 0);
    run_thread(free_wides_thread, NULL);

    tl_stats_t s1 = snap();
    /* 6 rounds of NOBJ objects (nodes 4 + 1 refill of half, wides 1). */
    COUNTED(diff(s1.allocs, s0.allocs) >= 5 * NOBJ + NOBJ / 2);
    COUNTED(diff(s1.frees, s0.frees) >= 5 * NOBJ + NOBJ / 2);
    COUNTED(diff(s1.remote_frees, s0.remote_frees) >= 2 * NOBJ);
    COUNTED(s1.live_bytes == s0.live_bytes);

    /* A pool in an expression: a compound literal in C. */
    double *d = tl_pool_alloc(&(tl_pool_t)TL_POOL(double));
    REQUIRE(d != NULL);
    *d = 1.5;
    tl_pool_free(&(tl_pool_t)TL_POOL(double), d);

    /* Errors. */
    errno = 0;
    CHECK(tl_pool_alloc(NULL) == NULL && errno == EINVAL);
    static const tl_pool_t bad_pool = {24, 3, "bad"};
    errno = 0;
    CHECK(tl_pool_alloc(&bad_pool) == NULL && errno == EINVAL);
    static const tl_pool_t zero_align = {24, 0, "zero"};
    errno = 0;
    CHECK(tl_pool_alloc(&zero_align) == NULL && errno == EINVAL);
    tl_pool_t huge_pool = {v_half, 8, "huge"};
    errno = 0;
    CHECK(tl_pool_alloc(&huge_pool) == NULL && errno == ENOMEM);
    tl_pool_t top_pool = {10, v_top_align, "top"};
    errno = 0;
    CHECK(tl_pool_alloc(&top_pool) == NULL && errno == ENOMEM);
    static const tl_pool_t empty_pool = {0, 1, "empty"};
    void *e1 = tl_pool_alloc(&empty_pool), *e2 = tl_pool_alloc(&empty_pool);
    CHECK(e1 != NULL && e2 != NULL && e1 != e2);
    tl_pool_free(&empty_pool, e1);
    tl_pool_free(&empty_pool, e2);
    tl_pool_free(&node_pool, NULL);
    tl_pool_free(NULL, malloc(10));
    tl_pool_free(NULL, NULL);
}

/* ======================================================================
 * Heaps
 * ====================================================================== */

#define HBLOCKS 2000

struct hblock {
    void *p;
    size_t size;
};
static struct hblock hblocks[HBLOCKS];

/* Mixed sizes: small and medium ones, and every 50th-ish a large one
 * (above 128 KiB). */
static size_t heap_size_of(int i) {
    switch (i % 50) {
    case 7: return 300000;
    case 23: return 1 << 20;
    case 41: return 3 << 20;
    default: {
        static const size_t small[] = {1, 8, 24, 100, 256, 1000, 4096, 5000, 40000, 100000};
        return small[(i * 7) % 10];
    }
    }
}

/* Allocate block i of `h` the way i says (malloc, calloc, aligned). */
static void heap_alloc_block(tl_heap_t *h, int i, unsigned seed) {
    size_t n = heap_size_of(i);
    void *p = NULL;
    switch (i % 4) {
    case 1:
        p = tl_heap_calloc(h, 4, n / 4 + 1);
        REQUIRE(p != NULL);
        if (!all_zero(p, 4 * (n / 4 + 1))) check_failed++;
        n = 4 * (n / 4 + 1);
        break;
    case 2: {
        static const size_t aligns[] = {32, 64, 256, 4096, 65536};
        size_t a = aligns[(i / 4) % 5];
        p = tl_heap_malloc_aligned(h, n, a);
        REQUIRE(p != NULL);
        if (!aligned(p, a)) check_failed++;
        break;
    }
    default:
        p = tl_heap_malloc(h, n);
        REQUIRE(p != NULL);
        if (n >= 16 && !aligned(p, 16)) check_failed++;
    }
    if (tl_usable_size(p) < n) check_failed++;
    fill(p, n, seed + (unsigned)i);
    hblocks[i].p = p;
    hblocks[i].size = n;
}

static int heap_blocks_ok(int from, int step, unsigned seed) {
    int bad = 0;
    for (int i = from; i < HBLOCKS; i += step)
        bad += !intact(hblocks[i].p, hblocks[i].size, seed + (unsigned)i);
    return bad == 0;
}

/* Frees the odd blocks with plain free(), after checking them. */
static void *free_odd_thread(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg;
    intptr_t bad = 0;
    for (int i = 1; i < HBLOCKS; i += 2) {
        bad += !intact(hblocks[i].p, hblocks[i].size, seed + (unsigned)i);
        free(hblocks[i].p);
        hblocks[i].p = NULL;
    }
    return (void *)bad;
}

/* One heap per thread: allocate, free some through tl_free, destroy. */
static void *own_heap_thread(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg;
    intptr_t bad = 0;
    tl_heap_t *h = tl_heap_new();
    if (h == NULL) return (void *)1;
    void *blocks[500];
    for (int i = 0; i < 500; i++) {
        size_t n = (size_t)(i % 3 == 0 ? 150000 : 16 + i * 40);
        blocks[i] = tl_heap_malloc(h, n);
        if (blocks[i] == NULL) return (void *)1;
        fill(blocks[i], n, seed + (unsigned)i);
    }
    for (int i = 0; i < 500; i++) {
        size_t n = (size_t)(i % 3 == 0 ? 150000 : 16 + i * 40);
        bad += !intact(blocks[i], n, seed + (unsigned)i);
        if (i % 2) tl_free(blocks[i]);
    }
    tl_heap_collect(h);
    tl_heap_destroy(h);
    return (void *)bad;
}

/* Allocates from a heap created by another thread (one user at a time). */
static void *use_given_heap_thread(void *arg) {
    tl_heap_t *h = arg;
    for (int i = 0; i < 300; i++) {
        void *p = tl_heap_malloc(h, (size_t)(i * 100 + 1));
        if (p == NULL) return (void *)1;
        if (i % 2) free(p);
    }
    return NULL;
}

static void test_heaps(void) {
    tl_stats_t s0 = snap();
    CHECK(s0.user_heaps == 0);

    tl_heap_t *h = tl_heap_new();
    REQUIRE(h != NULL);
    tl_stats_t s1 = snap();
    CHECK(s1.user_heaps == 1);

    size_t asked = 0;
    int large = 0;
    for (int i = 0; i < HBLOCKS; i++) {
        heap_alloc_block(h, i, 11);
        asked += hblocks[i].size;
        large += hblocks[i].size > 256 * 1024;
    }
    CHECK(heap_blocks_ok(0, 1, 11));
    tl_stats_t s2 = snap();
    COUNTEDF(diff(s2.live_bytes, s0.live_bytes) >= (int64_t)asked, "live grew by %lld, asked %zu",
             (long long)diff(s2.live_bytes, s0.live_bytes), asked);
    COUNTED(diff(s2.large_allocs, s0.large_allocs) >= large);
    COUNTED(diff(s2.allocs, s0.allocs) >= HBLOCKS);

    /* Half of them freed with plain free() by another thread. */
    pthread_t t;
    void *bad = NULL;
    REQUIRE(pthread_create(&t, NULL, free_odd_thread, (void *)(uintptr_t)11) == 0);
    REQUIRE(pthread_join(t, &bad) == 0);
    CHECK(bad == NULL);
    CHECK(heap_blocks_ok(0, 2, 11));
    tl_stats_t s3 = snap();
    /* Small and medium blocks freed there count as remote frees; large
     * ones as large frees. */
    int odd_large = 0;
    for (int i = 1; i < HBLOCKS; i += 2) odd_large += heap_size_of(i) > 256 * 1024;
    COUNTEDF(diff(s3.remote_frees, s2.remote_frees) >= HBLOCKS / 2 - odd_large,
             "remote frees grew by %lld", (long long)diff(s3.remote_frees, s2.remote_frees));
    COUNTED(diff(s3.large_frees, s2.large_frees) >= odd_large);
    COUNTED(diff(s3.frees, s2.frees) >= HBLOCKS / 2);

    /* The heap takes those blocks back and serves them again. */
    tl_heap_collect(h);
    for (int i = 1; i < HBLOCKS; i += 2) heap_alloc_block(h, i, 12);
    CHECK(heap_blocks_ok(0, 2, 11));
    CHECK(heap_blocks_ok(1, 2, 12));
    /* Some freed by the owner with tl_free. */
    for (int i = 0; i < HBLOCKS; i += 8) {
        tl_free(hblocks[i].p);
        hblocks[i].p = NULL;
    }

    /* Errors. */
    errno = 0;
    CHECK(tl_heap_malloc(NULL, 10) == NULL && errno == EINVAL);
    errno = 0;
    CHECK(tl_heap_calloc(NULL, 1, 10) == NULL && errno == EINVAL);
    errno = 0;
    CHECK(tl_heap_malloc_aligned(NULL, 10, 16) == NULL && errno == EINVAL);
    errno = 0;
    CHECK(tl_heap_malloc_aligned(h, 10, 3) == NULL && errno == EINVAL);
    errno = 0;
    CHECK(tl_heap_malloc_aligned(h, 10, 0) == NULL && errno == EINVAL);
    errno = 0;
    CHECK(tl_heap_calloc(h, v_half, 3) == NULL && errno == ENOMEM);
    errno = 0;
    CHECK(tl_heap_malloc(h, v_size_max) == NULL && errno == ENOMEM);
    errno = 0;
    CHECK(tl_heap_malloc_aligned(h, v_size_max - 100, 64) == NULL && errno == ENOMEM);
    errno = 0;
    CHECK(tl_heap_malloc_aligned(h, 10, v_top_align) == NULL && errno == ENOMEM);
    void *z = tl_heap_malloc(h, 0), *z2 = tl_heap_malloc(h, 0);
    CHECK(z != NULL && z2 != NULL && z != z2);
    tl_heap_collect(NULL);
    tl_heap_destroy(NULL);

    /* Destroyed with its live blocks (about 7/16 of them, and z, z2). */
    tl_heap_destroy(h);
    tl_stats_t s4 = snap();
    CHECK(s4.user_heaps == 0);
    /* Every block of the heap counts as freed: live bytes are where they
     * were before it, exactly (no other thread runs, and this thread
     * allocated nothing else meanwhile). */
    COUNTEDF(s4.live_bytes == s0.live_bytes, "live bytes %llu before the heap, %llu after",
             (unsigned long long)s0.live_bytes, (unsigned long long)s4.live_bytes);
    COUNTED(s4.large_live_bytes == s0.large_live_bytes);
    COUNTED(diff(s4.allocs, s0.allocs) == diff(s4.frees, s0.frees));

    /* Four threads, a heap each, at once. */
    pthread_t ts[4];
    for (int i = 0; i < 4; i++)
        REQUIRE(pthread_create(&ts[i], NULL, own_heap_thread, (void *)(uintptr_t)(i * 100)) == 0);
    for (int i = 0; i < 4; i++) {
        REQUIRE(pthread_join(ts[i], &bad) == 0);
        CHECK(bad == NULL);
    }
    /* A heap made here, used by another thread, destroyed here. */
    h = tl_heap_new();
    REQUIRE(h != NULL);
    REQUIRE(pthread_create(&t, NULL, use_given_heap_thread, h) == 0);
    REQUIRE(pthread_join(t, &bad) == 0);
    CHECK(bad == NULL);
    void *last = tl_heap_malloc(h, 77);
    CHECK(last != NULL);
    tl_heap_destroy(h);

    tl_stats_t s5 = snap();
    CHECK(s5.user_heaps == 0);
    COUNTEDF(s5.live_bytes == s0.live_bytes, "live bytes %llu before the heaps, %llu after",
             (unsigned long long)s0.live_bytes, (unsigned long long)s5.live_bytes);
}

/* ======================================================================
 * tl_stats
 * ====================================================================== */

static int sums_match(const tl_stats_t *s) {
    uint64_t allocs = s->large_allocs, frees = s->large_frees;
    for (uint32_t c = 0; c < s->class_count && c < TL_STATS_CLASSES; c++) {
        allocs += s->classes[c].allocs;
        frees += s->classes[c].frees;
    }
    return allocs == s->allocs && frees == s->frees;
}

#define WORKERS 4
#define ITERS 50000
#define WINDOW 64

/* Balanced: every block it allocates, it frees. Returns its allocation count. */
static void *workload_thread(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg;
    void *window[WINDOW] = {0};
    uintptr_t count = 0;
    for (int i = 0; i < ITERS; i++) {
        size_t n = (i % 5000 == 4999) ? 300000 : (size_t)((i * 37 + seed) % 3000);
        void *p = malloc(n);
        if (p == NULL) abort();
        count++;
        if (n > 0) ((unsigned char *)p)[0] = (unsigned char)i; /* malloc(0) has no byte */
        int slot = (int)((i * 13u + seed) % WINDOW);
        free(window[slot]);
        window[slot] = p;
    }
    for (int i = 0; i < WINDOW; i++) free(window[i]);
    return (void *)count;
}

static void run_workload(uintptr_t *total) {
    pthread_t ts[WORKERS];
    *total = 0;
    for (int i = 0; i < WORKERS; i++)
        REQUIRE(pthread_create(&ts[i], NULL, workload_thread, (void *)(uintptr_t)(i * 1000)) == 0);
    for (int i = 0; i < WORKERS; i++) {
        void *count = NULL;
        REQUIRE(pthread_join(ts[i], &count) == 0);
        *total += (uintptr_t)count;
    }
}

static void *free_all_thread(void *arg) {
    void **blocks = arg;
    for (int i = 0; i < 1000; i++) free(blocks[i]);
    return NULL;
}

static void test_stats(void) {
    tl_stats_t s;
    /* Errors leave *out untouched. */
    errno = 0;
    CHECK(tl_stats(NULL) == -1 && errno == EINVAL);
    memset(&s, 0xab, sizeof s);
    s.version = 0;
    errno = 0;
    CHECK(tl_stats(&s) == -1 && errno == EINVAL);
    CHECK(s.allocs == 0xababababababababull && s.classes[0].block_size == 0xababababababababull);
    s.version = 99;
    errno = 0;
    CHECK(tl_stats(&s) == -1 && errno == EINVAL);
    CHECK(s.version == 99 && s.user_heaps == 0xababababababababull);
    s.version = TL_STATS_VERSION + 1;
    errno = 0;
    CHECK(tl_stats(&s) == -1 && errno == EINVAL);

    /* A program built against version 1 (88 classes): exactly its bytes
     * are written, with class_count 88 and its own version. */
    {
        size_t v1_bytes = offsetof(tl_stats_t, classes) + 88 * sizeof(tl_class_stats_t);
        memset(&s, 0xab, sizeof s);
        s.version = 1;
        errno = 0;
        CHECK(tl_stats(&s) == 0 && errno == 0);
        CHECK(s.version == 1 && s.class_count == 88);
        CHECK(s.classes[87].block_size == 128 * 1024);
        const unsigned char *past = (const unsigned char *)&s + v1_bytes;
        int untouched = 1;
        for (size_t i = 0; i < sizeof s - v1_bytes; i++) untouched &= past[i] == 0xab;
        CHECK(untouched);
    }

    s.version = TL_STATS_VERSION;
    errno = 0;
    CHECK(tl_stats(&s) == 0 && errno == 0);
    CHECK(s.version == TL_STATS_VERSION);
    CHECK(s.class_count == TL_STATS_CLASSES);
    /* The library's view of the layout: if the classes were not where the
     * header says, these would be the 0xab filler or scalars. */
    CHECK(offsetof(tl_stats_t, classes) == 8 + 8 * STATS_SCALARS);
    CHECK((char *)&s.classes[0] - (char *)&s == (ptrdiff_t)offsetof(tl_stats_t, classes));
    CHECK(s.classes[0].block_size == 16);
    CHECK(s.classes[TL_STATS_CLASSES - 1].block_size == 256 * 1024);
    int ordered = 1;
    for (int c = 0; c < TL_STATS_CLASSES; c++) {
        uint64_t b = s.classes[c].block_size;
        /* (The check build's padding puts a request of b in the next class.) */
        ordered &= is_check_build() || tl_good_size((size_t)b) == b;
        if (c > 0) ordered &= b > s.classes[c - 1].block_size;
        ordered &= s.classes[c].frees <= s.classes[c].allocs;
    }
    CHECK(ordered);
    CHECK(sums_match(&s));
    CHECK(s.thread_heaps >= 1);
    CHECK(s.reserved_bytes > 0 && s.peak_reserved_bytes >= s.reserved_bytes);
    CHECK(s.committed_bytes <= s.reserved_bytes);
    CHECK(s.map_calls > 0);
    CHECK(s.large_live_bytes <= s.live_bytes);
    CHECK(s.page_bytes <= s.peak_page_bytes);

    /* A balanced workload on 4 threads. A first run warms glibc up: its
     * thread stacks (and the DTV and TCB on them) are cached after a join
     * and reused, so the measured run allocates nothing but the workload. */
    uintptr_t warm = 0, total = 0;
    run_workload(&warm);
    tl_stats_t s0 = snap();
    run_workload(&total);
    tl_stats_t s1 = snap();
    CHECK(total == (uintptr_t)WORKERS * ITERS);
    COUNTEDF(diff(s1.allocs, s0.allocs) >= (int64_t)total, "allocs grew by %lld, workload %lu",
             (long long)diff(s1.allocs, s0.allocs), (unsigned long)total);
    COUNTEDF(diff(s1.frees, s0.frees) >= (int64_t)total, "frees grew by %lld, workload %lu",
             (long long)diff(s1.frees, s0.frees), (unsigned long)total);
    COUNTED(diff(s1.large_allocs, s0.large_allocs) >= WORKERS * (ITERS / 5000));
    COUNTED(diff(s1.large_frees, s0.large_frees) >= WORKERS * (ITERS / 5000));
    /* Live bytes return to where they were. The tolerance: what glibc may
     * still allocate per thread creation with a warm stack cache (nothing
     * in practice; a DTV resize would be a few hundred bytes per thread),
     * 1 KiB per thread. One leaked workload block per thread would already
     * be more than that on average (sizes up to 3000 bytes); the workload
     * allocates about 300 MB in all. */
    int64_t moved = diff(s1.live_bytes, s0.live_bytes);
    COUNTEDF(moved >= -WORKERS * 1024 && moved <= WORKERS * 1024,
             "live bytes %llu before the workload, %llu after", (unsigned long long)s0.live_bytes,
             (unsigned long long)s1.live_bytes);
    CHECK(s1.thread_heaps == s0.thread_heaps);
    CHECK(sums_match(&s1));
    if (!counting) {
        /* Without the counters, what they would count stays 0. */
        int zero = s1.allocs == 0 && s1.frees == 0 && s1.live_bytes == 0 &&
                   s1.large_allocs == 0 && s1.large_frees == 0 && s1.large_live_bytes == 0 &&
                   s1.remote_frees == 0;
        for (int c = 0; c < TL_STATS_CLASSES; c++)
            zero &= s1.classes[c].allocs == 0 && s1.classes[c].frees == 0;
        CHECK(zero);
    }

    /* Cross-thread frees are counted. */
    void *blocks[1000];
    for (int i = 0; i < 1000; i++) {
        blocks[i] = malloc((size_t)(i % 200 + 1));
        REQUIRE(blocks[i] != NULL);
    }
    tl_stats_t s2 = snap();
    run_thread(free_all_thread, blocks);
    tl_stats_t s3 = snap();
    COUNTED(diff(s3.remote_frees, s2.remote_frees) >= 1000);
    COUNTED(diff(s3.frees, s2.frees) >= 1000);
    COUNTED(s3.live_bytes < s2.live_bytes);
    CHECK(sums_match(&s3));
}

/* ======================================================================
 * tl_collect and malloc_trim
 * ====================================================================== */

static void test_collect(void) {
    enum { N = 32768 };
    static void *blocks[N];
    for (int i = 0; i < N; i++) {
        blocks[i] = malloc(1000);
        REQUIRE(blocks[i] != NULL);
    }
    tl_stats_t full = snap();
    for (int i = 0; i < N; i++) free(blocks[i]);
    tl_collect(0);
    tl_collect(1);
    tl_stats_t collected = snap();
    /* 32 MiB of pages emptied, then released. */
    CHECKF(collected.page_bytes + 16 * 1024 * 1024 <= full.page_bytes,
           "page bytes %llu with the blocks, %llu after tl_collect(1)",
           (unsigned long long)full.page_bytes, (unsigned long long)collected.page_bytes);
    tl_collect(0);
    tl_collect(1);
    int trimmed = malloc_trim(0);
    CHECK(trimmed == 0 || trimmed == 1);
    void *p = malloc(100);
    CHECK(p != NULL);
    free(p);
}

/* ======================================================================
 * Wrong sizes (for a library built with the core's `check` feature)
 * ====================================================================== */

static int wrong_size(const char *mode) {
    if (strcmp(mode, "wrong-tl-free-sized") == 0) {
        void *p = tl_malloc_sized(100);
        tl_free_sized(p, 1000);
    } else if (strcmp(mode, "wrong-free-sized") == 0) {
        void *p = malloc(1000);
        free_sized(p, 100);
    } else if (strcmp(mode, "wrong-free-aligned-sized") == 0) {
        void *p = aligned_alloc(64, 200);
        free_aligned_sized(p, 64, 2000);
    } else if (strcmp(mode, "wrong-tl-free-aligned-sized") == 0) {
        void *p = tl_malloc_aligned(300, 4096);
        tl_free_aligned_sized(p, 4096, 5000);
    } else if (strcmp(mode, "wrong-pool") == 0) {
        struct node *n = tl_pool_alloc(&node_pool);
        tl_pool_free(&wide_pool, n);
    } else {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    printf("not detected\n");
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1) return wrong_size(argv[1]);

    REQUIRE(resolves_to_tlmalloc((void (*)(void))malloc));
    REQUIRE(resolves_to_tlmalloc((void (*)(void))free));
    REQUIRE(resolves_to_tlmalloc((void (*)(void))tl_stats));
    /* The exact live-byte balances below would also count what the C
     * library allocates for the background purger's thread (its TLS),
     * which starts once the program has threads and free memory. */
    REQUIRE(tl_option_set("background_purge", "0") == 0);
    /* stdout's buffer, and glibc's first-thread setup, before any figure
     * is measured. */
    printf("tlmalloc %s\n", tl_version());
    fflush(stdout);
    warm_up_threads();
    tl_stats_t first = snap();
    CHECK(first.counters_enabled == 0 || first.counters_enabled == 1);
    counting = first.counters_enabled == 1;
    printf("per-operation counters: %s\n", counting ? "on" : "off");
    fflush(stdout);

    test_sized();
    test_pools();
    test_heaps();
    test_stats();
    test_collect();
    return check_done();
}
