/* errno after each failing entry point, out of address space under
 * RLIMIT_AS (as glibc's tst-malloc-thread-fail runs), under LD_PRELOAD.
 *
 *   errno_enomem [LIMIT_MB]      (default 200)
 *
 * After a small warm-up the program sets RLIMIT_AS to LIMIT_MB, then runs
 * the same checks on the main thread and on 4 threads with
 * PTHREAD_STACK_MIN (16 KiB) stacks, each thread's first call into the
 * allocator being a failing one. Each check presets errno to 0 and calls an
 * entry point with a request that cannot fit (1 GiB, and SIZE_MAX/2 or an
 * overflowing product where the function takes one):
 * - malloc, calloc (also calloc(SIZE_MAX/2, 4)), memalign, valloc, pvalloc,
 *   aligned_alloc: NULL and errno == ENOMEM;
 * - realloc(p, huge) and reallocarray(p, n, m) (huge and overflowing): NULL,
 *   errno == ENOMEM, and p untouched (its contents kept, still usable);
 * - posix_memalign: returns ENOMEM, *out untouched, and errno == ENOMEM
 *   (as glibc, mimalloc and tcmalloc leave it);
 * - bad alignments: posix_memalign(&out, 3 or 24, n) returns EINVAL;
 *   aligned_alloc(3, n) is NULL with errno == EINVAL.
 * Then the allocator must have recovered: small, medium and large blocks
 * and aligned ones are allocated and used.
 *
 * A failed check prints one line naming the function and the threads it
 * failed on ("errno_enomem: FAIL line N: <call> -> NULL, errno ENOMEM:
 * returned ..., errno ...; on main thread, ..."); the program exits 1 if
 * any failed. On success prints "errno_enomem ok: ..." and exits 0. The
 * small-stack threads never print: they record their failures for main. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define GIB ((size_t)1 << 30)
#define HALF (SIZE_MAX / 2)

/* A failed check, kept until main prints it. */
struct failure {
    const char *where;
    const char *what;
    int line;
    long ret; /* the return value (a pointer as an integer, or an error number) */
    int err;  /* errno after the call */
    const char *arg_name; /* "alignment" or "size", or NULL */
    size_t arg;           /* the alignment or size the check was about */
};

#define MAX_FAILURES 256
static struct failure failures[MAX_FAILURES];
static int nfailures, nchecks;

static void record(const char *where, const char *what, int line, long ret, int err, const char *arg_name,
                   size_t arg) {
    int i = __atomic_fetch_add(&nfailures, 1, __ATOMIC_SEQ_CST);
    if (i < MAX_FAILURES) failures[i] = (struct failure){where, what, line, ret, err, arg_name, arg};
}

/* Check `cond` about a call whose result is `ret` and whose errno is `err`;
 * `what` names the check. */
#define CHECK_ARG(cond, what, ret, err, arg_name, arg)                                   \
    do {                                                                                \
        __atomic_fetch_add(&nchecks, 1, __ATOMIC_RELAXED);                              \
        if (!(cond)) record(where, (what), __LINE__, (long)(ret), (err), (arg_name), (arg)); \
    } while (0)
#define CHECK_CALL(cond, what, ret, err) CHECK_ARG(cond, what, ret, err, NULL, 0)

/* `call` must return NULL with errno == `want` (errno preset to 0). */
#define NULL_WITH(want, call)                                                         \
    do {                                                                              \
        errno = 0;                                                                    \
        void *r_ = (call);                                                            \
        int e_ = errno;                                                               \
        CHECK_CALL(r_ == NULL && e_ == (want), #call " -> NULL, errno " #want, (intptr_t)r_, e_); \
        free(r_);                                                                     \
    } while (0)

/* `call` (a realloc or reallocarray of `p`) must fail, leaving `p`. */
#define REALLOC_FAILS(p, call)                                                        \
    do {                                                                              \
        errno = 0;                                                                    \
        void *r_ = (call);                                                            \
        int e_ = errno;                                                               \
        CHECK_CALL(r_ == NULL && e_ == ENOMEM, #call " -> NULL, errno ENOMEM", (intptr_t)r_, e_); \
        if (r_) (p) = r_;                                                             \
    } while (0)

static unsigned char pat(size_t i) { return (unsigned char)(i * 7u + 3u); }

static void fill(unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = pat(i);
}

static int holds(const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != pat(i)) return 0;
    return 1;
}

/* Every check, from the calling thread; `where` names it in failures. */
static void checks(const char *where) {
    volatile size_t huge = GIB; /* volatile: no compile-time size warnings or folding */
    volatile size_t half = HALF;

    /* The first call of a fresh thread fails: its heap is set up on the way. */
    NULL_WITH(ENOMEM, malloc(huge));
    NULL_WITH(ENOMEM, malloc(half));

    NULL_WITH(ENOMEM, calloc(1, huge));
    NULL_WITH(ENOMEM, calloc(huge / KIB, KIB));
    NULL_WITH(ENOMEM, calloc(half, 4)); /* the product overflows */
    NULL_WITH(ENOMEM, calloc(4, half));

    /* realloc and reallocarray: p untouched and still usable, every tier. */
    static const size_t sizes[] = {100, 64 * KIB, 1 * MIB};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        unsigned char *p = malloc(n);
        CHECK_CALL(p != NULL, "malloc before realloc", (intptr_t)p, errno);
        if (!p) continue;
        fill(p, n);
        REALLOC_FAILS(p, realloc(p, huge));
        REALLOC_FAILS(p, realloc(p, half));
        REALLOC_FAILS(p, reallocarray(p, half, 4)); /* overflow */
        REALLOC_FAILS(p, reallocarray(p, huge / KIB, KIB));
        CHECK_CALL(holds(p, n), "realloc/reallocarray failure kept the block", 0, 0);
        unsigned char *q = realloc(p, n * 2);
        CHECK_CALL(q != NULL, "realloc after a failed realloc", (intptr_t)q, errno);
        if (q) {
            CHECK_CALL(holds(q, n), "realloc after a failed realloc kept the contents", 0, 0);
            p = q;
        }
        free(p);
    }
    NULL_WITH(ENOMEM, realloc(NULL, huge));
    NULL_WITH(ENOMEM, reallocarray(NULL, half, 4));
    NULL_WITH(ENOMEM, reallocarray(NULL, huge / KIB, KIB));

    /* posix_memalign: the error is returned, *out untouched, errno ENOMEM. */
    static const size_t aligns[] = {8, 64, 4 * KIB, 2 * MIB};
    for (size_t a = 0; a < sizeof aligns / sizeof aligns[0]; a++) {
        void *out = (void *)0x1234;
        errno = 0;
        int rc = posix_memalign(&out, aligns[a], huge);
        int e = errno;
        CHECK_ARG(rc == ENOMEM, "posix_memalign(huge) returns ENOMEM", rc, e, "alignment", aligns[a]);
        CHECK_ARG(e == ENOMEM, "posix_memalign(huge) sets errno = ENOMEM", rc, e, "alignment", aligns[a]);
        CHECK_ARG(out == (void *)0x1234, "posix_memalign(huge) leaves *out", (intptr_t)out, e, "alignment", aligns[a]);
        out = (void *)0x1234;
        errno = 0;
        rc = posix_memalign(&out, aligns[a], half);
        e = errno;
        CHECK_ARG(rc == ENOMEM, "posix_memalign(SIZE_MAX/2) returns ENOMEM", rc, e, "alignment", aligns[a]);
        CHECK_ARG(e == ENOMEM, "posix_memalign(SIZE_MAX/2) sets errno = ENOMEM", rc, e, "alignment", aligns[a]);
        CHECK_ARG(out == (void *)0x1234, "posix_memalign(SIZE_MAX/2) leaves *out", (intptr_t)out, e, "alignment", aligns[a]);
    }
    static const size_t bad_aligns[] = {0, 3, 24, 4 * KIB + 8};
    for (size_t a = 0; a < sizeof bad_aligns / sizeof bad_aligns[0]; a++) {
        void *out = (void *)0x1234;
        int rc = posix_memalign(&out, bad_aligns[a], 64);
        CHECK_ARG(rc == EINVAL, "posix_memalign(bad alignment) returns EINVAL", rc, errno, "alignment", bad_aligns[a]);
        CHECK_ARG(out == (void *)0x1234, "posix_memalign(bad alignment) leaves *out", (intptr_t)out, errno, "alignment", bad_aligns[a]);
    }

    NULL_WITH(ENOMEM, aligned_alloc(64, huge));
    NULL_WITH(ENOMEM, aligned_alloc(4 * KIB, huge));
    NULL_WITH(ENOMEM, aligned_alloc(64, half));
    NULL_WITH(EINVAL, aligned_alloc(3, 64));

    NULL_WITH(ENOMEM, memalign(64, huge));
    NULL_WITH(ENOMEM, memalign(2 * MIB, huge));
    NULL_WITH(ENOMEM, memalign(4 * KIB, half));

    NULL_WITH(ENOMEM, valloc(huge));
    NULL_WITH(ENOMEM, valloc(half));

    NULL_WITH(ENOMEM, pvalloc(huge));
    NULL_WITH(ENOMEM, pvalloc(half));

    /* Recovered: blocks of every tier, and aligned ones, work again. */
    static const size_t after[] = {16, 100, 1000, 64 * KIB, 1 * MIB, 8 * MIB};
    for (size_t s = 0; s < sizeof after / sizeof after[0]; s++) {
        unsigned char *p[16];
        int held = after[s] >= MIB ? 4 : 16; /* at most 32 MiB at once: well under the limit */
        for (int i = 0; i < held; i++) {
            p[i] = malloc(after[s]);
            CHECK_ARG(p[i] != NULL, "malloc after the failures", 0, errno, "size", after[s]);
            if (p[i]) fill(p[i], after[s] < 4096 ? after[s] : 4096);
        }
        for (int i = 0; i < held; i++) {
            if (p[i]) CHECK_CALL(holds(p[i], after[s] < 4096 ? after[s] : 4096), "block after the failures", 0, 0);
            free(p[i]);
        }
    }
    void *out = NULL;
    int rc = posix_memalign(&out, 4 * KIB, 100 * KIB);
    CHECK_CALL(rc == 0 && out != NULL, "posix_memalign after the failures", rc, errno);
    free(out);
    void *c = calloc(1000, 1000);
    CHECK_CALL(c != NULL, "calloc after the failures", (intptr_t)c, errno);
    free(c);
}

static void *thread_checks(void *arg) {
    static const char *names[] = {"thread 1 (16 KiB stack)", "thread 2 (16 KiB stack)", "thread 3 (16 KiB stack)",
                                  "thread 4 (16 KiB stack)"};
    checks(names[(intptr_t)arg]);
    return NULL;
}

/* VmSize of this process in KiB, or -1. */
static long vm_size_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long kib = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmSize: %ld kB", &kib) == 1) break;
    fclose(f);
    return kib;
}

int main(int argc, char **argv) {
    long limit_mb = argc > 1 ? atol(argv[1]) : 200;
    setvbuf(stdout, NULL, _IONBF, 0);

    /* Warm-up: the allocator is set up before the limit. */
    for (int i = 0; i < 100; i++) free(malloc((size_t)i * 100 + 1));
    free(malloc(1 * MIB));

    long before = vm_size_kib();
    struct rlimit rl = {(rlim_t)limit_mb * MIB, (rlim_t)limit_mb * MIB};
    if (setrlimit(RLIMIT_AS, &rl) != 0) {
        perror("errno_enomem: setrlimit(RLIMIT_AS)");
        return 1;
    }
    if (before < 0 || before / 1024 + 64 > limit_mb) {
        fprintf(stderr, "errno_enomem: VmSize %ld KiB leaves too little under a %ld MB limit\n", before, limit_mb);
        return 1;
    }

    enum { THREADS = 4 };
    pthread_t t[THREADS];
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    size_t stack = PTHREAD_STACK_MIN;
    if (pthread_attr_setstacksize(&attr, stack) != 0) {
        fprintf(stderr, "errno_enomem: pthread_attr_setstacksize(%zu) failed\n", stack);
        return 1;
    }
    for (intptr_t i = 0; i < THREADS; i++) {
        int rc = pthread_create(&t[i], &attr, thread_checks, (void *)i);
        if (rc != 0) {
            fprintf(stderr, "errno_enomem: pthread_create: %s\n", strerror(rc));
            return 1;
        }
        pthread_join(t[i], NULL); /* one at a time: the limit is shared */
    }
    checks("main thread");

    /* One line per failed check, naming every thread it failed on. */
    int n = nfailures < MAX_FAILURES ? nfailures : MAX_FAILURES;
    for (int i = 0; i < n; i++) {
        const struct failure *f = &failures[i];
        int seen = 0;
        for (int j = 0; j < i && !seen; j++)
            seen = failures[j].line == f->line && failures[j].arg == f->arg && failures[j].ret == f->ret &&
                   failures[j].err == f->err;
        if (seen) continue;
        char arg[64] = "";
        if (f->arg_name) snprintf(arg, sizeof arg, " (%s %zu)", f->arg_name, f->arg);
        printf("errno_enomem: FAIL line %d: %s%s: returned %ld (%#lx), errno %d (%s); on %s", f->line, f->what, arg,
               f->ret, (unsigned long)f->ret, f->err,
               f->err == 0 ? "0" : f->err == ENOMEM ? "ENOMEM" : f->err == EINVAL ? "EINVAL" : "other", f->where);
        for (int j = i + 1; j < n; j++)
            if (failures[j].line == f->line && failures[j].arg == f->arg && failures[j].ret == f->ret &&
                failures[j].err == f->err && strcmp(failures[j].where, f->where) != 0)
                printf(", %s", failures[j].where);
        printf("\n");
    }
    if (nfailures) {
        printf("errno_enomem: %d of %d checks failed (huge: 1 GiB, half: SIZE_MAX/2; VmSize %ld KiB before the %ld MB "
               "limit; stacks %zu bytes)\n",
               nfailures, nchecks, before, limit_mb, stack);
        return 1;
    }
    printf("errno_enomem ok: %d checks on the main thread and %d threads with %zu-byte stacks\n", nchecks, THREADS,
           stack);
    return 0;
}
