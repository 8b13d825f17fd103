// errno after failing C++ allocations, out of address space under
// RLIMIT_AS, under LD_PRELOAD (the C++ half of errno_enomem.c).
//
//   errno_enomem_cpp [LIMIT_MB]      (default 200)
//
// After a small warm-up the program sets RLIMIT_AS to LIMIT_MB. Then, on
// a thread with a PTHREAD_STACK_MIN (16 KiB) stack (recording, never
// printing) and on the main thread, with errno preset to 0:
// - operator new(huge, std::nothrow), operator new[](huge, std::nothrow),
//   and their std::align_val_t forms (huge: 1 GiB and SIZE_MAX/2) return
//   nullptr and leave errno == ENOMEM, as the C functions do;
// - new (std::nothrow) char[n] likewise;
// and on the main thread only (an exception unwinds through the stack):
// - the throwing operator new, operator new[] and aligned new throw
//   std::bad_alloc;
// then small, medium and large blocks are allocated again.
// A failed check prints one line naming the function; the program exits 1
// if any failed, else prints "errno_enomem_cpp ok: ..." and exits 0.
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <new>
#include <pthread.h>
#include <sys/resource.h>

namespace {

constexpr std::size_t KIB = std::size_t{1} << 10;
constexpr std::size_t MIB = std::size_t{1} << 20;
constexpr std::size_t GIB = std::size_t{1} << 30;

struct Failure {
    const char *where;
    const char *what;
    int line;
    long ret;
    int err;
};

constexpr int MAX_FAILURES = 64;
Failure failures[MAX_FAILURES];
int nfailures, nchecks;

void check(bool ok, const char *where, const char *what, int line, long ret, int err) {
    __atomic_fetch_add(&nchecks, 1, __ATOMIC_RELAXED);
    if (ok) return;
    int i = __atomic_fetch_add(&nfailures, 1, __ATOMIC_SEQ_CST);
    if (i < MAX_FAILURES) failures[i] = Failure{where, what, line, ret, err};
}

// `call` must return nullptr with errno == ENOMEM (errno preset to 0);
// `release` frees what it returned if it did not fail.
#define NOTHROW_FAILS(call, release)                                                                \
    do {                                                                                            \
        errno = 0;                                                                                  \
        void *r_ = (call);                                                                          \
        int e_ = errno;                                                                             \
        check(r_ == nullptr && e_ == ENOMEM, where, #call " -> nullptr, errno ENOMEM", __LINE__,   \
              (long)(std::intptr_t)r_, e_);                                                         \
        if (r_) release;                                                                            \
    } while (0)

#define THROWS_BAD_ALLOC(call, release)                                                             \
    do {                                                                                            \
        bool threw_ = false;                                                                        \
        void *r_ = nullptr;                                                                         \
        try {                                                                                       \
            r_ = (call);                                                                            \
        } catch (const std::bad_alloc &) {                                                          \
            threw_ = true;                                                                          \
        }                                                                                           \
        check(threw_ && r_ == nullptr, where, #call " throws std::bad_alloc", __LINE__,            \
              (long)(std::intptr_t)r_, errno);                                                      \
        if (r_) release;                                                                            \
    } while (0)

void nothrow_checks(const char *where) {
    volatile std::size_t huge_v = GIB, half_v = SIZE_MAX / 2;
    std::size_t huge = huge_v, half = half_v;
    const std::align_val_t a64{64}, a4k{4 * KIB};

    NOTHROW_FAILS(::operator new(huge, std::nothrow), ::operator delete(r_));
    NOTHROW_FAILS(::operator new(half, std::nothrow), ::operator delete(r_));
    NOTHROW_FAILS(::operator new[](huge, std::nothrow), ::operator delete[](r_));
    NOTHROW_FAILS(::operator new[](half, std::nothrow), ::operator delete[](r_));
    NOTHROW_FAILS(::operator new(huge, a64, std::nothrow), ::operator delete(r_, a64));
    NOTHROW_FAILS(::operator new(half, a4k, std::nothrow), ::operator delete(r_, a4k));
    NOTHROW_FAILS(::operator new[](huge, a4k, std::nothrow), ::operator delete[](r_, a4k));
    NOTHROW_FAILS(::operator new[](half, a64, std::nothrow), ::operator delete[](r_, a64));
    NOTHROW_FAILS(new (std::nothrow) char[huge], delete[] static_cast<char *>(r_));

    // Recovered.
    for (std::size_t n : {std::size_t{16}, std::size_t{1000}, 64 * KIB, 1 * MIB, 8 * MIB}) {
        char *p = new (std::nothrow) char[n];
        check(p != nullptr, where, "new (std::nothrow) char[n] after the failures", __LINE__, 0, errno);
        if (p) {
            std::memset(p, 0x5a, n < 4096 ? n : 4096);
            delete[] p;
        }
    }
}

void *thread_main(void *) {
    nothrow_checks("thread (16 KiB stack)");
    return nullptr;
}

}  // namespace

int main(int argc, char **argv) {
    long limit_mb = argc > 1 ? std::atol(argv[1]) : 200;
    std::setvbuf(stdout, nullptr, _IONBF, 0);
    for (int i = 0; i < 100; i++) delete[] new char[static_cast<std::size_t>(i) * 100 + 1];

    struct rlimit rl = {static_cast<rlim_t>(limit_mb) * MIB, static_cast<rlim_t>(limit_mb) * MIB};
    if (setrlimit(RLIMIT_AS, &rl) != 0) {
        std::perror("errno_enomem_cpp: setrlimit(RLIMIT_AS)");
        return 1;
    }

    pthread_attr_t attr;
    pthread_attr_init(&attr);
    std::size_t stack = PTHREAD_STACK_MIN;
    pthread_attr_setstacksize(&attr, stack);
    pthread_t t;
    int rc = pthread_create(&t, &attr, thread_main, nullptr);
    if (rc != 0) {
        std::fprintf(stderr, "errno_enomem_cpp: pthread_create: %s\n", std::strerror(rc));
        return 1;
    }
    pthread_join(t, nullptr);

    const char *where = "main thread";
    nothrow_checks(where);
    {
        volatile std::size_t huge_v = GIB, half_v = SIZE_MAX / 2;
        std::size_t huge = huge_v, half = half_v;
        const std::align_val_t a64{64};
        THROWS_BAD_ALLOC(::operator new(huge), ::operator delete(r_));
        THROWS_BAD_ALLOC(::operator new(half), ::operator delete(r_));
        THROWS_BAD_ALLOC(::operator new[](huge), ::operator delete[](r_));
        THROWS_BAD_ALLOC(::operator new(huge, a64), ::operator delete(r_, a64));
        THROWS_BAD_ALLOC(new char[huge], delete[] static_cast<char *>(r_));
        char *p = new char[1000];
        p[999] = 1;
        delete[] p;
    }

    int n = nfailures < MAX_FAILURES ? nfailures : MAX_FAILURES;
    for (int i = 0; i < n; i++)
        std::printf("errno_enomem_cpp: FAIL %s: line %d: %s: returned %#lx, errno %d (%s)\n", failures[i].where,
                    failures[i].line, failures[i].what, static_cast<unsigned long>(failures[i].ret), failures[i].err,
                    failures[i].err == 0        ? "0"
                    : failures[i].err == ENOMEM ? "ENOMEM"
                                                : "other");
    if (nfailures) {
        std::printf("errno_enomem_cpp: %d of %d checks failed (huge: 1 GiB; half: SIZE_MAX/2)\n", nfailures, nchecks);
        return 1;
    }
    std::printf("errno_enomem_cpp ok: %d checks on the main thread and a thread with a %zu-byte stack\n", nchecks,
                stack);
    return 0;
}
