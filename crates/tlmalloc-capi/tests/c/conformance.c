/* C conformance of libtlmalloc.so under LD_PRELOAD: every malloc-family
 * function's edge cases (alignment, overflow, errno, zero sizes, usable
 * size, realloc contents), and proof that each symbol resolves to
 * libtlmalloc.so. Built with -O0 -fno-builtin so that every call happens.
 * Prints "N passed, N failed"; exit status 0 when nothing failed. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tlmalloc.h"
#include "check.h"

/* glibc's internal names (exported by glibc, replaced by tlmalloc). */
extern void *__libc_malloc(size_t);
extern void __libc_free(void *);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
extern void *__libc_valloc(size_t);
extern void *__libc_pvalloc(size_t);

/* Volatile sizes keep the compiler from reasoning about the requests. */
static volatile size_t v_size_max = SIZE_MAX;
static volatile size_t v_half = SIZE_MAX / 2 + 1;
static volatile size_t v_ptrdiff_max = PTRDIFF_MAX;
static volatile size_t v_huge = (size_t)1 << 47; /* the whole user address space */

static size_t page;

/* The object that defines `addr`, or "?". */
static const char *object_of(void *addr) {
    Dl_info info;
    if (addr == NULL || dladdr(addr, &info) == 0 || info.dli_fname == NULL) return "?";
    return info.dli_fname;
}

static void *sym(const char *name) {
    void *p = dlsym(RTLD_DEFAULT, name);
    if (p == NULL) {
        fprintf(stderr, "symbol %s not found\n", name);
        exit(2);
    }
    return p;
}

#define TL(name) ((__typeof__(&name))sym(#name))

/* Fill [p, p+n) with a pattern that depends on the offset and `seed`. */
static void fill(void *p, size_t n, unsigned seed) {
    unsigned char *b = p;
    for (size_t i = 0; i < n; i++) b[i] = (unsigned char)(i * 31 + seed);
}

static int intact(const void *p, size_t n, unsigned seed) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i] != (unsigned char)(i * 31 + seed)) return 0;
    return 1;
}

static void test_symbols(void) {
    static const char *names[] = {
        "malloc", "free", "calloc", "realloc", "reallocarray", "posix_memalign",
        "aligned_alloc", "memalign", "valloc", "pvalloc", "malloc_usable_size",
        "free_sized", "free_aligned_sized", "malloc_trim",
        "__libc_malloc", "__libc_free", "__libc_calloc", "__libc_realloc",
        "__libc_memalign", "__libc_valloc", "__libc_pvalloc",
        "tl_malloc", "tl_calloc", "tl_realloc", "tl_reallocarray", "tl_malloc_aligned",
        "tl_free", "tl_free_sized", "tl_free_aligned_sized", "tl_usable_size",
        "tl_good_size", "tl_collect", "tl_print_stats", "tl_version",
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        void *p = dlsym(RTLD_DEFAULT, names[i]);
        const char *obj = object_of(p);
        CHECKF(ends_with(obj, "libtlmalloc.so"), "%s resolves to %s", names[i], obj);
    }
    /* The addresses this program's own calls bind to. */
    void *bound[] = {
        (void *)&malloc, (void *)&free, (void *)&calloc, (void *)&realloc,
        (void *)&reallocarray, (void *)&posix_memalign, (void *)&aligned_alloc,
        (void *)&memalign, (void *)&valloc, (void *)&pvalloc, (void *)&malloc_usable_size,
        (void *)&malloc_trim, (void *)&__libc_malloc, (void *)&__libc_free,
        (void *)&__libc_calloc, (void *)&__libc_realloc, (void *)&__libc_memalign,
        (void *)&__libc_valloc, (void *)&__libc_pvalloc,
    };
    for (size_t i = 0; i < sizeof bound / sizeof bound[0]; i++) {
        const char *obj = object_of(bound[i]);
        CHECKF(ends_with(obj, "libtlmalloc.so"), "bound function %zu resolves to %s", i, obj);
    }
    /* Active, not merely loaded: tl_usable_size only knows tlmalloc's blocks
     * (it aborts on a glibc one). */
    void *p = malloc(100);
    CHECK(TL(tl_usable_size)(p) == malloc_usable_size(p));
    CHECK(TL(tl_usable_size)(p) >= 100);
    free(p);
}

static void test_malloc(void) {
    void *a = malloc(0), *b = malloc(0);
    CHECK(a != NULL && b != NULL && a != b);
    free(a);
    free(b);
    free(NULL);

    static const size_t sizes[] = {
        1, 2, 3, 7, 8, 9, 15, 16, 17, 24, 31, 32, 33, 48, 63, 64, 65, 100, 127, 128, 129,
        255, 256, 257, 511, 512, 513, 1000, 1023, 1024, 1025, 2047, 2048, 4095, 4096,
        4097, 8191, 8192, 8193, 16384, 65535, 65536, 65537, 131071, 131072, 131073,
        262143, 262144, 262145, 1 << 20, (1 << 20) + 1, 4 << 20, (4 << 20) - 1, (4 << 20) + 1, 9 << 20,
    };
    enum { N = sizeof sizes / sizeof sizes[0] };
    void *blocks[N];
    for (size_t i = 0; i < N; i++) {
        size_t n = sizes[i];
        blocks[i] = malloc(n);
        CHECKF(blocks[i] != NULL, "malloc(%zu)", n);
        if (!blocks[i]) continue;
        CHECKF(aligned(blocks[i], n >= 16 ? 16 : 8), "malloc(%zu) = %p", n, blocks[i]);
        size_t usable = malloc_usable_size(blocks[i]);
        CHECKF(usable >= n, "usable %zu < %zu", usable, n);
        fill(blocks[i], usable, (unsigned)i); /* the whole usable size is ours */
    }
    for (size_t i = 0; i < N; i++) {
        if (!blocks[i]) continue;
        CHECKF(intact(blocks[i], malloc_usable_size(blocks[i]), (unsigned)i), "block %zu", sizes[i]);
        free(blocks[i]);
    }

    /* Every size from 0 to 2100, with neighbours checked for overlap. */
    void *prev = NULL;
    size_t prev_n = 0;
    for (size_t n = 0; n <= 2100; n++) {
        void *p = malloc(n);
        CHECKF(p != NULL, "malloc(%zu)", n);
        fill(p, n, 7);
        if (prev) {
            CHECK(intact(prev, prev_n, 7));
            free(prev);
        }
        prev = p;
        prev_n = n;
    }
    free(prev);

    static const size_t huge[] = {SIZE_MAX, SIZE_MAX / 2 + 1, PTRDIFF_MAX, (size_t)1 << 47,
                                  SIZE_MAX - 4095, SIZE_MAX - (4 << 20)};
    for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
        errno = 0;
        void *p = malloc(*(volatile size_t *)&huge[i]);
        CHECKF(p == NULL && errno == ENOMEM, "malloc(%zu) = %p, errno %d", huge[i], p, errno);
    }

    /* errno untouched on success, including on slow paths. */
    errno = 4321;
    void *big = malloc(3 << 20);
    void *small = malloc(10);
    CHECK(errno == 4321);
    free(big);
    free(small);
    CHECK(errno == 4321);
}

static void test_calloc(void) {
    void *p = calloc(0, 0), *q = calloc(0, 10), *r = calloc(10, 0);
    CHECK(p && q && r && p != q && q != r);
    free(p);
    free(q);
    free(r);

    static const size_t sizes[] = {1, 8, 24, 100, 1000, 5000, 70000, 200000, 3 << 20, 10 << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t n = sizes[i];
        for (int round = 0; round < 3; round++) {
            /* Dirty a block of this size, free it, and calloc: a reused block must be zeroed. */
            void *dirty = malloc(n);
            memset(dirty, 0xAB, malloc_usable_size(dirty));
            free(dirty);
            unsigned char *z = calloc(1, n);
            CHECKF(z != NULL && all_zero(z, n), "calloc(1, %zu)", n);
            free(z);
            z = calloc(n, 1);
            CHECKF(z != NULL && all_zero(z, n), "calloc(%zu, 1)", n);
            free(z);
        }
    }
    int *ints = calloc(1000, sizeof(int));
    CHECK(ints && all_zero(ints, 1000 * sizeof(int)));
    free(ints);

    errno = 0;
    CHECK(calloc(v_half, 2) == NULL && errno == ENOMEM);
    errno = 0;
    CHECK(calloc(SIZE_MAX / 3 + 1, *(volatile size_t *)&(size_t){3}) == NULL && errno == ENOMEM);
    errno = 0;
    CHECK(calloc((size_t)1 << 32, *(volatile size_t *)&(size_t){(size_t)1 << 32}) == NULL && errno == ENOMEM);
    errno = 0;
    CHECK(calloc(v_size_max, 1) == NULL && errno == ENOMEM);
    errno = 0;
    CHECK(calloc(1, v_huge) == NULL && errno == ENOMEM);
}

static void test_realloc(void) {
    /* realloc(NULL, n) is malloc(n); realloc(NULL, 0) is malloc(0). */
    void *p = realloc(NULL, 100);
    CHECK(p != NULL && malloc_usable_size(p) >= 100);
    free(p);
    p = realloc(NULL, 0);
    CHECK(p != NULL);
    free(p);

    /* Grow through every kind of block, then shrink back, keeping contents. */
    static const size_t steps[] = {1, 7, 8, 9, 16, 33, 100, 1000, 1024, 1025, 5000, 8192, 8193,
                                   70000, 131072, 131073, 200000, 1 << 20, 5 << 20, 20 << 20,
                                   5 << 20, 200000, 70000, 5000, 1000, 100, 9, 1};
    size_t old = 1;
    unsigned char *b = malloc(1);
    fill(b, 1, 3);
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        size_t n = steps[i];
        unsigned char *q = realloc(b, n);
        CHECKF(q != NULL, "realloc to %zu", n);
        if (!q) break;
        size_t keep = old < n ? old : n;
        CHECKF(intact(q, keep, 3), "realloc %zu -> %zu lost contents", old, n);
        CHECK(malloc_usable_size(q) >= n);
        fill(q, n, 3);
        b = q;
        old = n;
    }
    free(b);
    /* A block asked again for its own size stays where it is. */
    b = malloc(1000);
    CHECK(realloc(b, 1000) == b);
    CHECK(realloc(b, malloc_usable_size(b)) == b);

    /* Too large: NULL, ENOMEM, the block untouched. */
    unsigned char *c = malloc(300);
    fill(c, 300, 9);
    errno = 0;
    CHECK(realloc(c, v_size_max) == NULL && errno == ENOMEM);
    errno = 0;
    CHECK(realloc(c, v_ptrdiff_max) == NULL && errno == ENOMEM);
    errno = 0;
    CHECK(realloc(c, v_huge) == NULL && errno == ENOMEM);
    CHECK(intact(c, 300, 9) && malloc_usable_size(c) >= 300);

    /* Zero size: freed, NULL returned (glibc), errno untouched. */
    errno = 777;
    CHECK(realloc(c, 0) == NULL);
    CHECK(errno == 777);
    free(b);

    /* Shrinking a large block a lot returns memory but keeps the prefix. */
    unsigned char *l = malloc(8 << 20);
    fill(l, 8 << 20, 5);
    l = realloc(l, 64);
    CHECK(l && intact(l, 64, 5));
    free(l);
}

static void test_reallocarray(void) {
    int *a = reallocarray(NULL, 10, sizeof(int));
    CHECK(a != NULL);
    for (int i = 0; i < 10; i++) a[i] = i;
    int *b = reallocarray(a, 1000, sizeof(int));
    CHECK(b != NULL);
    int ok = 1;
    for (int i = 0; i < 10; i++) ok &= b[i] == i;
    CHECK(ok);
    int *volatile same = b; /* the failing calls leave b alive */
    errno = 0;
    CHECK(reallocarray(same, v_half, 2) == NULL && errno == ENOMEM);
    errno = 0;
    CHECK(reallocarray(same, v_size_max, v_size_max) == NULL && errno == ENOMEM);
    ok = 1;
    for (int i = 0; i < 10; i++) ok &= b[i] == i;
    CHECK(ok); /* untouched after the failures */
    CHECK(reallocarray(b, 0, 10) == NULL); /* realloc(b, 0): freed */
}

static void test_posix_memalign(void) {
    static const size_t bad[] = {0, 1, 2, 3, 4, 12, 24, 40, 48, 96, 4097, SIZE_MAX};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        void *out = (void *)0x1234;
        errno = 4321;
        int rc = posix_memalign(&out, bad[i], 64);
        CHECKF(rc == EINVAL, "posix_memalign(align %zu) = %d", bad[i], rc);
        CHECK(out == (void *)0x1234);
        CHECK(errno == 4321);
    }
    static const size_t aligns[] = {8, 16, 32, 64, 128, 256, 512, 4096, 8192, 65536, 131072,
                                    1 << 20, 1 << 22, 1 << 23, 1 << 24};
    static const size_t sizes[] = {0, 1, 8, 100, 4096, 100000, 1 << 21, 5 << 20};
    for (size_t i = 0; i < sizeof aligns / sizeof aligns[0]; i++) {
        for (size_t j = 0; j < sizeof sizes / sizeof sizes[0]; j++) {
            void *out = NULL;
            errno = 4321;
            int rc = posix_memalign(&out, aligns[i], sizes[j]);
            CHECKF(rc == 0 && out != NULL, "posix_memalign(%zu, %zu) = %d", aligns[i], sizes[j], rc);
            CHECKF(errno == 4321, "posix_memalign(%zu, %zu) changed errno to %d", aligns[i], sizes[j], errno);
            if (!out) continue;
            CHECKF(aligned(out, aligns[i]), "posix_memalign(%zu, %zu) = %p", aligns[i], sizes[j], out);
            CHECK(malloc_usable_size(out) >= sizes[j]);
            memset(out, 0x5A, sizes[j]);
            free(out);
        }
    }
    void *out = (void *)0x1234;
    errno = 4321;
    CHECK(posix_memalign(&out, 64, v_size_max) == ENOMEM);
    CHECK(posix_memalign(&out, 4096, v_huge) == ENOMEM);
    CHECK(posix_memalign(&out, 1 << 22, v_ptrdiff_max) == ENOMEM);
    /* Like glibc (whose tests expect it): errno is ENOMEM after a failure. */
    CHECK(out == (void *)0x1234 && errno == ENOMEM);
    errno = 4321;
    CHECK(posix_memalign(&out, 3, 64) == EINVAL); /* a bad alignment leaves errno alone */
    CHECK(out == (void *)0x1234 && errno == 4321);
}

static void test_aligned_alloc(void) {
    static const size_t aligns[] = {1, 2, 4, 8, 16, 32, 64, 1024, 4096, 65536, 1 << 20, 1 << 22};
    for (size_t i = 0; i < sizeof aligns / sizeof aligns[0]; i++) {
        void *p = aligned_alloc(aligns[i], 3 * aligns[i]);
        CHECKF(p != NULL && aligned(p, aligns[i]), "aligned_alloc(%zu) = %p", aligns[i], p);
        CHECK(malloc_usable_size(p) >= 3 * aligns[i]);
        free(p);
        p = aligned_alloc(aligns[i], 1);
        CHECK(p != NULL && aligned(p, aligns[i]));
        free(p);
    }
    static const size_t bad[] = {0, 3, 24, 100, SIZE_MAX};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        errno = 0;
        void *p = aligned_alloc(bad[i], 64);
        CHECKF(p == NULL && errno == EINVAL, "aligned_alloc(%zu) = %p errno %d", bad[i], p, errno);
    }
    errno = 0;
    CHECK(aligned_alloc(64, v_size_max) == NULL && errno == ENOMEM);
}

static void test_memalign_valloc(void) {
    void *p = memalign(24, 100); /* glibc rounds the alignment up to 32 */
    CHECK(p != NULL && aligned(p, 32) && malloc_usable_size(p) >= 100);
    free(p);
    p = memalign(0, 10);
    CHECK(p != NULL);
    free(p);
    p = memalign(4096, 1);
    CHECK(p != NULL && aligned(p, 4096));
    free(p);
    p = memalign(1 << 22, 5000);
    CHECK(p != NULL && aligned(p, 1 << 22));
    free(p);
    errno = 0;
    CHECK(memalign(v_half + 1, 10) == NULL && errno == EINVAL);
    errno = 0;
    CHECK(memalign(64, v_size_max) == NULL && errno == ENOMEM);

    p = valloc(1);
    CHECK(p != NULL && aligned(p, page));
    free(p);
    p = valloc(10000);
    CHECK(p != NULL && aligned(p, page) && malloc_usable_size(p) >= 10000);
    free(p);
    errno = 0;
    CHECK(valloc(v_size_max) == NULL && errno == ENOMEM);

    p = pvalloc(1);
    CHECK(p != NULL && aligned(p, page) && malloc_usable_size(p) >= page);
    free(p);
    p = pvalloc(0);
    CHECK(p != NULL && aligned(p, page) && malloc_usable_size(p) >= page);
    free(p);
    p = pvalloc(page + 1);
    CHECK(p != NULL && aligned(p, page) && malloc_usable_size(p) >= 2 * page);
    free(p);
    errno = 0;
    CHECK(pvalloc(v_size_max) == NULL && errno == ENOMEM);
}

static void test_usable_and_free_variants(void) {
    CHECK(malloc_usable_size(NULL) == 0);
    void (*free_sized_fn)(void *, size_t) = (void (*)(void *, size_t))sym("free_sized");
    void (*free_aligned_sized_fn)(void *, size_t, size_t) =
        (void (*)(void *, size_t, size_t))sym("free_aligned_sized");
    for (size_t n = 1; n < 300000; n = n * 3 + 1) {
        void *p = malloc(n);
        CHECK(p && malloc_usable_size(p) >= n);
        free_sized_fn(p, n);
        void *q = aligned_alloc(256, n);
        CHECK(q && aligned(q, 256));
        free_aligned_sized_fn(q, 256, n);
    }
    free_sized_fn(NULL, 0);
    free_aligned_sized_fn(NULL, 64, 0);
    int trimmed = malloc_trim(0);
    CHECK(trimmed == 0 || trimmed == 1);
}

static void test_libc_aliases(void) {
    void *p = __libc_malloc(100);
    CHECK(p && malloc_usable_size(p) >= 100);
    p = __libc_realloc(p, 10000);
    CHECK(p && malloc_usable_size(p) >= 10000);
    __libc_free(p);
    unsigned char *z = __libc_calloc(100, 10);
    CHECK(z && all_zero(z, 1000));
    free(z);
    p = __libc_memalign(128, 1000);
    CHECK(p && aligned(p, 128));
    free(p);
    p = __libc_valloc(100);
    CHECK(p && aligned(p, page));
    __libc_free(p);
    p = __libc_pvalloc(100);
    CHECK(p && aligned(p, page) && malloc_usable_size(p) >= page);
    __libc_free(p);
    errno = 0;
    CHECK(__libc_malloc(v_size_max) == NULL && errno == ENOMEM);
}

static void test_tl_api(void) {
    CHECK(TL(tl_good_size)(100) >= 100);
    CHECK(TL(tl_good_size)(0) >= 1);
    CHECK(TL(tl_good_size)(SIZE_MAX) == SIZE_MAX);
    for (size_t n = 0; n < 200000; n = n * 2 + 3) {
        void *p = TL(tl_malloc)(n);
        CHECK(p != NULL);
        CHECKF(TL(tl_usable_size)(p) == TL(tl_good_size)(n), "n = %zu", n);
        TL(tl_free_sized)(p, n);
    }
    void *a = TL(tl_malloc_aligned)(100, 64);
    CHECK(a && aligned(a, 64));
    TL(tl_free_aligned_sized)(a, 64, 100);
    errno = 0;
    CHECK(TL(tl_malloc_aligned)(100, 3) == NULL && errno == EINVAL);
    unsigned char *z = TL(tl_calloc)(10, 10);
    CHECK(z && all_zero(z, 100));
    fill(z, 100, 1);
    z = TL(tl_realloc)(z, 5000);
    CHECK(z && intact(z, 100, 1));
    errno = 0;
    CHECK(TL(tl_reallocarray)(z, v_half, 2) == NULL && errno == ENOMEM);
    CHECK(TL(tl_realloc)(z, 0) == NULL);
    errno = 0;
    CHECK(TL(tl_malloc)(v_size_max) == NULL && errno == ENOMEM);
    TL(tl_free)(NULL);
    CHECK(TL(tl_usable_size)(NULL) == 0);
    TL(tl_collect)(1);
    TL(tl_collect)(0);
    const char *version = TL(tl_version)();
    CHECK(version != NULL && strchr(version, '.') != NULL);

    int fds[2];
    CHECK(pipe(fds) == 0);
    TL(tl_print_stats)(fds[1]);
    close(fds[1]);
    char text[2048];
    ssize_t n = read(fds[0], text, sizeof text - 1);
    close(fds[0]);
    text[n > 0 ? n : 0] = 0;
    CHECKF(strstr(text, "tlmalloc stats") && strstr(text, "mmap calls"), "stats text: %s", text);
}

/* Blocks libc allocates internally are ours too, and freed by our free. */
static void test_libc_internal(void) {
    char *s = strdup("hello, tlmalloc");
    CHECK(s && TL(tl_usable_size)(s) >= 16);
    free(s);
    char *line = NULL;
    size_t cap = 0;
    FILE *f = fmemopen("first line\nsecond line\n", 23, "r");
    CHECK(f != NULL);
    CHECK(getline(&line, &cap, f) == 11 && strcmp(line, "first line\n") == 0);
    CHECK(TL(tl_usable_size)(line) >= cap);
    fclose(f);
    free(line);
    char *msg = NULL;
    CHECK(asprintf(&msg, "%d %s %f", 42, "x", 1.5) > 0 && strcmp(msg, "42 x 1.500000") == 0);
    free(msg);
    char *cwd = getcwd(NULL, 0);
    CHECK(cwd != NULL);
    free(cwd);
    char *buf = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&buf, &len);
    for (int i = 0; i < 10000; i++) fprintf(mem, "%d,", i);
    fclose(mem);
    CHECK(len > 40000 && strncmp(buf, "0,1,2,", 6) == 0);
    free(buf);
}

static void *thread_work(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg;
    void *slots[256] = {0};
    for (int i = 0; i < 50000; i++) {
        seed = seed * 1103515245 + 12345;
        unsigned k = (seed >> 8) & 255;
        if (slots[k]) {
            if (!intact(slots[k], 8, k)) return (void *)1;
            free(slots[k]);
            slots[k] = NULL;
        } else {
            size_t n = 8 + ((seed >> 16) % 3000);
            slots[k] = malloc(n);
            fill(slots[k], 8, k);
        }
    }
    /* Leave half for the main thread: cross-thread frees. */
    for (int k = 0; k < 128; k++) {
        free(slots[k]);
        slots[k] = NULL;
    }
    void **rest = malloc(sizeof slots);
    memcpy(rest, slots, sizeof slots);
    return rest;
}

static void test_threads(void) {
    pthread_t t[4];
    for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, thread_work, (void *)(uintptr_t)(i + 1));
    for (int i = 0; i < 4; i++) {
        void *r = NULL;
        pthread_join(t[i], &r);
        CHECK(r != NULL && r != (void *)1);
        if (r == NULL || r == (void *)1) continue;
        void **rest = r;
        for (int k = 0; k < 256; k++) free(rest[k]);
        free(rest);
    }
}

int main(void) {
    page = (size_t)sysconf(_SC_PAGESIZE);
    test_symbols();
    test_malloc();
    test_calloc();
    test_realloc();
    test_reallocarray();
    test_posix_memalign();
    test_aligned_alloc();
    test_memalign_valloc();
    test_usable_and_free_variants();
    test_libc_aliases();
    test_tl_api();
    test_libc_internal();
    test_threads();
    return check_done();
}
