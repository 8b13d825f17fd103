/* Random replacement through whatever malloc the process has (LD_PRELOAD),
 * the shape of `tlmalloc-workload server --threads 1` in C:
 * `replace_random MIN MAX OPS [SLOTS]` keeps SLOTS (default 2000) live
 * blocks of log-uniform sizes in [MIN, MAX]; each operation frees a random
 * one and mallocs the next size in its place, touching its first and last
 * byte. Prints the mean ns per operation. The sizes and slots come from a
 * fixed xorshift sequence, so under valgrind --tool=callgrind two libraries
 * run the same operations:
 *
 *   cc -O2 -o /tmp/replace_random crates/tlmalloc-capi/bench/replace_random.c -lm
 *   LD_PRELOAD=target/release/libtlmalloc.so /tmp/replace_random 8 16384 2000000 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static uint64_t state = 88172645463325252ULL;

static uint64_t next_random(void) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
}

#define SIZES (1 << 16)

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: replace_random MIN MAX OPS [SLOTS]\n");
        return 2;
    }
    double min = (double)atol(argv[1]), max = (double)atol(argv[2]);
    long ops = atol(argv[3]);
    int slots = argc > 4 ? atoi(argv[4]) : 2000;
    if (min < 1 || max < min || slots < 1) return 2;
    static unsigned sizes[SIZES];
    for (int i = 0; i < SIZES; i++) {
        double u = (double)(next_random() >> 11) / 9007199254740992.0;
        sizes[i] = (unsigned)exp(log(min) + u * (log(max) - log(min)));
    }
    char **live = malloc(sizeof(char *) * (size_t)slots);
    if (!live) return 1;
    for (int i = 0; i < slots; i++) {
        live[i] = malloc(sizes[i]);
        if (!live[i]) return 1;
        live[i][0] = 1;
    }
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    unsigned k = (unsigned)slots;
    for (long i = 0; i < ops; i++) {
        unsigned j = (unsigned)(next_random() % (uint64_t)slots);
        free(live[j]);
        size_t size = sizes[k++ & (SIZES - 1)];
        char *q = malloc(size);
        if (!q) return 1;
        q[0] = 1;
        q[size - 1] = 2;
        live[j] = q;
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    printf("%.3f\n", ((double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec)) / (double)ops);
    return 0;
}
