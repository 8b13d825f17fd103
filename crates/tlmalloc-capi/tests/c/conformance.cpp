// C++ conformance of libtlmalloc.so under LD_PRELOAD: every operator
// new/delete variant resolves to libtlmalloc.so; aligned new; nothrow new;
// the new_handler loop, then std::bad_alloc; exceptions from a handler
// unwinding through operator new; handler retry after the failure went
// away; the standard library on top. Built with -O0 -fno-builtin.
#include <dlfcn.h>
#include <malloc.h>
#include <stdint.h>
#include <string.h>
#include <sys/resource.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <map>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "check.h"

static volatile size_t v_huge = SIZE_MAX / 2;

static bool from_tlmalloc(void *addr) {
    Dl_info info;
    if (addr == nullptr || dladdr(addr, &info) == 0 || info.dli_fname == nullptr) return false;
    return ends_with(info.dli_fname, "libtlmalloc.so");
}

static void test_symbols() {
    static const char *names[] = {
        "_Znwm", "_Znam", "_ZnwmRKSt9nothrow_t", "_ZnamRKSt9nothrow_t",
        "_ZnwmSt11align_val_t", "_ZnamSt11align_val_t",
        "_ZnwmSt11align_val_tRKSt9nothrow_t", "_ZnamSt11align_val_tRKSt9nothrow_t",
        "_ZdlPv", "_ZdaPv", "_ZdlPvm", "_ZdaPvm", "_ZdlPvRKSt9nothrow_t", "_ZdaPvRKSt9nothrow_t",
        "_ZdlPvSt11align_val_t", "_ZdaPvSt11align_val_t", "_ZdlPvmSt11align_val_t",
        "_ZdaPvmSt11align_val_t", "_ZdlPvSt11align_val_tRKSt9nothrow_t",
        "_ZdaPvSt11align_val_tRKSt9nothrow_t",
    };
    for (const char *name : names) {
        void *p = dlsym(RTLD_DEFAULT, name);
        CHECKF(from_tlmalloc(p), "%s does not resolve to libtlmalloc.so", name);
    }
    // The operators this program's own calls bind to.
    void *(*plain)(size_t) = &::operator new;
    void (*del)(void *) noexcept = &::operator delete;
    void *(*arr_aligned)(size_t, std::align_val_t) = &::operator new[];
    CHECK(from_tlmalloc(reinterpret_cast<void *>(plain)));
    CHECK(from_tlmalloc(reinterpret_cast<void *>(del)));
    CHECK(from_tlmalloc(reinterpret_cast<void *>(arr_aligned)));
}

struct Sized {
    char bytes[40];
};
struct alignas(64) A64 {
    char bytes[100];
};
struct alignas(4096) A4K {
    char bytes[10];
};
struct alignas(65536) A64K {
    char bytes[1];
};

static void test_new_delete() {
    int *i = new int(42);
    CHECK(*i == 42 && malloc_usable_size(i) >= sizeof(int));
    delete i;
    int *arr = new int[1000]();
    CHECK(arr[999] == 0 && malloc_usable_size(arr) >= 1000 * sizeof(int));
    delete[] arr;
    Sized *s = new Sized;  // sized delete: operator delete(void*, size_t)
    delete s;
    Sized *sa = new Sized[7];
    delete[] sa;
    void *z1 = ::operator new(0), *z2 = ::operator new(0);
    CHECK(z1 != nullptr && z2 != nullptr && z1 != z2);
    ::operator delete(z1);
    ::operator delete(z2, static_cast<size_t>(0));
    void *big = ::operator new(50 << 20);
    CHECK(big != nullptr && malloc_usable_size(big) >= (50u << 20));
    memset(big, 1, 50 << 20);
    ::operator delete(big, static_cast<size_t>(50 << 20));
    // new memory and malloc memory are the same allocator's.
    char *mixed = new char[100];
    CHECK(malloc_usable_size(mixed) >= 100);
    delete[] mixed;
}

static void test_aligned_new() {
    A64 *a = new A64;
    CHECK(aligned(a, 64));
    delete a;
    A64 *aa = new A64[33];
    CHECK(aligned(aa, 64));
    delete[] aa;
    A4K *b = new A4K;
    CHECK(aligned(b, 4096));
    delete b;
    A4K *ba = new A4K[3];
    CHECK(aligned(ba, 4096));
    delete[] ba;
    A64K *c = new A64K;
    CHECK(aligned(c, 65536));
    delete c;
    static const size_t aligns[] = {1, 2, 4, 8, 16, 32, 64, 256, 4096, 1 << 16, 1 << 20, 1 << 22, 1 << 23};
    static const size_t sizes[] = {0, 1, 100, 5000, 200000, 5 << 20};
    for (size_t al : aligns) {
        for (size_t n : sizes) {
            void *p = ::operator new(n, std::align_val_t(al));
            CHECKF(aligned(p, al) && malloc_usable_size(p) >= n, "new(%zu, align %zu) = %p", n, al, p);
            memset(p, 0x11, n);
            ::operator delete(p, n, std::align_val_t(al));
            p = ::operator new[](n, std::align_val_t(al));
            CHECK(aligned(p, al));
            ::operator delete[](p, std::align_val_t(al));
            p = ::operator new(n, std::align_val_t(al), std::nothrow);
            CHECK(p != nullptr && aligned(p, al));
            ::operator delete(p, std::align_val_t(al), std::nothrow);
            p = ::operator new[](n, std::align_val_t(al), std::nothrow);
            CHECK(p != nullptr && aligned(p, al));
            ::operator delete[](p, std::align_val_t(al), std::nothrow);
        }
    }
}

static void test_nothrow() {
    char *p = new (std::nothrow) char[100];
    CHECK(p != nullptr);
    delete[] p;
    int *q = new (std::nothrow) int(5);
    CHECK(q != nullptr && *q == 5);
    ::operator delete(q, std::nothrow);
    CHECK(::operator new(v_huge, std::nothrow) == nullptr);
    CHECK(::operator new[](v_huge, std::nothrow) == nullptr);
    CHECK(::operator new(v_huge, std::align_val_t(64), std::nothrow) == nullptr);
    CHECK(::operator new[](v_huge, std::align_val_t(64), std::nothrow) == nullptr);
    CHECK(::operator new(64, std::align_val_t(3), std::nothrow) == nullptr);
    ::operator delete(nullptr, std::nothrow);
    ::operator delete[](nullptr, std::nothrow);
}

template <typename F>
static bool throws_bad_alloc(F f) {
    try {
        f();
    } catch (const std::bad_alloc &) {
        return true;
    } catch (...) {
        return false;
    }
    return false;
}

static int handler_calls;
static void counting_handler() {
    if (++handler_calls == 3) std::set_new_handler(nullptr);
}

struct HandlerError {
    int code;
};
static void throwing_handler() { throw HandlerError{7}; }
static void bad_alloc_handler() { throw std::bad_alloc(); }

static void test_bad_alloc() {
    std::set_new_handler(nullptr);
    CHECK(throws_bad_alloc([] { (void)::operator new(v_huge); }));
    CHECK(throws_bad_alloc([] { (void)::operator new[](v_huge); }));
    CHECK(throws_bad_alloc([] { (void)::operator new(v_huge, std::align_val_t(64)); }));
    CHECK(throws_bad_alloc([] { (void)::operator new[](v_huge, std::align_val_t(4096)); }));
    // An alignment that is not a power of two throws at once (as libstdc++).
    CHECK(throws_bad_alloc([] { (void)::operator new(64, std::align_val_t(3)); }));

    // The handler runs until it uninstalls itself, then bad_alloc.
    for (int form = 0; form < 4; form++) {
        handler_calls = 0;
        std::set_new_handler(counting_handler);
        bool threw = throws_bad_alloc([form] {
            switch (form) {
                case 0: (void)::operator new(v_huge); break;
                case 1: (void)::operator new[](v_huge); break;
                case 2: (void)::operator new(v_huge, std::align_val_t(128)); break;
                default: (void)::operator new[](v_huge, std::align_val_t(1 << 22)); break;
            }
        });
        CHECKF(threw && handler_calls == 3, "form %d: threw %d, handler calls %d", form, threw, handler_calls);
    }

    // nothrow new returns NULL without running the handler.
    handler_calls = 0;
    std::set_new_handler(counting_handler);
    CHECK(::operator new(v_huge, std::nothrow) == nullptr);
    CHECK(handler_calls == 0);
    std::set_new_handler(nullptr);

    // An exception thrown by the handler reaches the caller of new.
    std::set_new_handler(throwing_handler);
    int code = 0;
    try {
        (void)::operator new(v_huge);
    } catch (const HandlerError &e) {
        code = e.code;
    }
    CHECK(code == 7);
    code = 0;
    try {
        (void)::operator new[](v_huge, std::align_val_t(64));
    } catch (const HandlerError &e) {
        code = e.code;
    }
    CHECK(code == 7);
    std::set_new_handler(bad_alloc_handler);
    CHECK(throws_bad_alloc([] { (void)::operator new(v_huge); }));
    std::set_new_handler(nullptr);

    // Many throws: each exception object is allocated with malloc.
    int caught = 0;
    for (int i = 0; i < 1000; i++) {
        try {
            throw std::runtime_error(std::string(100 + i % 50, 'x'));
        } catch (const std::runtime_error &e) {
            caught += e.what()[0] == 'x';
        }
    }
    CHECK(caught == 1000);
}

// A handler that makes the failure go away: allocation is refused by an
// address-space limit, and the handler lifts the limit, so the retry works.
static rlim_t saved_limit;
static void lifting_handler() {
    handler_calls++;
    struct rlimit rl;
    getrlimit(RLIMIT_AS, &rl);
    rl.rlim_cur = saved_limit;
    setrlimit(RLIMIT_AS, &rl);
}

static size_t vm_bytes() {
    FILE *f = fopen("/proc/self/statm", "r");
    size_t pages = 0;
    if (f) {
        if (fscanf(f, "%zu", &pages) != 1) pages = 0;
        fclose(f);
    }
    return pages * 4096;
}

static void test_handler_retry() {
    struct rlimit rl;
    getrlimit(RLIMIT_AS, &rl);
    saved_limit = rl.rlim_cur;
    size_t request = 1ul << 30;
    rl.rlim_cur = vm_bytes() + (256ul << 20);
    if (setrlimit(RLIMIT_AS, &rl) != 0) {
        CHECK(!"setrlimit");
        return;
    }
    // Under the limit, malloc fails with ENOMEM (the mmap failure path).
    errno = 0;
    void *m = malloc(request);
    CHECK(m == nullptr && errno == ENOMEM);
    CHECK(::operator new(request, std::nothrow) == nullptr);
    handler_calls = 0;
    std::set_new_handler(lifting_handler);
    void *p = nullptr;
    try {
        p = ::operator new(request);
    } catch (...) {
        p = nullptr;
    }
    std::set_new_handler(nullptr);
    CHECKF(p != nullptr && handler_calls == 1, "p %p, handler calls %d", p, handler_calls);
    if (p) {
        memset(p, 3, 4096);
        ::operator delete(p);
    }
    getrlimit(RLIMIT_AS, &rl);
    rl.rlim_cur = saved_limit;
    setrlimit(RLIMIT_AS, &rl);
}

struct Node {
    std::string name;
    std::vector<int> values;
    std::shared_ptr<Node> next;
};

static void test_library() {
    std::map<int, std::string> m;
    std::unordered_map<std::string, std::vector<int>> u;
    for (int i = 0; i < 20000; i++) {
        m[i] = std::to_string(i * 7);
        u[std::to_string(i)].push_back(i);
    }
    for (int i = 0; i < 20000; i += 2) m.erase(i);
    CHECK(m.size() == 10000 && u.size() == 20000 && m[1] == "7");
    std::shared_ptr<Node> head;
    for (int i = 0; i < 1000; i++) {
        auto n = std::make_shared<Node>();
        n->name = std::string(i % 300, 'n');
        n->values.assign(i % 50, i);
        n->next = head;
        head = n;
    }
    size_t count = 0;
    for (auto n = head; n; n = n->next) count++;
    CHECK(count == 1000);
    while (head) head = head->next;  // iterative teardown

    // Threads, with objects deleted by a thread other than the allocating one.
    std::vector<std::vector<std::string> *> made(4);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; t++) {
        threads.emplace_back([t, &made] {
            auto *v = new std::vector<std::string>();
            for (int i = 0; i < 20000; i++) v->push_back(std::string(1 + (i * 13 + t) % 200, 'a' + t));
            made[t] = v;
            thread_local std::vector<int> per_thread(1000, t);  // destroyed at thread exit
            per_thread.push_back(t);
        });
    }
    for (auto &th : threads) th.join();
    threads.clear();
    std::atomic<size_t> total{0};
    for (int t = 0; t < 4; t++) {
        threads.emplace_back([t, &made, &total] {
            auto *v = made[(t + 1) % 4];
            total += v->size();
            delete v;
        });
    }
    for (auto &th : threads) th.join();
    CHECK(total == 80000);
}

int main() {
    test_symbols();
    test_new_delete();
    test_aligned_new();
    test_nothrow();
    test_bad_alloc();
    test_handler_retry();
    test_library();
    return check_done();
}
