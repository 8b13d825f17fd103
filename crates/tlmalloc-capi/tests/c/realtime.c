/* The realtime mode through the C API (include/tlmalloc.h): a marked,
 * prewarmed thread runs small, medium, large (up to 512 MiB) and
 * cross-thread frees under a seccomp filter installed on that thread alone,
 * which traps mmap, munmap, mremap, madvise, mprotect and brk (a trapped
 * call prints its number and exits 86); then the counters, an unprepared
 * 300 MiB request, the pending list and tl_rt_drain, tl_mlock/tl_munlock,
 * and the argument checks. x86-64 only (the filter's architecture test). */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "check.h"
#include "tlmalloc.h"

#define MIB ((size_t)1 << 20)

static void trapped(int sig, siginfo_t *info, void *ctx) {
    (void)sig;
    (void)ctx;
    char line[64] = "realtime.c: forbidden system call ";
    size_t len = strlen(line);
    int nr = info->si_syscall;
    char digits[12];
    int n = 0;
    do {
        digits[n++] = (char)('0' + nr % 10);
        nr /= 10;
    } while (nr > 0 && n < 11);
    while (n > 0) line[len++] = digits[--n];
    line[len++] = '\n';
    (void)!write(2, line, len);
    _exit(86);
}

static void install_filter(void) {
    struct sock_filter prog[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, 4), /* arch */
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0xc000003e, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, 0), /* nr */
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_mmap, 6, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_munmap, 5, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_mremap, 4, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_madvise, 3, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_mprotect, 2, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_brk, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRAP),
    };
    struct sock_fprog fprog = {sizeof prog / sizeof prog[0], prog};
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = trapped;
    sa.sa_flags = SA_SIGINFO;
    if (sigaction(SIGSYS, &sa, NULL) != 0 || prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &fprog) != 0) {
        perror("realtime.c: seccomp");
        exit(2);
    }
}

#define HANDOFF 32
static _Atomic(void *) handoff[HANDOFF];
static atomic_int rt_done;
static int rt_failures;

static void *producer(void *arg) {
    (void)arg;
    unsigned n = 0;
    while (!atomic_load(&rt_done)) {
        for (int i = 0; i < HANDOFF; i++) {
            if (atomic_load(&handoff[i]) == NULL) {
                n++;
                void *p = malloc(n % 8 == 0 ? 300 * 1024 : 16 + n % 900);
                memset(p, 0x5a, 16);
                atomic_store(&handoff[i], p);
            }
        }
        sched_yield();
    }
    return NULL;
}

static const size_t sizes[] = {8, 48, 256, 1024, 4096, 100000, 256 * 1024, 4 * MIB, 512 * MIB};
static const size_t counts[] = {64, 64, 32, 16, 8, 4, 2, 1, 1};
#define NSIZES (sizeof sizes / sizeof sizes[0])

static void *realtime_thread(void *arg) {
    (void)arg;
    if (tl_prewarm(sizes, counts, NSIZES) != 0) {
        rt_failures++;
        atomic_store(&rt_done, 1);
        return NULL;
    }
    for (int i = 0; i < HANDOFF; i++)
        while (atomic_load(&handoff[i]) == NULL) sched_yield();
    if (tl_rt_thread(TL_RT_DEFER) != TL_RT_OFF) rt_failures++;
    void *live[256];
    install_filter();
    for (int round = 0; round < 30; round++) {
        int n = 0;
        for (size_t s = 0; s < NSIZES; s++)
            for (size_t c = 0; c < counts[s]; c++) {
                char *p = malloc(sizes[s]);
                if (p == NULL) { rt_failures++; continue; }
                p[0] = (char)round;
                p[sizes[s] - 1] = (char)round;
                live[n++] = p;
            }
        for (int i = n - 1; i >= 0; i--) free(live[i]);
        void *z = calloc(64, 4096);
        void *a = aligned_alloc(256, 1024);
        void *r = realloc(malloc(1000), 100000);
        r = realloc(r, 4 * MIB);
        if (z == NULL || a == NULL || r == NULL || ((char *)z)[64 * 4096 - 1] != 0) rt_failures++;
        free(z);
        free(a);
        free(r);
        for (int i = 0; i < HANDOFF; i++) {
            void *p = atomic_exchange(&handoff[i], NULL);
            free(p);
        }
    }
    atomic_store(&rt_done, 2);
    for (;;) pause(); /* the filter stays: this thread must not exit */
}

/* The process's locked memory (VmLck in /proc/self/status), KiB; -1 if unread. */
static long vm_locked_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (f == NULL) return -1;
    char line[256];
    long kib = -1;
    while (fgets(line, sizeof line, f) != NULL) {
        if (sscanf(line, "VmLck: %ld kB", &kib) == 1) break;
    }
    fclose(f);
    return kib;
}

int main(void) {
    pthread_t prod, rt;
    pthread_create(&prod, NULL, producer, NULL);
    pthread_create(&rt, NULL, realtime_thread, NULL);
    while (atomic_load(&rt_done) == 0) usleep(1000);
    pthread_join(prod, NULL);
    CHECK(atomic_load(&rt_done) == 2);
    CHECK(rt_failures == 0);
    CHECKF(tl_rt_violations() == 0, "%llu violations", tl_rt_violations());
    CHECK(tl_rt_forced_releases() == 0);
    tl_rt_drain();
    CHECK(tl_rt_pending_bytes() == 0);

    /* An unprepared request in a section: counted. A foreign block freed
     * there: parked until the drain. */
    unsigned long long before = tl_rt_violations();
    void *foreign = malloc(300 * MIB);
    int prev = tl_rt_thread(TL_RT_DEFER);
    CHECK(prev == TL_RT_OFF);
    void *p = malloc(300 * MIB);
    CHECK(p != NULL);
    CHECK(tl_rt_violations() > before);
    free(foreign);
    CHECK(tl_rt_pending_bytes() >= 300 * MIB);
    free(p);
    CHECK(tl_rt_thread(TL_RT_OFF) == TL_RT_DEFER);
    tl_rt_drain();
    CHECK(tl_rt_pending_bytes() == 0);

    /* Arguments. */
    errno = 0;
    CHECK(tl_rt_thread(7) == -1 && errno == EINVAL);
    errno = 0;
    size_t too_many[] = {MIB};
    size_t nine[] = {9};
    CHECK(tl_prewarm(too_many, nine, 1) == -1 && errno == ENOMEM);
    CHECK(tl_prewarm(NULL, NULL, 0) == 0);

    /* Between the two calls the background purger may give back cached
     * segments (their lock goes with them), so munlock may count fewer
     * bytes than mlock did; what must hold is that nothing stays locked. */
    size_t locked = tl_mlock();
    size_t unlocked = tl_munlock();
    CHECKF(locked == 0 || unlocked > 0, "locked %zu, unlocked none", locked);
    long still_locked = vm_locked_kib();
    CHECKF(still_locked == 0, "%ld KiB still locked", still_locked);
    printf("realtime.c: locked %zu bytes, unlocked %zu\n", locked, unlocked);
    return check_done();
}
