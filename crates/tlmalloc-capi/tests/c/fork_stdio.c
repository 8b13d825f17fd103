/* Concurrent fork while other threads use stdio and allocate (modelled on
 * glibc's tst-malloc-fork-deadlock), under LD_PRELOAD.
 *
 *   fork_stdio [SECONDS [FORKS_PER_THREAD]]      (default 3 s, 250 forks)
 *
 * Threads, all running until SECONDS have passed:
 * - 4 forkers: fork() in a loop; each child allocates, reallocates and
 *   frees across the tiers (16 B .. 4 MiB, contents checked), uses stdio
 *   (open_memstream), and exits, half with exit(0) and half with _exit(0);
 *   the forker waitpid()s it and requires status 0. A forker stops after
 *   FORKS_PER_THREAD forks.
 * - 2 readers: getline() on their own FILE of a file whose lines are 1 B
 *   to 600 KiB long (getline mallocs and reallocs its line while it holds
 *   the stream's lock), fprintf() to an open_memstream stream (realloc
 *   under the stream's lock), fopen()/fclose() (malloc and free around
 *   libc's stream-list lock).
 * - 1 flusher: fflush(NULL) in a loop (the stream-list lock, then each
 *   stream's lock).
 * - 2 allocators: malloc/realloc/free of 16 B .. 4 MiB blocks.
 *
 * The cycle this exposes: fork runs the atfork prepare handlers (an
 * allocator that takes its locks there holds them) and then takes libc's
 * stream-list lock, which the flusher holds while it waits for a reader's
 * stream, while that reader waits in malloc for one of the allocator's
 * locks. Such a process hangs; the test's harness kills it.
 *
 * A child that hangs kills itself with alarm() (reported as SIGALRM). On
 * success prints "fork_stdio ok: ..." and exits 0. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)

static volatile int stop;
static int forks_per_thread = 250;
static char path[4096];

static long forks_done, children_bad, lines_read, flushes, allocs_done;
static int reader_errors, alloc_errors;

static void add(long *counter, long n) { __atomic_fetch_add(counter, n, __ATOMIC_RELAXED); }

/* Write `msg` to stderr without stdio (children, failure paths). */
static void say(const char *msg) {
    size_t n = strlen(msg);
    while (n > 0) {
        ssize_t w = write(2, msg, n);
        if (w <= 0) return;
        msg += w;
        n -= (size_t)w;
    }
}

static unsigned char pat(unsigned seed, size_t i) { return (unsigned char)(seed * 31u + i * 7u + (i >> 9) + 1u); }

/* Fill the block densely up to 64 KiB, then its first and last 4 KiB and
 * one byte per 4 KiB page. */
static size_t step(size_t n, size_t i) {
    if (n <= 64 * KIB || i + 1 < 4096 || i + 1 >= n - 4096) return i + 1;
    size_t next = (i + 4096) & ~(size_t)4095;
    return next < n - 4096 ? next : n - 4096;
}

static void fill(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i = step(n, i)) p[i] = pat(seed, i);
}

/* Whether the first `n` bytes of a block filled as `filled` bytes still hold the pattern. */
static int holds(const unsigned char *p, size_t filled, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i = step(filled, i))
        if (p[i] != pat(seed, i)) return 0;
    return 1;
}

static const size_t tiers[] = {16, 200, 1000, 9000, 64 * KIB, 200 * KIB, 1 * MIB, 4 * MIB};
#define TIERS (sizeof tiers / sizeof tiers[0])

/* The child of a fork: exits 0 when every check held. */
static void child(long n) {
    signal(SIGALRM, SIG_DFL);
    alarm(20); /* a hang in the child: killed by SIGALRM */
    void *held[TIERS];
    for (size_t t = 0; t < TIERS; t++) {
        held[t] = malloc(tiers[t]);
        if (!held[t]) { say("fork_stdio child: malloc failed\n"); _exit(3); }
        fill(held[t], tiers[t], (unsigned)t);
    }
    /* A realloc chain up and down the tiers, contents kept. */
    unsigned char *p = malloc(16);
    if (!p) _exit(3);
    fill(p, 16, 99);
    size_t have = 16;
    for (size_t t = 1; t < TIERS; t++) {
        unsigned char *q = realloc(p, tiers[t]);
        if (!q) { say("fork_stdio child: realloc up failed\n"); _exit(4); }
        if (!holds(q, have, have, 99)) { say("fork_stdio child: realloc lost contents\n"); _exit(5); }
        p = q;
        fill(p, tiers[t], 99);
        have = tiers[t];
    }
    for (size_t t = TIERS - 1; t-- > 0;) {
        unsigned char *q = realloc(p, tiers[t]);
        if (!q) { say("fork_stdio child: realloc down failed\n"); _exit(4); }
        if (!holds(q, have, tiers[t], 99)) { say("fork_stdio child: realloc down lost contents\n"); _exit(5); }
        p = q;
        have = tiers[t];
    }
    free(p);
    for (size_t t = 0; t < TIERS; t++) {
        if (!holds(held[t], tiers[t], tiers[t], (unsigned)t)) { say("fork_stdio child: block changed\n"); _exit(6); }
        free(held[t]);
    }
    /* stdio works in the child. */
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    if (!m) _exit(7);
    for (int i = 0; i < 100; i++) fprintf(m, "child %ld line %d\n", n, i);
    if (fclose(m) != 0 || len < 1000) _exit(7);
    free(buf);
    if (n % 2) exit(0); /* exit handlers, stdio flush and the allocator's destructor too */
    _exit(0);
}

static void *forker(void *arg) {
    long id = (long)(intptr_t)arg;
    for (int i = 0; i < forks_per_thread && !stop; i++) {
        long n = id * 100000 + i;
        pid_t pid = fork();
        if (pid < 0) {
            say("fork_stdio: fork failed\n");
            add(&children_bad, 1);
            break;
        }
        if (pid == 0) child(n);
        int status = 0;
        pid_t r;
        while ((r = waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
        }
        add(&forks_done, 1);
        if (r != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            char msg[160];
            snprintf(msg, sizeof msg, "fork_stdio: child %ld: %s %d\n", n,
                     r != pid ? "waitpid failed" : WIFSIGNALED(status) ? "killed by signal" : "exit status",
                     r != pid ? errno : WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
            say(msg);
            add(&children_bad, 1);
        }
    }
    return NULL;
}

static void *reader(void *arg) {
    long id = (long)(intptr_t)arg;
    FILE *in = fopen(path, "r");
    if (!in) {
        __atomic_fetch_add(&reader_errors, 1, __ATOMIC_RELAXED);
        return NULL;
    }
    char *sbuf = NULL;
    size_t slen = 0;
    FILE *out = open_memstream(&sbuf, &slen);
    long lines = 0;
    while (!stop) {
        char *line = NULL; /* a fresh buffer each time: getline mallocs and grows it */
        size_t cap = 0;
        ssize_t n = getline(&line, &cap, in);
        if (n < 0) {
            rewind(in);
        } else {
            lines++;
            if (out) fprintf(out, "%ld %zd %c\n", id, n, line[0]);
        }
        free(line);
        if (out && slen > 256 * KIB) { /* restart the memory stream: its buffer is freed */
            fclose(out);
            free(sbuf);
            sbuf = NULL;
            out = open_memstream(&sbuf, &slen);
        }
        if (lines % 16 == 0) { /* fopen mallocs, fclose frees, both around the stream-list lock */
            FILE *f = fopen("/dev/null", "w");
            if (f) {
                fprintf(f, "%ld\n", lines);
                fclose(f);
            }
        }
    }
    if (out) fclose(out);
    free(sbuf);
    fclose(in);
    add(&lines_read, lines);
    return NULL;
}

static void *flusher(void *arg) {
    (void)arg;
    long n = 0;
    while (!stop) {
        fflush(NULL);
        n++;
        /* A pause, or the forkers hardly ever get the stream-list lock. */
        struct timespec pause = {0, 20 * 1000};
        nanosleep(&pause, NULL);
    }
    add(&flushes, n);
    return NULL;
}

static void *allocator(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg;
    enum { SLOTS = 24 }; /* few live blocks: a big parent makes every fork slow */
    unsigned char *slot[SLOTS] = {0};
    size_t size[SLOTS] = {0};
    long n = 0;
    while (!stop) {
        seed = seed * 1103515245u + 12345u;
        unsigned r = seed >> 8;
        unsigned k = r % SLOTS;
        /* The large tiers (1 and 4 MiB) one time in 8, the others evenly. */
        unsigned pick = (r / SLOTS) % 16;
        size_t want = (pick == 0 ? tiers[TIERS - 1] : pick == 1 ? tiers[TIERS - 2] : tiers[pick % (TIERS - 2)]) + r % 97;
        if (slot[k] && (r & 0x10000)) {
            unsigned char *q = realloc(slot[k], want);
            if (!q) break;
            slot[k] = q;
            size[k] = want;
        } else if (slot[k]) {
            free(slot[k]);
            slot[k] = NULL;
            continue;
        } else {
            slot[k] = malloc(want);
            if (!slot[k]) break;
            size[k] = want;
        }
        slot[k][0] = (unsigned char)k;
        slot[k][size[k] - 1] = (unsigned char)k;
        n++;
    }
    for (int k = 0; k < SLOTS; k++) {
        if (slot[k] && (slot[k][0] != (unsigned char)k || slot[k][size[k] - 1] != (unsigned char)k))
            __atomic_fetch_add(&alloc_errors, 1, __ATOMIC_RELAXED);
        free(slot[k]);
    }
    if (!stop) __atomic_fetch_add(&alloc_errors, 1, __ATOMIC_RELAXED); /* an allocation failed */
    add(&allocs_done, n);
    return NULL;
}

/* The file the readers read: lines of 1 B to 600 KiB. */
static int write_lines(void) {
    const char *dir = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/fork_stdio_lines.XXXXXX", dir && *dir ? dir : "/tmp");
    int fd = mkstemp(path);
    if (fd < 0) return -1;
    FILE *f = fdopen(fd, "w");
    if (!f) return -1;
    static const size_t lengths[] = {1, 10, 100, 1000, 5000, 20000, 100000, 300000, 600000, 50, 2};
    for (int rep = 0; rep < 3; rep++)
        for (size_t i = 0; i < sizeof lengths / sizeof lengths[0]; i++) {
            for (size_t j = 0; j < lengths[i]; j++) fputc('a' + (int)((i + j) % 26), f);
            fputc('\n', f);
        }
    return fclose(f);
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 3.0;
    if (argc > 2) forks_per_thread = atoi(argv[2]);
    setvbuf(stdout, NULL, _IONBF, 0); /* nothing buffered for a child's exit() to write again */
    if (write_lines() != 0) {
        perror("fork_stdio: writing the lines file");
        return 1;
    }
    pthread_t t[9];
    int nt = 0;
    for (int i = 0; i < 2; i++) pthread_create(&t[nt++], NULL, reader, (void *)(intptr_t)i);
    pthread_create(&t[nt++], NULL, flusher, NULL);
    for (int i = 0; i < 2; i++) pthread_create(&t[nt++], NULL, allocator, (void *)(uintptr_t)(i * 7919 + 3));
    pthread_t f[4];
    for (int i = 0; i < 4; i++) pthread_create(&f[i], NULL, forker, (void *)(intptr_t)(i + 1));

    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        struct timespec pause = {0, 20 * 1000 * 1000};
        nanosleep(&pause, NULL);
        clock_gettime(CLOCK_MONOTONIC, &now);
        double elapsed = (double)(now.tv_sec - start.tv_sec) + (double)(now.tv_nsec - start.tv_nsec) / 1e9;
        if (elapsed >= seconds || __atomic_load_n(&forks_done, __ATOMIC_RELAXED) >= 4L * forks_per_thread) break;
    }
    stop = 1;
    for (int i = 0; i < 4; i++) pthread_join(f[i], NULL);
    for (int i = 0; i < nt; i++) pthread_join(t[i], NULL);
    unlink(path);

    int bad = 0;
    if (children_bad) {
        fprintf(stderr, "fork_stdio: %ld of %ld children failed\n", children_bad, forks_done);
        bad = 1;
    }
    if (reader_errors || alloc_errors) {
        fprintf(stderr, "fork_stdio: %d reader errors, %d allocator errors\n", reader_errors, alloc_errors);
        bad = 1;
    }
    /* It ran at all (a slow machine forks slowly: about 100 forks in 3 s here). */
    if (forks_done < 16 || lines_read < 20 || flushes < 20) {
        fprintf(stderr, "fork_stdio: too little done: %ld forks, %ld lines, %ld flushes\n", forks_done, lines_read,
                flushes);
        bad = 1;
    }
    if (bad) return 1;
    printf("fork_stdio ok: %ld forks, %ld lines read, %ld flushes, %ld allocations\n", forks_done, lines_read, flushes,
           allocs_done);
    return 0;
}
