/* fork while other threads are inside the allocator: four threads allocate
 * and free (small, medium and large blocks, short-lived threads of their
 * own, cross-thread frees) while the main thread forks again and again.
 * Each child allocates and frees at once, frees blocks the parent's threads
 * allocated, starts a thread, and exits; a child that hangs is killed by
 * alarm(). Prints "fork ok" when every child exited cleanly. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define SHARED 64
static void *shared[SHARED];
static pthread_mutex_t shared_lock = PTHREAD_MUTEX_INITIALIZER;
static volatile int stop;

static size_t pick_size(unsigned *seed) {
    *seed = *seed * 1103515245 + 12345;
    unsigned r = *seed >> 8;
    switch (r % 16) {
        case 0: return 200000 + r % 3000000; /* large: segment cache and mmap */
        case 1: case 2: return 8193 + r % 120000; /* medium */
        default: return 1 + r % 2000;
    }
}

static void *short_thread(void *arg) {
    void *p[20];
    for (int i = 0; i < 20; i++) p[i] = malloc((size_t)(uintptr_t)arg + (size_t)i * 10);
    for (int i = 0; i < 20; i += 2) free(p[i]);
    return NULL; /* the rest is abandoned */
}

static void *worker(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg;
    void *slots[128] = {0};
    unsigned long iter = 0;
    while (!stop) {
        unsigned k = (seed >> 4) % 128;
        if (slots[k]) {
            free(slots[k]);
            slots[k] = NULL;
        } else {
            size_t n = pick_size(&seed);
            slots[k] = malloc(n);
            if (!slots[k]) abort();
            memset(slots[k], (int)k, n < 64 ? n : 64);
        }
        seed = seed * 1103515245 + 12345;
        if (++iter % 64 == 0) {
            /* Swap a block with the shared array: frees from other threads. */
            pthread_mutex_lock(&shared_lock);
            unsigned s = seed % SHARED;
            void *old = shared[s];
            shared[s] = malloc(48);
            pthread_mutex_unlock(&shared_lock);
            free(old);
        }
        if (iter % 5000 == 0) {
            pthread_t t;
            if (pthread_create(&t, NULL, short_thread, (void *)(uintptr_t)(seed % 4000 + 1)) == 0)
                pthread_join(t, NULL);
        }
    }
    for (int k = 0; k < 128; k++) free(slots[k]);
    return NULL;
}

static void *child_thread(void *arg) {
    (void)arg;
    for (int i = 0; i < 200; i++) free(malloc((size_t)i * 100 + 1));
    return NULL;
}

static void child(int n, void *inherited[SHARED]) {
    alarm(20);
    unsigned seed = (unsigned)n * 7919 + 1;
    void *p[300];
    for (int i = 0; i < 300; i++) {
        size_t n = pick_size(&seed);
        p[i] = malloc(n);
        if (!p[i]) _exit(3);
        memset(p[i], 1, n < 256 ? n : 256);
        ((char *)p[i])[n - 1] = 1;
    }
    for (int i = 0; i < 300; i++) free(p[i]);
    for (int i = 0; i < SHARED; i++) free(inherited[i]); /* blocks of the parent's threads */
    if (n % 4 == 0) {
        pthread_t t;
        if (pthread_create(&t, NULL, child_thread, NULL) != 0) _exit(4);
        pthread_join(t, NULL);
    }
    char *s = strdup("child");
    free(s);
    if (n % 2) exit(0); /* exit handlers and tlmalloc's destructor too */
    _exit(0);
}

int main(int argc, char **argv) {
    int forks = argc > 1 ? atoi(argv[1]) : 200;
    pthread_t t[4];
    for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)(i * 1000 + 17));
    int bad = 0;
    for (int n = 0; n < forks; n++) {
        void *inherited[SHARED];
        /* Take the blocks out under the lock: in the child they are ours to free. */
        pthread_mutex_lock(&shared_lock);
        memcpy(inherited, shared, sizeof shared);
        memset(shared, 0, sizeof shared);
        pthread_mutex_unlock(&shared_lock);
        pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            return 1;
        }
        if (pid == 0) child(n, inherited);
        for (int i = 0; i < SHARED; i++) free(inherited[i]);
        int status = 0;
        if (waitpid(pid, &status, 0) != pid) return 1;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "child %d: %s %d\n", n, WIFSIGNALED(status) ? "signal" : "exit",
                    WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
            bad++;
        }
    }
    stop = 1;
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < SHARED; i++) free(shared[i]);
    if (bad) {
        fprintf(stderr, "%d of %d children failed\n", bad, forks);
        return 1;
    }
    printf("fork ok: %d children\n", forks);
    return 0;
}
