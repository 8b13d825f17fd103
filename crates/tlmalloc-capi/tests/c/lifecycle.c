/* Allocation from the first moment to the last: before main (a linked
 * library's constructor and this program's), in a dlopened library's
 * constructor and destructor, in pthread-key destructors that run after
 * tlmalloc's own thread-exit hook (several rounds), in C11 thread-exit
 * paths, in atexit handlers and in destructors at exit. Prints
 * "lifecycle ok" when main finishes; the exit path is checked by the exit
 * status (any failure aborts). argv[1] is the dlopen path of the library. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern int lifecycle_lib_check(void);

static void *early_blocks[32];
static pthread_key_t late_key;
static volatile int key_rounds;

static void fail(const char *what) {
    fprintf(stderr, "lifecycle: %s\n", what);
    abort();
}

__attribute__((constructor(101))) static void early(void) {
    /* malloc first: tlmalloc's thread-exit key then has a lower index than
     * late_key, so glibc runs its destructor first in every round. */
    for (int i = 0; i < 32; i++) {
        early_blocks[i] = malloc((size_t)1 << (i % 20));
        memset(early_blocks[i], 0x42, (size_t)1 << (i % 20));
    }
    if (pthread_key_create(&late_key, NULL) != 0) fail("pthread_key_create");
}

/* Runs at thread exit after tlmalloc's hook; re-arms itself twice, so two
 * more rounds run when tlmalloc's key has no value any more. */
static void late_destructor(void *value) {
    __atomic_fetch_add(&key_rounds, 1, __ATOMIC_SEQ_CST);
    char *block = value;
    for (int i = 0; i < 100; i++)
        if (block[i] != 'k') fail("key value corrupted");
    char *more[50];
    for (int i = 0; i < 50; i++) {
        more[i] = malloc((size_t)i * 100 + 1);
        memset(more[i], i, (size_t)i * 100 + 1);
    }
    void *big = malloc(3 << 20);
    memset(big, 1, 3 << 20);
    free(big);
    for (int i = 0; i < 50; i++) free(more[i]);
    int round = (int)(uintptr_t)block[100];
    free(block); /* allocated while the thread was alive, freed after its hook */
    if (round < 3) {
        char *next = malloc(128);
        memset(next, 'k', 100);
        next[100] = (char)(round + 1);
        pthread_setspecific(late_key, next);
    }
}

static void *thread_main(void *arg) {
    (void)arg;
    char *v = malloc(128);
    memset(v, 'k', 100);
    v[100] = 1;
    pthread_setspecific(late_key, v);
    void *junk[100];
    for (int i = 0; i < 100; i++) junk[i] = malloc((size_t)i * 50 + 8);
    for (int i = 0; i < 100; i += 2) free(junk[i]);
    /* The other half is leaked on purpose: its pages are abandoned at exit. */
    return NULL;
}

static void key_destructor_test(void) {
    if (pthread_key_delete(late_key) != 0) fail("pthread_key_delete");
    if (pthread_key_create(&late_key, late_destructor) != 0) fail("pthread_key_create");
    for (int round = 0; round < 20; round++) {
        pthread_t t[4];
        for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, thread_main, NULL);
        for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    }
    if (key_rounds != 20 * 4 * 3) {
        fprintf(stderr, "key destructor rounds: %d\n", key_rounds);
        fail("key destructors did not all run");
    }
}

static void *at_exit_kept;

static void exit_handler_last(void) {
    /* Registered first, runs last among the atexit handlers. */
    free(at_exit_kept);
    void *p = calloc(1000, 10);
    p = realloc(p, 100000);
    free(p);
}

static void exit_handler(void) {
    at_exit_kept = malloc(777);
    memset(at_exit_kept, 7, 777);
    char *s = NULL;
    if (asprintf(&s, "atexit %d", 42) < 0) abort();
    free(s);
    for (int i = 0; i < 32; i++) free(early_blocks[i]);
}

__attribute__((destructor)) static void program_destructor(void) {
    void *blocks[100];
    for (int i = 0; i < 100; i++) blocks[i] = malloc((size_t)i * 64 + 1);
    for (int i = 99; i >= 0; i--) free(blocks[i]);
}

int main(int argc, char **argv) {
    if (!lifecycle_lib_check()) fail("linked library's constructor blocks");
    for (int i = 0; i < 32; i++) {
        const unsigned char *b = early_blocks[i];
        for (size_t j = 0; j < ((size_t)1 << (i % 20)); j++)
            if (b[j] != 0x42) fail("early block corrupted");
    }
    if (argc > 1) {
        for (int round = 0; round < 3; round++) {
            void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
            if (!h) fail(dlerror());
            int (*check)(void) = (int (*)(void))dlsym(h, "lifecycle_lib_check");
            if (!check || !check()) fail("dlopened library's constructor blocks");
            dlclose(h);
        }
    }
    key_destructor_test();
    atexit(exit_handler_last);
    atexit(exit_handler);
    printf("lifecycle ok\n");
    fflush(stdout);
    return 0;
}
