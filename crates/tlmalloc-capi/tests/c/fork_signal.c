/* fork() from a signal handler that interrupts the allocator (modelled on
 * glibc's tst-mallocfork2), under LD_PRELOAD.
 *
 *   fork_signal [SECONDS [MIN_FORKS [MIN_CALLS [always]]]]
 *                                 (default 8 s, 300 forks, 4000 calls)
 *
 * The main thread hammers the allocator, round after round: malloc, free,
 * calloc, realloc and posix_memalign across every tier (16 B, 1 KiB,
 * 64 KiB, 1 MiB, 64 MiB; alignments 64 B to 2 MiB), a churn of random
 * sizes up to 70000 bytes in 1009 slots (glibc's test), and a plain fork()
 * of its own (the child _exit()s; a signal that lands inside that fork
 * makes the handler fork inside fork, glibc's bug 24161). It is interrupted
 * by SIGALRM (setitimer, every 1 ms) and by SIGUSR1 (sent every 300 µs by a
 * helper process, so that this process stays single-threaded as in glibc's
 * test: glibc's fork is async-signal-safe with respect to malloc only
 * there).
 *
 * The handler calls fork(); the parent's handler waits for the child and
 * records its status. The child, still inside the handler:
 * - when the signal came between two allocator calls of the main loop,
 *   allocates and frees a block of every tier (malloc, calloc, realloc,
 *   posix_memalign; the 64 MiB tier every 8th child) with its contents
 *   checked, then _exit(0)s;
 * - when the signal came inside an allocator call (or the main loop's
 *   fork), _exit(0)s at once, as in glibc's test: allocating there is
 *   calling the allocator from a signal handler that interrupted it, which
 *   no allocator promises (glibc's malloc fails its own assertions there
 *   now and then). With "always" as the 4th argument the child allocates in
 *   that case too.
 * The handler forks at most once per allocator call of the main loop, so
 * that the loop progresses.
 *
 * The run ends once MIN_FORKS forks (from the handler) and MIN_CALLS
 * allocator calls happened, or after SECONDS. Every child must have exited
 * 0, at least MIN_FORKS forks must have happened, and at least MIN_FORKS/10
 * of them each inside and outside an allocator call. A child that hangs
 * kills itself with alarm() (reported as SIGALRM); a parent that hangs is
 * killed by the test's harness. On success prints "fork_signal ok: ..." and
 * exits 0. */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)

/* How many allocator calls the main loop has made; the handler forks only
 * when it moved since the last fork. */
static volatile sig_atomic_t progress;
static volatile sig_atomic_t progress_at_fork = -1;
/* Set around each allocator call (and fork) of the main loop. */
static volatile sig_atomic_t in_alloc;
static volatile sig_atomic_t forks, forks_in_alloc, signals, skipped;
static volatile sig_atomic_t bad_children, first_bad_status, first_bad_fork = -1, fork_errors;
static volatile sig_atomic_t disabled;
static int child_always_allocates;

/* Async-signal-safe output. */
static void say(const char *msg) {
    size_t n = strlen(msg);
    while (n > 0) {
        ssize_t w = write(2, msg, n);
        if (w <= 0) return;
        msg += w;
        n -= (size_t)w;
    }
}

static unsigned char pat(unsigned seed, size_t i) { return (unsigned char)(seed * 29u + i * 11u + (i >> 10) + 1u); }

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

static int zeroed(const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i = step(n, i))
        if (p[i] != 0) return 0;
    return 1;
}

static const size_t tiers[] = {16, 1 * KIB, 64 * KIB, 1 * MIB, 64 * MIB};
#define TIERS (sizeof tiers / sizeof tiers[0])
static const size_t aligns[] = {64, 4 * KIB, 64 * KIB, 2 * MIB};
static const size_t align_sizes[] = {100, 5000, 100 * KIB, 3 * MIB};
#define ALIGNS (sizeof aligns / sizeof aligns[0])

/* The child, inside the signal handler: every tier once, then _exit. */
static void child(int n, int interrupted_in_alloc) {
    if (interrupted_in_alloc && !child_always_allocates) _exit(0);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_IGN;
    sigaction(SIGUSR1, &sa, NULL);
    sa.sa_handler = SIG_DFL;
    sigaction(SIGALRM, &sa, NULL);
    sigset_t unblock;
    sigemptyset(&unblock);
    sigaddset(&unblock, SIGALRM);
    sigprocmask(SIG_UNBLOCK, &unblock, NULL);
    alarm(10); /* a hang in the child: killed by SIGALRM */

    /* 64 MiB every 8th child: its page faults cost milliseconds. */
    size_t ntiers = n % 8 == 0 ? TIERS : TIERS - 1;
    unsigned char *p[TIERS];
    for (size_t t = 0; t < ntiers; t++) {
        p[t] = malloc(tiers[t]);
        if (!p[t]) {
            say("fork_signal child: malloc failed\n");
            _exit(3);
        }
        fill(p[t], tiers[t], (unsigned)t);
    }
    for (size_t t = 0; t < ntiers; t++) {
        if (!holds(p[t], tiers[t], tiers[t], (unsigned)t)) {
            say("fork_signal child: contents lost\n");
            _exit(4);
        }
        free(p[t]);
    }
    for (size_t t = 0; t < TIERS - 1; t++) { /* calloc zeroes a reused 64 MiB block: too slow */
        unsigned char *z = calloc(1, tiers[t]);
        if (!z || !zeroed(z, tiers[t])) {
            say("fork_signal child: calloc\n");
            _exit(5);
        }
        free(z);
    }
    unsigned char *r = malloc(16);
    if (!r) _exit(6);
    fill(r, 16, 7);
    size_t have = 16;
    for (size_t t = 1; t < ntiers; t++) {
        unsigned char *q = realloc(r, tiers[t]);
        if (!q || !holds(q, have, have, 7)) {
            say("fork_signal child: realloc\n");
            _exit(6);
        }
        r = q;
        fill(r, tiers[t], 7);
        have = tiers[t];
    }
    free(r);
    for (size_t a = 0; a < ALIGNS; a++) {
        void *q = NULL;
        if (posix_memalign(&q, aligns[a], align_sizes[a]) != 0 || ((uintptr_t)q & (aligns[a] - 1))) {
            say("fork_signal child: posix_memalign\n");
            _exit(7);
        }
        fill(q, align_sizes[a], 3);
        free(q);
    }
    _exit(0);
}

static void handler(int sig) {
    (void)sig;
    int saved = errno;
    signals++;
    if (disabled || progress == progress_at_fork) {
        skipped++;
        errno = saved;
        return;
    }
    progress_at_fork = progress;
    int interrupted_in_alloc = in_alloc;
    int n = forks;
    pid_t pid = fork();
    if (pid < 0) {
        fork_errors++;
        errno = saved;
        return;
    }
    if (pid == 0) child(n, interrupted_in_alloc);
    forks++;
    if (interrupted_in_alloc) forks_in_alloc++;
    int status = 0;
    pid_t r;
    while ((r = waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
    }
    if (r != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        if (bad_children++ == 0) {
            first_bad_status = r == pid ? status : -1;
            first_bad_fork = n;
        }
    }
    errno = saved;
}

/* The helper process: SIGUSR1 to its parent every 300 µs until the parent
 * is gone. */
static void sender(pid_t parent) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    while (getppid() == parent) {
        if (kill(parent, SIGUSR1) != 0) break;
        struct timespec pause = {0, 300 * 1000};
        nanosleep(&pause, NULL);
    }
    _exit(0);
}

/* One allocator call (or fork) of the main loop, flagged for the handler. */
#define CALL(stmt)                         \
    do {                                   \
        in_alloc = 1;                      \
        __asm__ volatile("" ::: "memory"); \
        stmt;                              \
        __asm__ volatile("" ::: "memory"); \
        in_alloc = 0;                      \
        progress++;                        \
    } while (0)

static int failed;
#define EXPECT(cond)                                                                           \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            if (failed++ < 10) fprintf(stderr, "fork_signal: line %d: %s\n", __LINE__, #cond); \
        }                                                                                      \
    } while (0)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* glibc's test: 1009 slots of random sizes below 70000 bytes. */
#define SLOTS 1009
static void *slots[SLOTS];
static unsigned churn_seed = 1;
static int plain_forks;

/* One round of the main loop: every entry point on every tier. */
static void round_of(long round) {
    unsigned seed = (unsigned)round;
    size_t ntiers = round % 8 == 0 ? TIERS : TIERS - 1; /* 64 MiB every 8th round */
    unsigned char *p[TIERS];
    for (size_t t = 0; t < ntiers; t++) {
        CALL(p[t] = malloc(tiers[t] + round % 13));
        EXPECT(p[t] != NULL);
        if (p[t]) fill(p[t], tiers[t], seed + (unsigned)t);
    }
    for (size_t t = 0; t < ntiers; t++) {
        if (p[t]) EXPECT(holds(p[t], tiers[t], tiers[t], seed + (unsigned)t));
        CALL(free(p[t]));
    }
    for (size_t t = 0; t < TIERS - 1; t++) { /* calloc zeroes a reused 64 MiB block: too slow */
        unsigned char *z;
        CALL(z = calloc(tiers[t] / 16, 16));
        EXPECT(z != NULL && zeroed(z, tiers[t]));
        CALL(free(z));
    }
    /* realloc up and down the tiers. */
    unsigned char *r;
    CALL(r = malloc(16));
    EXPECT(r != NULL);
    if (!r) return;
    fill(r, 16, seed);
    size_t have = 16;
    for (size_t t = 1; t < ntiers; t++) {
        unsigned char *q;
        CALL(q = realloc(r, tiers[t]));
        EXPECT(q != NULL);
        if (!q) break;
        EXPECT(holds(q, have, have, seed));
        r = q;
        fill(r, tiers[t], seed);
        have = tiers[t];
    }
    for (size_t t = ntiers - 1; t-- > 0;) {
        unsigned char *q;
        CALL(q = realloc(r, tiers[t]));
        EXPECT(q != NULL);
        if (!q) break;
        EXPECT(holds(q, have, tiers[t], seed));
        r = q;
        have = tiers[t];
    }
    CALL(free(r));
    for (size_t a = 0; a < ALIGNS; a++) {
        void *q = NULL;
        int rc;
        CALL(rc = posix_memalign(&q, aligns[a], align_sizes[a]));
        EXPECT(rc == 0 && ((uintptr_t)q & (aligns[a] - 1)) == 0);
        if (rc == 0) fill(q, align_sizes[a], seed);
        CALL(free(q));
    }
    for (int i = 0; i < 16; i++) {
        int slot = rand_r(&churn_seed) % SLOTS;
        size_t size = (size_t)rand_r(&churn_seed) % 70000;
        CALL(free(slots[slot]));
        CALL(slots[slot] = malloc(size));
        EXPECT(slots[slot] != NULL);
    }
    /* A fork of the main loop's own: a signal inside it forks inside fork. */
    pid_t pid;
    CALL(pid = fork());
    if (pid == 0) _exit(0);
    EXPECT(pid > 0);
    if (pid > 0) {
        int status = 0;
        pid_t w;
        while ((w = waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
        }
        EXPECT(w == pid && status == 0);
        plain_forks++;
    }
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 8.0;
    int min_forks = argc > 2 ? atoi(argv[2]) : 300;
    long min_calls = argc > 3 ? atol(argv[3]) : 4000;
    child_always_allocates = argc > 4 && strcmp(argv[4], "always") == 0;
    setvbuf(stdout, NULL, _IONBF, 0);

    pid_t parent = getpid();
    pid_t helper = fork();
    if (helper < 0) {
        perror("fork_signal: fork");
        return 1;
    }
    if (helper == 0) {
        /* Give the parent time to install its handler. */
        struct timespec pause = {0, 50 * 1000 * 1000};
        nanosleep(&pause, NULL);
        sender(parent);
    }

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGALRM);
    sigaddset(&sa.sa_mask, SIGUSR1);
    sigaction(SIGALRM, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);
    struct itimerval every_ms = {{0, 1000}, {0, 1000}};
    setitimer(ITIMER_REAL, &every_ms, NULL);

    double start = now();
    long rounds = 0;
    int enough = 0;
    while (!enough && now() - start < seconds && failed == 0 && bad_children == 0) {
        round_of(rounds);
        rounds++;
        enough = forks >= min_forks && progress >= min_calls && forks_in_alloc >= min_forks / 10 &&
                 forks - forks_in_alloc >= min_forks / 10;
    }
    double elapsed = now() - start;

    /* Stop the signals, then the helper. */
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    disabled = 1;
    kill(helper, SIGKILL);
    while (waitpid(helper, NULL, 0) < 0 && errno == EINTR) {
    }
    for (int i = 0; i < SLOTS; i++) free(slots[i]);

    int bad = failed != 0;
    if (bad_children) {
        int s = first_bad_status;
        fprintf(stderr, "fork_signal: %d of %d children failed; the first (fork %d): %s %d%s\n", bad_children, forks,
                first_bad_fork, s == -1 ? "waitpid failed" : WIFSIGNALED(s) ? "killed by signal" : "exit status",
                s == -1 ? 0 : WIFSIGNALED(s) ? WTERMSIG(s) : WEXITSTATUS(s),
                s != -1 && WIFSIGNALED(s) && WTERMSIG(s) == SIGALRM ? " (the child hung)" : "");
        bad = 1;
    }
    if (fork_errors) {
        fprintf(stderr, "fork_signal: %d forks failed\n", fork_errors);
        bad = 1;
    }
    if (!enough && !bad) {
        fprintf(stderr,
                "fork_signal: too little in %.1f s: %d forks from the handler (%d wanted), %d of them inside and %d "
                "outside an allocator call (%d wanted each), %ld allocator calls (%ld wanted), %ld rounds\n",
                elapsed, forks, min_forks, forks_in_alloc, forks - forks_in_alloc, min_forks / 10, (long)progress,
                min_calls, rounds);
        bad = 1;
    }
    if (bad) return 1;
    printf("fork_signal ok: %d forks from the handler (%d inside an allocator call%s), %d signals (%d without a "
           "fork), %ld rounds, %ld allocator calls, %d plain forks, %.1f s\n",
           forks, forks_in_alloc, child_always_allocates ? ", their children allocating too" : "", signals, skipped,
           rounds, (long)progress, plain_forks, elapsed);
    return 0;
}
