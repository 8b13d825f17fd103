/* A tiny check framework for the conformance programs: CHECK counts, a
 * failure prints its line, and check_done() prints "N passed, N failed" and
 * returns the exit status. Also the predicates several programs check
 * with (C and C++). */
#ifndef TL_TEST_CHECK_H
#define TL_TEST_CHECK_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static int check_passed, check_failed;

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (cond) {                                                                  \
            check_passed++;                                                          \
        } else {                                                                     \
            check_failed++;                                                          \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                            \
    } while (0)

#define CHECKF(cond, ...)                                                            \
    do {                                                                             \
        if (cond) {                                                                  \
            check_passed++;                                                          \
        } else {                                                                     \
            check_failed++;                                                          \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                            \
            fputc('\n', stderr);                                                     \
        }                                                                            \
    } while (0)

static int check_done(void) {
    printf("%d passed, %d failed\n", check_passed, check_failed);
    fflush(stdout);
    return check_failed == 0 ? 0 : 1;
}

/* Whether `p` is a multiple of `a` (a power of two). */
static inline int aligned(const void *p, size_t a) { return ((uintptr_t)p & (a - 1)) == 0; }

/* Whether the `n` bytes at `p` are all zero. */
static inline int all_zero(const void *p, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    for (size_t i = 0; i < n; i++)
        if (b[i] != 0) return 0;
    return 1;
}

/* Whether the string `s` ends with `suffix`. */
static inline int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

#endif
