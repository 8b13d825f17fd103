// C++ allocation when the OS refuses memory, under LD_PRELOAD.
//
//   out_of_memory inject   (a libtlmalloc.so built with --features fault-injection)
//   out_of_memory ulimit   (under `ulimit -S -v N`: the soft RLIMIT_AS at N KiB)
//   out_of_memory vmsize   (prints this program's VmSize in KiB, to choose N)
//
// inject: every mmap, mremap and madvise of the allocator fails
// (tl_fault_injection_set(1000000)). Then:
// - operator new with a new-handler installed runs the handler; the
//   handler turns the failures off (memory comes back) and the retry
//   succeeds: the handler ran exactly once;
// - with no handler, new, new[] and aligned new throw std::bad_alloc; the
//   nothrow forms return nullptr with errno == ENOMEM, as malloc does;
// - small objects: new char[4000] succeeds from the pages already mapped
//   until they are used up, then throws std::bad_alloc; a handler that
//   deletes the objects it can find makes the retry succeed while every
//   OS call still fails (the freed pages serve it);
// - failures off: every size allocates again.
// ulimit: the same for a 256 MiB request against the address-space limit;
// the handler raises the soft limit to the hard one.
//
// A failed check prints one line; the program exits 1 if any failed, else
// prints "out_of_memory ok: ..." and exits 0.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <sys/resource.h>
#include <vector>

extern "C" {
// Exported by libtlmalloc.so only when built with the fault-injection feature.
void tl_fault_injection_set(unsigned ppm) __attribute__((weak));
unsigned long long tl_fault_injection_failures(void) __attribute__((weak));
}

namespace {

constexpr std::size_t KIB = std::size_t{1} << 10;
constexpr std::size_t MIB = std::size_t{1} << 20;

int nfailures, nchecks;

void check(bool ok, const char *what, int line) {
    nchecks++;
    if (ok) return;
    nfailures++;
    std::printf("out_of_memory: FAIL line %d: %s (errno %d)\n", line, what, errno);
}
#define CHECK(cond) check((cond), #cond, __LINE__)

// How the run makes the OS refuse memory, and give it back.
bool use_ulimit;
rlim_t soft_limit;

void memory_refused() {
    if (use_ulimit) {
        struct rlimit rl;
        getrlimit(RLIMIT_AS, &rl);
        rl.rlim_cur = soft_limit;
        setrlimit(RLIMIT_AS, &rl);
    } else {
        tl_fault_injection_set(1000000);
    }
}

void memory_back() {
    if (use_ulimit) {
        struct rlimit rl;
        getrlimit(RLIMIT_AS, &rl);
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_AS, &rl);
    } else {
        tl_fault_injection_set(0);
    }
}

int handler_calls;
void give_memory_back() {
    handler_calls++;
    memory_back();
}

// The small objects the freeing handler may delete.
std::vector<char *> *held;
void delete_held() {
    handler_calls++;
    if (!held || held->empty()) {
        std::set_new_handler(nullptr);  // nothing left: the next failure throws
        return;
    }
    for (char *p : *held) delete[] p;
    held->clear();
}

bool throws_bad_alloc(std::size_t n) {
    try {
        char *p = new char[n];
        p[0] = 1;
        delete[] p;
        return false;
    } catch (const std::bad_alloc &) {
        return true;
    }
}

bool aligned_throws_bad_alloc(std::size_t n) {
    try {
        void *p = ::operator new(n, std::align_val_t{4096});
        ::operator delete(p, std::align_val_t{4096});
        return false;
    } catch (const std::bad_alloc &) {
        return true;
    }
}

}  // namespace

int main(int argc, char **argv) {
    std::setvbuf(stdout, nullptr, _IONBF, 0);
    const char *mode = argc > 1 ? argv[1] : "";
    if (std::strcmp(mode, "vmsize") == 0) {
        FILE *f = std::fopen("/proc/self/status", "r");
        char line[256];
        while (f && std::fgets(line, sizeof line, f))
            if (std::strncmp(line, "VmSize:", 7) == 0) std::printf("%ld\n", std::atol(line + 7));
        return 0;
    }
    use_ulimit = std::strcmp(mode, "ulimit") == 0;
    if (!use_ulimit && std::strcmp(mode, "inject") != 0) {
        std::fprintf(stderr, "usage: out_of_memory inject|ulimit|vmsize\n");
        return 2;
    }
    if (use_ulimit) {
        struct rlimit rl;
        getrlimit(RLIMIT_AS, &rl);
        soft_limit = rl.rlim_cur;
        if (soft_limit == RLIM_INFINITY || soft_limit == rl.rlim_max) {
            std::printf("out_of_memory: run under `ulimit -S -v N` (soft limit below the hard one)\n");
            return 2;
        }
        memory_back();  // the checks below decide when memory is short
    } else if (!tl_fault_injection_set || !tl_fault_injection_failures) {
        std::printf("out_of_memory: libtlmalloc.so without the fault-injection feature\n");
        return 2;
    }
    // Beyond what the allocator keeps cached when freed (128 MiB), so that
    // every request of it needs a fresh mapping.
    const std::size_t big = 256 * MIB;

    // 1. A new-handler runs, gives memory back, and the retry succeeds.
    memory_refused();
    handler_calls = 0;
    std::set_new_handler(give_memory_back);
    char *p = nullptr;
    try {
        p = new char[big];
    } catch (const std::bad_alloc &) {
    }
    std::set_new_handler(nullptr);
    CHECK(p != nullptr);
    CHECK(handler_calls == 1);
    if (p) {
        p[0] = 1;
        p[big - 1] = 2;
        delete[] p;
    }

    // 2. No handler: the throwing forms throw, the nothrow ones return nullptr.
    memory_refused();
    CHECK(throws_bad_alloc(big));
    CHECK(aligned_throws_bad_alloc(big));
    errno = 0;
    char *q = new (std::nothrow) char[big];
    CHECK(q == nullptr && errno == ENOMEM);
    errno = 0;
    void *r = ::operator new(big, std::align_val_t{64}, std::nothrow);
    CHECK(r == nullptr && errno == ENOMEM);
    errno = 0;
    void *m = std::malloc(big);
    CHECK(m == nullptr && errno == ENOMEM);
    memory_back();
    delete[] q;
    ::operator delete(r, std::align_val_t{64});
    std::free(m);

    // 3. Small objects (injected failures only: under the limit the
    //    address space left would take long to fill).
    long small_before_throw = 0;
    if (!use_ulimit) {
        std::vector<char *> objects;
        objects.reserve(1 << 20);
        delete[] new char[4000];  // a page of this size is mapped
        memory_refused();
        bool threw = false;
        try {
            while (objects.size() < (1u << 20)) {
                objects.push_back(new char[4000]);
                objects.back()[3999] = 1;
            }
        } catch (const std::bad_alloc &) {
            threw = true;
        }
        small_before_throw = static_cast<long>(objects.size());
        CHECK(threw);
        CHECK(small_before_throw > 0);
        // A handler that frees what it can: the retry is served from the
        // freed pages although the OS still refuses everything.
        held = &objects;
        handler_calls = 0;
        std::set_new_handler(delete_held);
        char *s = nullptr;
        try {
            s = new char[4000];
        } catch (const std::bad_alloc &) {
        }
        std::set_new_handler(nullptr);
        held = nullptr;
        CHECK(s != nullptr);
        CHECK(handler_calls == 1);
        CHECK(objects.empty());
        delete[] s;
        for (char *o : objects) delete[] o;
        memory_back();
    }

    // 4. Memory is back: every size allocates again.
    for (std::size_t n : {std::size_t{16}, std::size_t{1000}, 100 * KIB, 1 * MIB, 8 * MIB, big}) {
        char *t = new (std::nothrow) char[n];
        CHECK(t != nullptr);
        if (t) {
            t[0] = 1;
            t[n - 1] = 2;
            delete[] t;
        }
    }

    if (nfailures) {
        std::printf("out_of_memory: %d of %d checks failed (%s)\n", nfailures, nchecks, mode);
        return 1;
    }
    std::printf("out_of_memory ok: %d checks (%s), %ld small objects before bad_alloc, %llu failures injected\n",
                nchecks, mode, small_before_throw, tl_fault_injection_failures ? tl_fault_injection_failures() : 0ULL);
    return 0;
}
