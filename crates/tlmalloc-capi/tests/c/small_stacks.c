/* The allocator on small thread stacks.
 *
 *   small_stacks STACK SCENARIO
 *
 * STACK is "min" (PTHREAD_STACK_MIN, 16 KiB on x86-64 glibc), "32k", or
 * "8m" (a default-sized stack: the control, where only the scenario's own
 * checks can fail).
 * One thread with that stack runs SCENARIO, whose first call into the
 * allocator is the thread's first allocation (or free): the thread's heap
 * is set up on that stack. Every block is filled with a pattern and
 * checked. Prints "small_stacks ok: STACK SCENARIO" and exits 0; a failed
 * check prints its line and exits 1; a stack overflow is a SIGSEGV.
 *
 * Scenarios: malloc_{small,medium,large,huge} (64 B, 32 KiB, 1 MiB,
 * 256 MiB), calloc_{small,medium,large,huge}, aligned_{64,4k,64k,2m,8m}
 * (posix_memalign and aligned_alloc), realloc_tiers (16 B -> 64 KiB ->
 * 1 MiB -> 300 MiB -> 100 B, contents kept), xfree_to_small (main
 * allocates every tier, the small-stack thread checks and frees),
 * xfree_from_small (the small-stack thread allocates, main checks and
 * frees while it waits), exit_holding (the small-stack thread exits
 * holding a block of every tier; main checks and frees them).
 *
 * The worker thread never prints or calls into libc beyond the allocator
 * and semaphores: a failure is recorded in a static and printed by main. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)

static const size_t tiers[] = {64, 32 * KIB, 1 * MIB, 256 * MIB};
#define TIERS (sizeof tiers / sizeof tiers[0])

/* The first failed check, and how many failed. */
static int failures;
static int fail_line;
static const char *fail_what;
static size_t fail_size;

#define CHECK_SIZE(cond, size)                                   \
    do {                                                         \
        if (!(cond)) {                                           \
            if (__atomic_fetch_add(&failures, 1, __ATOMIC_SEQ_CST) == 0) { \
                fail_line = __LINE__;                            \
                fail_what = #cond;                               \
                fail_size = (size);                              \
            }                                                    \
        }                                                        \
    } while (0)
#define CHECK(cond) CHECK_SIZE(cond, 0)

/* The pattern byte at offset i of a block filled with `seed`. */
static inline unsigned char pat(unsigned seed, size_t i) {
    return (unsigned char)(seed * 37u + i * 7u + (i >> 12) * 13u + 1u);
}

/* The offsets a block of n bytes is filled and checked at: all of it up to
 * 1 MiB; above, the first and last 256 KiB and one byte in every 4 KiB
 * (touching every page without writing hundreds of MiB). */
#define EDGE (256 * KIB)
static inline size_t next_offset(size_t n, size_t i) {
    if (n <= MIB || i + 1 < EDGE || i + 1 >= n - EDGE) return i + 1;
    size_t next = (i + 4096) & ~(size_t)4095;
    return next < n - EDGE ? next : n - EDGE;
}

static void fill(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i = next_offset(n, i)) p[i] = pat(seed, i);
}

/* Whether the first `n` bytes of a block filled as `filled` bytes still
 * hold the pattern. */
static int holds(const unsigned char *p, size_t filled, size_t n, unsigned seed) {
    for (size_t i = 0; i < n && i < filled; i = next_offset(filled, i))
        if (p[i] != pat(seed, i)) return 0;
    return 1;
}

static int zero_at_offsets(const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i = next_offset(n, i))
        if (p[i] != 0) return 0;
    return 1;
}

static int is_aligned(const void *p, size_t a) { return ((uintptr_t)p & (a - 1)) == 0; }

/* ------------------------------------------------------------ scenarios */

static void use_block(unsigned char *p, size_t n, unsigned seed) {
    CHECK_SIZE(p != NULL, n);
    if (!p) return;
    fill(p, n, seed);
    CHECK_SIZE(holds(p, n, n, seed), n);
    free(p);
}

static void do_malloc(size_t n) { use_block(malloc(n), n, (unsigned)n); }

static void do_calloc(size_t n) {
    unsigned char *p = calloc(n / 16, 16);
    CHECK_SIZE(p != NULL, n);
    if (!p) return;
    CHECK_SIZE(zero_at_offsets(p, n), n);
    use_block(p, n, 3);
}

static void do_aligned(size_t align) {
    void *p = NULL;
    /* The first allocation of the thread: a small block, aligned. */
    CHECK_SIZE(posix_memalign(&p, align, 100) == 0, align);
    CHECK_SIZE(is_aligned(p, align), align);
    use_block(p, 100, 5);
    p = NULL;
    CHECK_SIZE(posix_memalign(&p, align, 3 * align) == 0, align);
    CHECK_SIZE(is_aligned(p, align), align);
    use_block(p, 3 * align, 6);
    p = aligned_alloc(align, align);
    CHECK_SIZE(is_aligned(p, align), align);
    use_block(p, align, 7);
    p = aligned_alloc(align, 2 * align);
    CHECK_SIZE(is_aligned(p, align), align);
    use_block(p, 2 * align, 8);
}

static void do_realloc_tiers(void) {
    static const size_t sizes[] = {16, 64 * KIB, 1 * MIB, 300 * MIB, 100};
    unsigned char *p = malloc(sizes[0]);
    CHECK_SIZE(p != NULL, sizes[0]);
    if (!p) return;
    fill(p, sizes[0], 9);
    size_t filled = sizes[0];
    for (size_t k = 1; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t n = sizes[k];
        unsigned char *q = realloc(p, n);
        CHECK_SIZE(q != NULL, n);
        if (!q) {
            free(p);
            return;
        }
        p = q;
        /* The prefix both sizes share was kept. */
        CHECK_SIZE(holds(p, filled, n, 9), n);
        /* The pattern depends on the offset only: refill for the next step. */
        fill(p, n, 9);
        filled = n;
    }
    CHECK(holds(p, filled, filled, 9));
    free(p);
}

/* Blocks handed between main and the worker. */
static unsigned char *blocks[TIERS];
static sem_t handed, taken;

static void alloc_every_tier(unsigned seed) {
    for (size_t t = 0; t < TIERS; t++) {
        blocks[t] = malloc(tiers[t]);
        CHECK_SIZE(blocks[t] != NULL, tiers[t]);
        if (blocks[t]) fill(blocks[t], tiers[t], seed + (unsigned)t);
    }
}

static void check_and_free_every_tier(unsigned seed) {
    for (size_t t = 0; t < TIERS; t++) {
        if (!blocks[t]) continue;
        CHECK_SIZE(holds(blocks[t], tiers[t], tiers[t], seed + (unsigned)t), tiers[t]);
        free(blocks[t]);
        blocks[t] = NULL;
    }
}

static const char *scenario;

static void *worker(void *arg) {
    (void)arg;
    const char *s = scenario;
    if (!strcmp(s, "malloc_small")) do_malloc(tiers[0]);
    else if (!strcmp(s, "malloc_medium")) do_malloc(tiers[1]);
    else if (!strcmp(s, "malloc_large")) do_malloc(tiers[2]);
    else if (!strcmp(s, "malloc_huge")) do_malloc(tiers[3]);
    else if (!strcmp(s, "calloc_small")) do_calloc(tiers[0]);
    else if (!strcmp(s, "calloc_medium")) do_calloc(tiers[1]);
    else if (!strcmp(s, "calloc_large")) do_calloc(tiers[2]);
    else if (!strcmp(s, "calloc_huge")) do_calloc(tiers[3]);
    else if (!strcmp(s, "aligned_64")) do_aligned(64);
    else if (!strcmp(s, "aligned_4k")) do_aligned(4 * KIB);
    else if (!strcmp(s, "aligned_64k")) do_aligned(64 * KIB);
    else if (!strcmp(s, "aligned_2m")) do_aligned(2 * MIB);
    else if (!strcmp(s, "aligned_8m")) do_aligned(8 * MIB);
    else if (!strcmp(s, "realloc_tiers")) do_realloc_tiers();
    else if (!strcmp(s, "xfree_to_small")) {
        /* main filled the blocks before starting this thread: its first
         * call into the allocator is a free of a block of another thread. */
        check_and_free_every_tier(20);
    } else if (!strcmp(s, "xfree_from_small")) {
        alloc_every_tier(30);
        sem_post(&handed);
        /* main frees them while this thread (their owner) is alive. */
        while (sem_wait(&taken) != 0) {
        }
    } else if (!strcmp(s, "exit_holding")) {
        alloc_every_tier(40);
        /* ... and exit holding them: main frees them after the join. */
    }
    return NULL;
}

static const char *const scenarios[] = {
    "malloc_small",  "malloc_medium", "malloc_large",  "malloc_huge",    "calloc_small",
    "calloc_medium", "calloc_large",  "calloc_huge",   "aligned_64",     "aligned_4k",
    "aligned_64k",   "aligned_2m",    "aligned_8m",    "realloc_tiers",  "xfree_to_small",
    "xfree_from_small", "exit_holding",
};

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s min|32k|8m SCENARIO\n", argv[0]);
        return 2;
    }
    size_t stack;
    if (!strcmp(argv[1], "min")) stack = PTHREAD_STACK_MIN;
    else if (!strcmp(argv[1], "32k")) stack = 32 * KIB;
    else if (!strcmp(argv[1], "8m")) stack = 8 * MIB; /* the control */
    else {
        fprintf(stderr, "unknown stack %s\n", argv[1]);
        return 2;
    }
    scenario = argv[2];
    int known = 0;
    for (size_t k = 0; k < sizeof scenarios / sizeof scenarios[0]; k++)
        known |= !strcmp(scenario, scenarios[k]);
    if (!known) {
        fprintf(stderr, "unknown scenario %s\n", scenario);
        return 2;
    }
    /* The test means nothing unless tlmalloc serves malloc here. */
    if (!dlsym(RTLD_DEFAULT, "tl_version")) {
        fprintf(stderr, "tlmalloc is not loaded (no tl_version)\n");
        return 3;
    }
    printf("stack %zu bytes, scenario %s\n", stack, scenario);
    fflush(stdout);

    sem_init(&handed, 0, 0);
    sem_init(&taken, 0, 0);
    if (!strcmp(scenario, "xfree_to_small")) alloc_every_tier(20);

    pthread_attr_t attr;
    pthread_attr_init(&attr);
    int rc = pthread_attr_setstacksize(&attr, stack);
    if (rc != 0) {
        fprintf(stderr, "pthread_attr_setstacksize(%zu): %s\n", stack, strerror(rc));
        return 2;
    }
    pthread_t th;
    rc = pthread_create(&th, &attr, worker, NULL);
    if (rc != 0) {
        fprintf(stderr, "pthread_create: %s\n", strerror(rc));
        return 2;
    }
    if (!strcmp(scenario, "xfree_from_small")) {
        while (sem_wait(&handed) != 0) {
        }
        check_and_free_every_tier(30);
        sem_post(&taken);
    }
    pthread_join(th, NULL);
    pthread_attr_destroy(&attr);
    if (!strcmp(scenario, "exit_holding")) check_and_free_every_tier(40);

    if (failures) {
        fprintf(stderr, "small_stacks.c:%d: CHECK failed: %s (size %zu); %d checks failed\n",
                fail_line, fail_what, fail_size, failures);
        return 1;
    }
    printf("small_stacks ok: %s %s\n", argv[1], scenario);
    return 0;
}
