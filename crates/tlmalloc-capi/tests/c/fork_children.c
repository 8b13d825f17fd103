/* Children that allocate across the tiers and exit, forked by a parent
 * whose other threads allocate, under LD_PRELOAD.
 *
 *   fork_children [FORKS_PER_FORKER]     (default 30)
 *
 * The parent runs 3 allocating threads, which also swap blocks into a
 * shared array. It forks FORKS_PER_FORKER children from the main thread,
 * one after the other, while 2 more threads fork as many each at the same
 * time. Before each fork the forking thread takes a set of blocks out of
 * the shared array (allocated by the other threads) and allocates a set of
 * its own, all filled with a pattern. Each child:
 * - checks and frees those inherited blocks (its copies of them);
 * - allocates, checks and frees a block of every tier;
 * - grows one block by realloc 16 B -> 64 KiB -> 1 MiB -> 300 MiB and
 *   shrinks it to 100 B, contents checked at each step;
 * - starts a thread that allocates and frees, and joins it;
 * - exits: half of the children with exit(0) (atexit handlers and the
 *   allocator's destructor run), half with _exit(0).
 * The parent frees its own copies, waits for every child and requires
 * status 0. A child that hangs kills itself with alarm() (SIGALRM). On
 * success prints "fork_children ok: ..." and exits 0. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)

static void say(const char *msg) {
    size_t n = strlen(msg);
    while (n > 0) {
        ssize_t w = write(2, msg, n);
        if (w <= 0) return;
        msg += w;
        n -= (size_t)w;
    }
}

static unsigned char pat(unsigned seed, size_t i) { return (unsigned char)(seed * 13u + i * 5u + (i >> 11) + 1u); }

/* Offsets filled and checked: all of a block up to 64 KiB; above, its first
 * and last 4 KiB and one byte per 64 KiB (per 1 MiB above 16 MiB: a page
 * fault costs microseconds). */
static size_t step(size_t n, size_t i) {
    if (n <= 64 * KIB || i + 1 < 4096 || i + 1 >= n - 4096) return i + 1;
    size_t stride = n > 16 * MIB ? MIB : 64 * KIB;
    size_t next = (i + stride) & ~(stride - 1);
    return next < n - 4096 ? next : n - 4096;
}

static void fill(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i = step(n, i)) p[i] = pat(seed, i);
}

static int holds(const unsigned char *p, size_t filled, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i = step(filled, i))
        if (p[i] != pat(seed, i)) return 0;
    return 1;
}

/* A block and what it was filled with. */
struct block {
    unsigned char *p;
    size_t n;
    unsigned seed;
};

static struct block new_block(size_t n, unsigned seed) {
    struct block b = {malloc(n), n, seed};
    if (b.p) fill(b.p, n, seed);
    return b;
}

#define SHARED 48
static struct block shared[SHARED];
static pthread_mutex_t shared_lock = PTHREAD_MUTEX_INITIALIZER;
static volatile int stop;
static int worker_errors;

static size_t pick_size(unsigned *seed) {
    *seed = *seed * 1103515245u + 12345u;
    unsigned r = *seed >> 8;
    switch (r % 16) {
        case 0: return 200 * KIB + r % (3 * MIB); /* large */
        case 1: case 2: case 3: return 8 * KIB + r % (120 * KIB); /* medium */
        default: return 16 + r % 2000; /* small */
    }
}

static void *worker(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg;
    struct block slot[64] = {{0}};
    unsigned long iter = 0;
    while (!stop) {
        unsigned k = (seed >> 4) % 64;
        if (slot[k].p) {
            if (!holds(slot[k].p, slot[k].n, slot[k].n, slot[k].seed))
                __atomic_fetch_add(&worker_errors, 1, __ATOMIC_RELAXED);
            free(slot[k].p);
            slot[k].p = NULL;
        } else {
            size_t n = pick_size(&seed);
            slot[k] = new_block(n < 4096 ? n : 4096, seed); /* filled densely: keep it short */
            if (!slot[k].p) __atomic_fetch_add(&worker_errors, 1, __ATOMIC_RELAXED);
            if (slot[k].p && n > 4096) { /* a big block, with a pattern at both ends */
                unsigned char *q = realloc(slot[k].p, n);
                if (q) slot[k].p = q;
                else __atomic_fetch_add(&worker_errors, 1, __ATOMIC_RELAXED);
            }
        }
        seed = seed * 1103515245u + 12345u;
        if (++iter % 32 == 0) { /* publish a block for the forking threads */
            struct block b = new_block(16 + seed % 3000, seed);
            pthread_mutex_lock(&shared_lock);
            unsigned s = seed % SHARED;
            struct block old = shared[s];
            shared[s] = b;
            pthread_mutex_unlock(&shared_lock);
            if (old.p && !holds(old.p, old.n, old.n, old.seed))
                __atomic_fetch_add(&worker_errors, 1, __ATOMIC_RELAXED);
            free(old.p);
        }
    }
    for (int k = 0; k < 64; k++) free(slot[k].p);
    return NULL;
}

static void *child_thread(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg;
    for (int i = 0; i < 300; i++) {
        size_t n = pick_size(&seed);
        struct block b = new_block(n < 70000 ? n : 70000, seed);
        if (!b.p || !holds(b.p, b.n, b.n, b.seed)) return (void *)1;
        free(b.p);
    }
    return NULL;
}

#define INHERITED 24
#define OWN 8

static const size_t tiers[] = {16, 1000, 9000, 64 * KIB, 200 * KIB, 1 * MIB, 8 * MIB};
#define TIERS (sizeof tiers / sizeof tiers[0])

static void child(long n, struct block inherited[INHERITED], struct block own[OWN]) {
    alarm(20); /* a hang in the child: killed by SIGALRM */
    for (int i = 0; i < INHERITED; i++) {
        if (inherited[i].p && !holds(inherited[i].p, inherited[i].n, inherited[i].n, inherited[i].seed)) {
            say("fork_children child: a block of another parent thread changed\n");
            _exit(3);
        }
        free(inherited[i].p);
    }
    for (int i = 0; i < OWN; i++) {
        if (!holds(own[i].p, own[i].n, own[i].n, own[i].seed)) {
            say("fork_children child: a block of the forking thread changed\n");
            _exit(3);
        }
        free(own[i].p);
    }
    struct block t[TIERS];
    for (size_t i = 0; i < TIERS; i++) {
        t[i] = new_block(tiers[i], (unsigned)(n + i));
        if (!t[i].p) { say("fork_children child: malloc failed\n"); _exit(4); }
    }
    for (size_t i = 0; i < TIERS; i++) {
        if (!holds(t[i].p, t[i].n, t[i].n, t[i].seed)) { say("fork_children child: block changed\n"); _exit(4); }
        free(t[i].p);
    }
    /* 16 B -> 64 KiB -> 1 MiB -> 300 MiB -> 100 B, contents kept. */
    static const size_t chain[] = {16, 64 * KIB, 1 * MIB, 300 * MIB, 100};
    unsigned seed = (unsigned)n * 3u;
    struct block r = new_block(chain[0], seed);
    if (!r.p) _exit(5);
    for (size_t i = 1; i < sizeof chain / sizeof chain[0]; i++) {
        unsigned char *q = realloc(r.p, chain[i]);
        if (!q) { say("fork_children child: realloc failed\n"); _exit(5); }
        size_t kept = r.n < chain[i] ? r.n : chain[i];
        if (!holds(q, r.n, kept, seed)) { say("fork_children child: realloc lost contents\n"); _exit(6); }
        r.p = q;
        if (chain[i] > r.n) fill(q, chain[i], seed);
        r.n = chain[i];
    }
    free(r.p);
    pthread_t th;
    void *res = (void *)1;
    if (pthread_create(&th, NULL, child_thread, (void *)(uintptr_t)(n + 1)) != 0) {
        say("fork_children child: pthread_create failed\n");
        _exit(7);
    }
    pthread_join(th, &res);
    if (res != NULL) { say("fork_children child: its thread failed\n"); _exit(7); }
    char *s = strdup("bye");
    free(s);
    if (n % 2) exit(0); /* atexit handlers and the allocator's destructor too */
    _exit(0);
}

static long forks_done, children_bad;

static void fork_many(long id, int forks) {
    for (int i = 0; i < forks; i++) {
        long n = id * 1000 + i;
        struct block inherited[INHERITED] = {{0}};
        pthread_mutex_lock(&shared_lock);
        for (int k = 0; k < INHERITED; k++) {
            unsigned s = (unsigned)(n * 7 + k) % SHARED;
            inherited[k] = shared[s];
            shared[s].p = NULL;
        }
        pthread_mutex_unlock(&shared_lock);
        struct block own[OWN];
        for (int k = 0; k < OWN; k++) {
            own[k] = new_block(k == 0 ? 2 * MIB : k == 1 ? 100 * KIB : 16 + (size_t)k * 300, (unsigned)(n + k));
            if (!own[k].p) abort();
        }
        pid_t pid = fork();
        if (pid < 0) {
            perror("fork_children: fork");
            __atomic_fetch_add(&children_bad, 1, __ATOMIC_RELAXED);
            return;
        }
        if (pid == 0) child(n, inherited, own);
        for (int k = 0; k < INHERITED; k++) free(inherited[k].p);
        for (int k = 0; k < OWN; k++) free(own[k].p);
        int status = 0;
        pid_t r;
        while ((r = waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
        }
        __atomic_fetch_add(&forks_done, 1, __ATOMIC_RELAXED);
        if (r != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "fork_children: child %ld (%s): %s %d%s\n", n, n % 2 ? "exit" : "_exit",
                    r != pid ? "waitpid failed" : WIFSIGNALED(status) ? "killed by signal" : "exit status",
                    r != pid ? errno : WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status),
                    r == pid && WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM ? " (the child hung)" : "");
            __atomic_fetch_add(&children_bad, 1, __ATOMIC_RELAXED);
        }
    }
}

static int per_forker = 30;

static void *forker(void *arg) {
    fork_many((long)(intptr_t)arg, per_forker);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc > 1) per_forker = atoi(argv[1]);
    setvbuf(stdout, NULL, _IONBF, 0);
    pthread_t w[3], f[2];
    for (int i = 0; i < 3; i++) pthread_create(&w[i], NULL, worker, (void *)(uintptr_t)(i * 1000 + 17));
    /* Let the workers fill the shared array first. */
    struct timespec pause = {0, 50 * 1000 * 1000};
    nanosleep(&pause, NULL);
    for (int i = 0; i < 2; i++) pthread_create(&f[i], NULL, forker, (void *)(intptr_t)(i + 1));
    fork_many(0, per_forker);
    for (int i = 0; i < 2; i++) pthread_join(f[i], NULL);
    stop = 1;
    for (int i = 0; i < 3; i++) pthread_join(w[i], NULL);
    for (int i = 0; i < SHARED; i++) free(shared[i].p);
    if (children_bad || worker_errors) {
        fprintf(stderr, "fork_children: %ld of %ld children failed, %d worker errors\n", children_bad, forks_done,
                worker_errors);
        return 1;
    }
    printf("fork_children ok: %ld children\n", forks_done);
    return 0;
}
