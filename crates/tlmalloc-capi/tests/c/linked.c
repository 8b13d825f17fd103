/* Linked against libtlmalloc (pkg-config, or the static archive), no
 * preload: the tl_ API from tlmalloc.h, and malloc itself replaced. argv[1]
 * is the file malloc must resolve to ("libtlmalloc.so.0", or the program
 * itself when linked statically). Prints "N passed, N failed". */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tlmalloc.h"
#include "check.h"

static int resolves_to(void *fn, const char *suffix) {
    Dl_info info;
    if (dladdr(fn, &info) == 0 || info.dli_fname == NULL) return 0;
    size_t n = strlen(info.dli_fname), m = strlen(suffix);
    return n >= m && strcmp(info.dli_fname + n - m, suffix) == 0;
}

int main(int argc, char **argv) {
    const char *where = argc > 1 ? argv[1] : "libtlmalloc.so.0";
    CHECK(resolves_to((void *)&malloc, where));
    CHECK(resolves_to((void *)&free, where));
    CHECK(resolves_to((void *)&tl_malloc, where));

    void *p = malloc(100);
    CHECK(tl_usable_size(p) == malloc_usable_size(p) && tl_usable_size(p) >= 100);
    free(p);
    char *s = strdup("libc's own allocation is ours too");
    CHECK(tl_usable_size(s) >= strlen(s) + 1);
    tl_free(s);

    void *q = tl_malloc(1000);
    CHECK(q != NULL && tl_usable_size(q) == tl_good_size(1000));
    q = tl_realloc(q, 100000);
    CHECK(q != NULL && tl_usable_size(q) >= 100000);
    tl_free_sized(q, 100000);
    void *a = tl_malloc_aligned(300, 4096);
    CHECK(a != NULL && ((uintptr_t)a & 4095) == 0);
    tl_free_aligned_sized(a, 4096, 300);
    unsigned char *z = tl_calloc(100, 100);
    int zero = 1;
    for (int i = 0; i < 10000; i++) zero &= z[i] == 0;
    CHECK(zero);
    z = tl_reallocarray(z, 200, 100);
    CHECK(z != NULL);
    tl_free(z);
    errno = 0;
    CHECK(tl_malloc(SIZE_MAX) == NULL && errno == ENOMEM);
    CHECK(tl_good_size(SIZE_MAX) == SIZE_MAX);
    tl_collect(1);
    tl_collect(0);
    /* The header and the library agree on the version. */
    char header_version[48];
    snprintf(header_version, sizeof header_version, "%d.%d.%d", TLMALLOC_VERSION_MAJOR,
             TLMALLOC_VERSION_MINOR, TLMALLOC_VERSION_PATCH);
    CHECK(strcmp(tl_version(), header_version) == 0);
    return check_done();
}
