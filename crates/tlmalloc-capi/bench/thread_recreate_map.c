/* Thread re-creation with objects handed between generations (the shape of
 * the bench's `thread-recreate`), and a map of where the resident memory is.
 *
 * GENS times, T threads each allocate 1000 objects of 16-256 B (1 % of them
 * LO-HI times larger, log-uniform, capped at CAP bytes) and push each onto
 * a shared FIFO of 1024, freeing the one it pushes out (most likely another
 * thread's, or a thread's that has exited). At the end it prints the peak
 * and current RSS and, with MAP=1, for every 4 MiB chunk of anonymous
 * memory with something resident, one character per 64 KiB: the number of
 * resident 4 KiB pages in base 36 ('.' none, 'g' all 16). tlmalloc's
 * segments are 4 MiB-aligned, so a chunk is a segment: small pages are
 * 64 KiB (one character), medium pages 512 KiB (eight).
 *
 *   cc -O2 -pthread -o /tmp/trmap crates/tlmalloc-capi/bench/thread_recreate_map.c -lm
 *   LD_PRELOAD=target/release/libtlmalloc.so MAP=1 /tmp/trmap 100 100 1000
 *
 * Arguments: GENS (100), LO (100), HI (10000), CAP (none), T (1).
 */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define QUEUE 1024
#define RING (QUEUE + 64)
#define CHUNK ((uintptr_t)4 << 20)

static void *ring[RING];
static int head, len;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static double lo = 100, hi = 10000;
static size_t cap = (size_t)-1;
static int generation;

static uint64_t next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static void push(void *p) {
    void *old = NULL;
    pthread_mutex_lock(&lock);
    ring[(head + len) % RING] = p;
    if (++len > QUEUE) {
        old = ring[head];
        head = (head + 1) % RING;
        len--;
    }
    pthread_mutex_unlock(&lock);
    free(old);
}

static void *run(void *arg) {
    uint64_t s = 0x9E3779B97F4A7C15ull ^ ((uint64_t)generation << 20) ^ (uintptr_t)arg;
    for (int k = 0; k < 1000; k++) {
        size_t n = 16 + next(&s) % 240;
        if (next(&s) % 100 == 0) {
            double u = (double)(next(&s) >> 11) / 9007199254740992.0;
            n = (size_t)(n * exp(log(lo) + u * (log(hi) - log(lo))));
            if (n > cap) n = cap;
            char *q = malloc(n);
            for (size_t i = 0; i < n; i += 4096) q[i] = (char)k;
            push(q);
        } else {
            char *q = malloc(n);
            memset(q, k, n);
            push(q);
        }
    }
    return NULL;
}

static long status_kib(const char *field) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = 0;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, field, strlen(field))) v = atol(line + strlen(field));
    if (f) fclose(f);
    return v;
}

/* One line per 4 MiB chunk with resident anonymous memory (see the top). */
static void map_resident(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        uintptr_t a, b;
        char perm[8];
        if (sscanf(line, "%lx-%lx %7s", &a, &b, perm) != 3 || perm[0] != 'r' || perm[1] != 'w') continue;
        if (strchr(line, '/') || strchr(line, '[')) continue; /* files, stack, heap */
        size_t pages = (b - a) / 4096;
        unsigned char *v = malloc(pages);
        if (!v || mincore((void *)a, b - a, v) != 0) { free(v); continue; }
        for (uintptr_t c = a & ~(CHUNK - 1); c < b; c += CHUNK) {
            char row[65];
            long total = 0;
            for (int g = 0; g < 64; g++) {
                int k = 0;
                for (uintptr_t p = c + (uintptr_t)g * 65536; p < c + (uintptr_t)(g + 1) * 65536; p += 4096)
                    if (p >= a && p < b && (v[(p - a) / 4096] & 1)) k++;
                row[g] = k == 0 ? '.' : (char)(k < 10 ? '0' + k : 'a' + k - 10);
                total += k * 4;
            }
            row[64] = 0;
            if (total) printf("%012lx %6ld KiB %s\n", (unsigned long)c, total, row);
        }
        free(v);
    }
    if (f) fclose(f);
}

int main(int argc, char **argv) {
    int gens = argc > 1 ? atoi(argv[1]) : 100;
    if (argc > 2) lo = atof(argv[2]);
    if (argc > 3) hi = atof(argv[3]);
    if (argc > 4) cap = (size_t)atol(argv[4]);
    int threads = argc > 5 ? atoi(argv[5]) : 1;
    if (threads < 1 || threads > 64) threads = 1;
    long base = status_kib("VmRSS:");
    for (generation = 0; generation < gens; generation++) {
        pthread_t t[64];
        for (long i = 0; i < threads; i++) pthread_create(&t[i], NULL, run, (void *)i);
        for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    }
    if (getenv("MAP")) map_resident();
    printf("rss base %ld KiB, peak %ld KiB, now %ld KiB\n", base, status_kib("VmHWM:"), status_kib("VmRSS:"));
    return 0;
}
