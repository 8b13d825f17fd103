// TL_POOL and the tl_stats_t layout from C++ (compiled with
// g++ -std=c++17 -Wall -Werror), linked against libtlmalloc.so.
// Prints "N passed, N failed".
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "tlmalloc.h"
#include "check.h"

namespace {

struct Node {
    Node *next;
    long value;
};

struct alignas(64) Wide {
    unsigned char bytes[80];
};

// A constant expression in C++: a pool may be constexpr (or a plain static).
constexpr tl_pool_t node_pool = TL_POOL(Node);
static_assert(node_pool.size == sizeof(Node), "TL_POOL size");
static_assert(node_pool.align == alignof(Node), "TL_POOL align");
static tl_pool_t wide_pool = TL_POOL(Wide);
static const tl_pool_t init_pool = TL_POOL_INIT(Node);

// The uint64_t scalars of tl_stats_t (tests/extensions.rs keeps this in
// step with the header).
constexpr std::size_t kStatsScalars = 26;
static_assert(sizeof(tl_stats_t) == 8 + 8 * kStatsScalars + 24 * TL_STATS_CLASSES,
              "tl_stats_t size");
static_assert(offsetof(tl_stats_t, classes) == 8 + 8 * kStatsScalars,
              "tl_stats_t.classes offset");

}  // namespace

int main() {
    CHECK(std::strcmp(node_pool.name, "Node") == 0);
    CHECK(wide_pool.size == sizeof(Wide) && wide_pool.align == 64);
    CHECK(init_pool.size == sizeof(Node));

    Node *head = nullptr;
    for (long i = 0; i < 1000; i++) {
        Node *n = static_cast<Node *>(tl_pool_alloc(&node_pool));
        if (n == nullptr) return 1;
        n->next = head;
        n->value = i;
        head = n;
    }
    long expected = 999, bad = 0;
    while (head != nullptr) {
        Node *next = head->next;
        bad += head->value != expected--;
        tl_pool_free(&node_pool, head);
        head = next;
    }
    CHECK(bad == 0);

    Wide *w = static_cast<Wide *>(tl_pool_alloc(&wide_pool));
    CHECK(w != nullptr && reinterpret_cast<std::uintptr_t>(w) % 64 == 0);
    tl_pool_free(&wide_pool, w);
    // In an expression.
    void *d = tl_pool_alloc(&static_cast<const tl_pool_t &>(TL_POOL(double)));
    CHECK(d != nullptr);
    tl_pool_free(&init_pool, nullptr);
    tl_free(d);

    tl_heap_t *h = tl_heap_new();
    CHECK(h != nullptr);
    void *p = tl_heap_malloc_aligned(h, 1000, 256);
    CHECK(p != nullptr && reinterpret_cast<std::uintptr_t>(p) % 256 == 0);
    tl_heap_destroy(h);

    tl_stats_t s;
    s.version = TL_STATS_VERSION;
    CHECK(tl_stats(&s) == 0 && s.class_count == TL_STATS_CLASSES);
    CHECK(s.user_heaps == 0);
    tl_collect(0);
    return check_done();
}
