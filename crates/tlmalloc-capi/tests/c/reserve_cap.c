/* Run with TLMALLOC_MAX_RESERVED=64m: every allocation function fails with
 * ENOMEM once the cap is reached (the core makes no OS call that would set
 * errno then). Prints "N passed, N failed". */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

int main(void) {
    errno = 0;
    CHECK(malloc(100 << 20) == NULL && errno == ENOMEM);
    errno = 0;
    CHECK(calloc(100, 1 << 20) == NULL && errno == ENOMEM);
    void *p = malloc(100);
    errno = 0;
    CHECK(realloc(p, 100 << 20) == NULL && errno == ENOMEM);
    free(p);
    void *out = NULL;
    CHECK(posix_memalign(&out, 4096, 100 << 20) == ENOMEM && out == NULL);
    errno = 0;
    CHECK(aligned_alloc(64, 100 << 20) == NULL && errno == ENOMEM);
    errno = 0;
    CHECK(memalign(1 << 22, 100 << 20) == NULL && errno == ENOMEM);

    /* Fill the cap with medium and small blocks: the last one fails with ENOMEM. */
    static void *held[1 << 20];
    size_t n = 0;
    errno = 0;
    while (n < sizeof held / sizeof held[0] && (held[n] = malloc(200000)) != NULL) n++;
    CHECKF(held[n] == NULL && errno == ENOMEM, "200 KB blocks: %zu, errno %d", n, errno);
    size_t m = n;
    errno = 0;
    while (m < sizeof held / sizeof held[0] && (held[m] = malloc(64)) != NULL) m++;
    CHECKF(m < sizeof held / sizeof held[0] && errno == ENOMEM, "64-byte blocks: %zu, errno %d", m - n, errno);
    for (size_t i = 0; i < m; i++) free(held[i]);
    /* Memory is usable again after the frees. */
    void *again = malloc(100000);
    CHECK(again != NULL);
    free(again);
    return check_done();
}
