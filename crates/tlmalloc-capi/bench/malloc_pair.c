/* Instructions per malloc/free pair through whatever malloc the process
 * has (LD_PRELOAD): `malloc_pair N SIZE [stub]` runs N iterations of
 * p = malloc(SIZE); free(p); through function pointers. With "stub" the same
 * loop calls two trivial functions instead (2 and 1 instructions), so
 *   pair cost = (Ir(real) - Ir(stub)) / N + 3
 * counts exactly the instructions of malloc and free, loop overhead removed.
 * One block of SIZE stays allocated during the loop (see main).
 * scripts/callgrind-preload.sh runs it under callgrind. */
#include <stdlib.h>

static char stub_block[64];

__attribute__((noinline)) static void *stub_malloc(size_t size) {
    (void)size;
    return stub_block; /* lea; ret */
}

__attribute__((noinline)) static void stub_free(void *p) { (void)p; /* ret */ }

void *(*volatile alloc_fn)(size_t);
void (*volatile free_fn)(void *);

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 1000000;
    size_t size = argc > 2 ? (size_t)atol(argv[2]) : 64;
    int stub = argc > 3;
    alloc_fn = stub ? stub_malloc : malloc;
    free_fn = stub ? stub_free : free;
    void *(*a)(size_t) = alloc_fn;
    void (*f)(void *) = free_fn;
    /* Warm up: the first calls set up the thread's heap. One block stays
     * allocated, so the loop measures the steady state of a busy size class
     * rather than a page emptied and refilled on every iteration. */
    void *keep = a(size);
    for (int i = 0; i < 100; i++) f(a(size));
    for (long i = 0; i < n; i++) {
        void *p = a(size);
        f(p);
    }
    f(keep);
    return 0;
}
