/* glibc frees a dead thread's TLS while it holds its stack-cache lock,
 * which pthread_create takes too: a free that starts a thread deadlocks.
 *
 * Threads are created and joined one after another, each with a stack
 * larger than the last (so no cached stack is ever reused: reusing one
 * frees its TLS outside the lock), and each touches the 1 MiB TLS of a
 * dlopened library (argv[1]), which glibc mallocs: a large block. Once
 * the cached stacks pass 40 MiB, each join trims the cache
 * (__nptl_free_stacks) and frees the oldest stacks' TLS blocks under the
 * lock. Until the fix, that free was tlmalloc's first chance to start its
 * background purger (free memory had appeared, two threads had heaps),
 * and the pthread_create hung on the lock held by its own thread. */

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "check.h"

static char *(*touch_tls)(void);

static void *worker(void *arg) {
    (void)arg;
    return touch_tls();
}

int main(int argc, char **argv) {
    CHECK(argc == 2);
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (lib == NULL) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    touch_tls = (char *(*)(void))dlsym(lib, "touch_tls");
    CHECK(touch_tls != NULL);
    if (touch_tls == NULL) {
        return check_done();
    }
    for (int i = 0; i < 24; i++) {
        pthread_attr_t attr;
        pthread_t thread;
        CHECK(pthread_attr_init(&attr) == 0);
        CHECK(pthread_attr_setstacksize(&attr, (8u << 20) + (size_t)i * (64u << 10)) == 0);
        CHECK(pthread_create(&thread, &attr, worker, NULL) == 0);
        CHECK(pthread_attr_destroy(&attr) == 0);
        CHECK(pthread_join(thread, NULL) == 0);
    }
    if (check_failed == 0) {
        puts("stack cache ok");
    }
    return check_done();
}
