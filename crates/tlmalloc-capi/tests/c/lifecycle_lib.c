/* A library the lifecycle program links against (DT_NEEDED) or dlopens:
 * its constructor allocates while the dynamic loader is still running
 * constructors, and its destructor frees at exit or dlclose. */
#include <stdlib.h>
#include <string.h>

#define KEPT 64
static char *kept[KEPT];

static size_t size_of(int i) { return (size_t)i * 37 + 1 + (i % 8 == 0 ? 100000 : 0); }

__attribute__((constructor)) static void lib_ctor(void) {
    for (int i = 0; i < KEPT; i++) {
        kept[i] = malloc(size_of(i));
        memset(kept[i], i, size_of(i));
    }
    char *s = strdup("allocated in a constructor run by the dynamic loader");
    free(s);
}

/* 1 when every block allocated by the constructor is intact. */
int lifecycle_lib_check(void) {
    for (int i = 0; i < KEPT; i++) {
        if (kept[i] == NULL) return 0;
        for (size_t j = 0; j < size_of(i); j++)
            if (kept[i][j] != (char)i) return 0;
    }
    return 1;
}

__attribute__((destructor)) static void lib_dtor(void) {
    if (!lifecycle_lib_check()) abort();
    for (int i = 0; i < KEPT; i++) {
        kept[i] = realloc(kept[i], size_of(i) * 2);
        free(kept[i]);
        kept[i] = NULL;
    }
    free(malloc(12345));
}
