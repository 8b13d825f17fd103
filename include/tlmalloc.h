/*
 * tlmalloc.h - the C API of libtlmalloc (a thread-caching memory allocator).
 *
 * Two ways to use tlmalloc from C or C++:
 *
 *  1. Replace malloc for a whole program, without recompiling it:
 *         LD_PRELOAD=/path/to/libtlmalloc.so program args...
 *     or  tlmalloc run [--stats] -- program args...
 *     Every malloc, free, calloc, realloc, reallocarray, posix_memalign,
 *     aligned_alloc, memalign, valloc, pvalloc, malloc_usable_size,
 *     free_sized, free_aligned_sized, malloc_trim, the glibc __libc_* aliases
 *     and every C++ operator new/delete then come from tlmalloc, with glibc's
 *     semantics.
 *
 *  2. Link it (cc prog.c $(pkg-config --cflags --libs tlmalloc)): the same
 *     replacement, plus the tl_ functions below, which only tlmalloc has.
 *
 * Semantics shared by every function here:
 *  - Every block is 16-byte aligned (the smallest block is 16 bytes).
 *  - A request that cannot be met returns NULL with errno = ENOMEM.
 *  - Passing a pointer tlmalloc did not hand out to a function that frees,
 *    resizes or measures a block prints one line naming the pointer and the
 *    function on stderr, then calls abort().
 *  - Blocks may be freed by any thread, not only the one that allocated them.
 *
 * Environment: TLMALLOC_SHOW_STATS=1 prints a statistics table on stderr
 * when each process exits; TLMALLOC_SHOW_STATS=pid:N only when process N
 * does (what `tlmalloc run --stats` sets); TLMALLOC_STATS_JSON=path writes
 * the same figures as JSON at exit (%p in the path becomes the pid). A
 * process that ends with _exit() reports nothing. Every option (README.md lists them) is a TLMALLOC_*
 * variable; a bad value or an unknown TLMALLOC_* name prints one warning
 * line on stderr and is ignored. tl_option_set changes one at run time.
 */
#ifndef TLMALLOC_H
#define TLMALLOC_H

#include <stddef.h>
#include <stdint.h>

/* The version of this header; tl_version() returns the library's as
 * "MAJOR.MINOR.PATCH". The library's SONAME is libtlmalloc.so.MAJOR: a
 * program linked with -ltlmalloc loads any library of the same major. */
#define TLMALLOC_VERSION_MAJOR 0
#define TLMALLOC_VERSION_MINOR 1
#define TLMALLOC_VERSION_PATCH 0

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) || defined(__clang__)
#define TL_MALLOC_ATTR __attribute__((malloc, warn_unused_result))
#define TL_ALLOC_SIZE(n) __attribute__((alloc_size(n)))
#define TL_ALLOC_SIZE2(n, m) __attribute__((alloc_size(n, m)))
#define TL_ALLOC_ALIGN(n) __attribute__((alloc_align(n)))
#else
#define TL_MALLOC_ATTR
#define TL_ALLOC_SIZE(n)
#define TL_ALLOC_SIZE2(n, m)
#define TL_ALLOC_ALIGN(n)
#endif

/* Allocate `size` bytes (uninitialised). tl_malloc(0) returns a unique,
 * freeable block. NULL with errno = ENOMEM when out of memory. */
void *tl_malloc(size_t size) TL_MALLOC_ATTR TL_ALLOC_SIZE(1);

/* Allocate `count * size` zeroed bytes. NULL with errno = ENOMEM when the
 * product overflows or memory is exhausted. */
void *tl_calloc(size_t count, size_t size) TL_MALLOC_ATTR TL_ALLOC_SIZE2(1, 2);

/* Resize `p` to `size` bytes, keeping min(old, new) bytes of its contents;
 * in place when the block allows it. tl_realloc(NULL, n) is tl_malloc(n);
 * tl_realloc(p, 0) frees p and returns NULL (as glibc's realloc). On failure
 * returns NULL with errno = ENOMEM and leaves p untouched. */
void *tl_realloc(void *p, size_t size) TL_ALLOC_SIZE(2);

/* tl_realloc(p, count * size), or NULL with errno = ENOMEM (p untouched)
 * when the product overflows. */
void *tl_reallocarray(void *p, size_t count, size_t size) TL_ALLOC_SIZE2(2, 3);

/* Allocate `size` bytes aligned to `alignment`, which must be a power of two
 * (any power of two: 1 to 2^62). NULL with errno = EINVAL for another
 * alignment, NULL with errno = ENOMEM when out of memory. Free with tl_free. */
void *tl_malloc_aligned(size_t size, size_t alignment) TL_MALLOC_ATTR TL_ALLOC_SIZE(1)
    TL_ALLOC_ALIGN(2);

/* Free a block from any tl_ or malloc-family function, from any thread.
 * NULL is ignored. */
void tl_free(void *p);

/* tl_malloc, with the caller's promise to free the block with
 * tl_free_sized(p, size) and the same size (or the size tl_realloc last
 * resized it to). The block is the one tl_malloc(size) would return. */
void *tl_malloc_sized(size_t size) TL_MALLOC_ATTR TL_ALLOC_SIZE(1);

/* tl_free for a caller that knows the size it asked for (C23 free_sized):
 * a block of tl_malloc_sized, tl_malloc, tl_calloc (count * size) or
 * tl_realloc. A library built with the core's `check` feature verifies the
 * size and reports a wrong one (one line on stderr, then abort()). */
void tl_free_sized(void *p, size_t size);

/* tl_free for a caller that knows the alignment and size it asked for
 * (C23 free_aligned_sized): a block of tl_malloc_aligned(size, alignment).
 * Checked like tl_free_sized. */
void tl_free_aligned_sized(void *p, size_t alignment, size_t size);

/* The bytes usable in the block at `p`: at least what was asked for, and all
 * of them may be written. 0 for NULL. */
size_t tl_usable_size(const void *p);

/* The usable size a request of `size` bytes would get (so a growing buffer
 * can ask for exactly what it will receive); SIZE_MAX when no block that
 * large can exist. */
size_t tl_good_size(size_t size);

/* Return memory to the OS now. With `force` non-zero, everything that can
 * be: memory freed to the calling thread's heap by other threads is
 * collected, empty pages are released, segments of exited threads are taken
 * over, and the cache of empty segments is unmapped (what malloc_trim
 * does). With `force` zero, only what is cheap and the calling thread's
 * own: its remote frees, its empty pages, and purges that are due. Never
 * needed for correctness. */
void tl_collect(int force);

/* ---- Typed pools --------------------------------------------------------
 * A pool describes one type of object:
 *     struct node { struct node *next; int value; };
 *     static tl_pool_t node_pool = TL_POOL(struct node);
 *     struct node *n = tl_pool_alloc(&node_pool);
 *     ...
 *     tl_pool_free(&node_pool, n);
 * It is a descriptor, not a store: tl_pool_alloc takes a block of the size
 * class the object falls in from the calling thread's free list of that
 * class, shared with every other allocation of the class, and the block
 * has no header. tl_pool_free is tl_free_aligned_sized with the pool's
 * size and alignment, so a library built with the `check` feature reports
 * an object freed to the wrong pool. Objects may be freed from any thread
 * (also with plain tl_free or free).
 *
 * In C, TL_POOL(type) and TL_POOL_INIT(type) are brace initializers (ISO C
 * has no constant compound literals): write (tl_pool_t)TL_POOL(type) for a
 * pool in an expression. In C++, TL_POOL(type) is a tl_pool_t value. */
typedef struct tl_pool {
    size_t size;      /* sizeof(type) */
    size_t align;     /* alignof(type): a power of two */
    const char *name; /* the type's name as written, for debuggers and logs */
} tl_pool_t;

#ifdef __cplusplus
/* Variadic, so that a type with a comma (std::pair<int, double>) works. */
#define TL_POOL_INIT(...) { sizeof(__VA_ARGS__), alignof(__VA_ARGS__), #__VA_ARGS__ }
#define TL_POOL(...) (tl_pool_t{ sizeof(__VA_ARGS__), alignof(__VA_ARGS__), #__VA_ARGS__ })
#else
#if defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
#define TL_ALIGNOF_(type) _Alignof(type)
#else
#define TL_ALIGNOF_(type) __alignof__(type)
#endif
#define TL_POOL_INIT(type) { sizeof(type), TL_ALIGNOF_(type), #type }
#define TL_POOL(type) TL_POOL_INIT(type)
#endif

/* A block for one object of `pool` (tl_malloc_aligned(pool->size,
 * pool->align)). NULL with errno = EINVAL when `pool` is NULL or its align
 * is not a power of two; NULL with errno = ENOMEM when out of memory. */
void *tl_pool_alloc(const tl_pool_t *pool) TL_MALLOC_ATTR;

/* Free an object of `pool` (from any thread). NULL `p` is ignored; a NULL
 * `pool` frees `p` as tl_free does, unchecked. */
void tl_pool_free(const tl_pool_t *pool, void *p);

/* ---- Heaps --------------------------------------------------------------
 * A heap of its own: its allocations share no page with any other heap,
 * and tl_heap_destroy releases all of its memory in one call, blocks still
 * live included. One thread at a time may allocate from a heap (or collect
 * or destroy it); its blocks may be freed with plain free or tl_free from
 * any thread, as long as the heap is not being destroyed meanwhile. */
typedef struct tl_heap tl_heap_t;

/* A new, empty heap; NULL with errno = ENOMEM when out of memory. */
tl_heap_t *tl_heap_new(void);

/* tl_malloc(size) from `heap`. NULL with errno = EINVAL when `heap` is
 * NULL, with errno = ENOMEM when out of memory. */
void *tl_heap_malloc(tl_heap_t *heap, size_t size) TL_MALLOC_ATTR TL_ALLOC_SIZE(2);

/* tl_calloc(count, size) from `heap`: NULL with errno = ENOMEM when the
 * product overflows or memory is exhausted (EINVAL for a NULL heap). */
void *tl_heap_calloc(tl_heap_t *heap, size_t count, size_t size) TL_MALLOC_ATTR
    TL_ALLOC_SIZE2(2, 3);

/* tl_malloc_aligned(size, alignment) from `heap`: NULL with errno = EINVAL
 * when `alignment` is not a power of two (or `heap` is NULL), with
 * errno = ENOMEM when out of memory. */
void *tl_heap_malloc_aligned(tl_heap_t *heap, size_t size, size_t alignment) TL_MALLOC_ATTR
    TL_ALLOC_SIZE(2) TL_ALLOC_ALIGN(3);

/* Return what `heap` can return now: blocks other threads freed are
 * collected, empty pages released. NULL is ignored. */
void tl_heap_collect(tl_heap_t *heap);

/* Release `heap` and all of its memory, blocks still live included (they
 * must not be used or freed afterwards). NULL is ignored. */
void tl_heap_destroy(tl_heap_t *heap);

/* ---- Statistics ---------------------------------------------------------
 * Every counter, merged over all threads. Figures of threads running
 * during the read may be off by what they did meanwhile; once they stop,
 * every figure is exact. A library whose layout differs has a higher
 * TL_STATS_VERSION, and tl_stats refuses a version above the library's. */
#define TL_STATS_VERSION 2
/* Entries of tl_stats_t.classes: the number of size classes. */
#define TL_STATS_CLASSES 96

/* Allocations and frees of one size class. */
typedef struct tl_class_stats {
    uint64_t block_size; /* the class's block size in bytes */
    uint64_t allocs;     /* blocks of this class handed out */
    uint64_t frees;      /* blocks of this class given back */
} tl_class_stats_t;

typedef struct tl_stats {
    uint32_t version;             /* set to TL_STATS_VERSION before tl_stats */
    uint32_t class_count;         /* entries of `classes` in use */
    uint64_t counters_enabled;    /* 1 when the library counts every allocation and free (built
                                   * with the `stats` feature); 0: allocs, frees, live_bytes,
                                   * large_allocs, large_frees, large_live_bytes, remote_frees
                                   * and classes[].allocs/frees stay 0 */
    uint64_t allocs;              /* blocks handed out: sum of classes[].allocs + large_allocs */
    uint64_t frees;               /* blocks given back, all sizes */
    uint64_t live_bytes;          /* bytes of live blocks, at their usable (class) size */
    uint64_t large_allocs;        /* large blocks (above 256 KiB, or aligned above 64 KiB) */
    uint64_t large_frees;         /* large blocks given back */
    uint64_t large_live_bytes;    /* bytes of live large blocks (included in live_bytes) */
    uint64_t remote_frees;        /* frees of a block of another thread's heap (or a tl_heap_t) */
    uint64_t pages_in_use;        /* small and medium pages carved for blocks */
    uint64_t page_bytes;          /* bytes of those pages, free blocks included */
    uint64_t peak_page_bytes;     /* the largest page_bytes has been */
    uint64_t segments_in_use;     /* segments (4 MiB regions, or one per large block) in use */
    uint64_t reserved_bytes;      /* bytes mapped from the OS */
    uint64_t peak_reserved_bytes; /* the largest reserved_bytes has been */
    uint64_t committed_bytes;     /* mapped bytes not purged: what may be resident */
    uint64_t large_cache_hits;    /* large blocks served from a recycle cache */
    uint64_t large_cache_misses;  /* large blocks that needed a new mapping */
    uint64_t purge_calls;         /* madvise calls that returned memory (purges) */
    uint64_t purged_bytes;        /* bytes returned that way */
    uint64_t map_calls;           /* mmap calls */
    uint64_t unmap_calls;         /* munmap calls */
    uint64_t remap_calls;         /* mremap calls that grew a large block without copying */
    uint64_t segments_abandoned;  /* segments handed from exited threads to the abandoned list */
    uint64_t segments_adopted;    /* abandoned segments taken over by a live thread */
    uint64_t thread_heaps;        /* threads with a heap of their own now */
    uint64_t user_heaps;          /* tl_heap_t heaps alive now */
    tl_class_stats_t classes[TL_STATS_CLASSES]; /* per size class, smallest first */
} tl_stats_t;

/* Fill `*out` with the current statistics. Set out->version =
 * TL_STATS_VERSION first (the layout this program was compiled with).
 * Returns 0; or -1 with errno = EINVAL, *out untouched, when `out` is NULL
 * or its version is 0 or newer than the library's. Allocates nothing. */
int tl_stats(tl_stats_t *out);

/* Write the statistics table (what TLMALLOC_SHOW_STATS prints at exit:
 * memory reserved, committed and at peak, pages and segments, OS calls,
 * and with per-operation counters the allocations and frees per size
 * class), headed "tlmalloc stats: PROGRAM (pid N)", to file descriptor
 * `fd`. Allocates nothing. */
void tl_print_stats(int fd);

/* ---- Options ------------------------------------------------------------
 * The TLMALLOC_* runtime options of README.md, by name. */

/* Set the runtime option `name` from the text `value`, parsed as its
 * environment variable's would be. `name` is the variable
 * ("TLMALLOC_PURGE_DELAY_MS") or its lower-case short form
 * ("purge_delay_ms"). Returns 0; or -1 with errno = EINVAL, the option
 * unchanged, for an unknown name, a bad value or a NULL argument. The new
 * value applies from the allocator's next use of it (the purge settings,
 * for instance, at the next purge pass). */
int tl_option_set(const char *name, const char *value);

/* The current value of the option `name` (as for tl_option_set): a number
 * (ms, bytes; 0 or 1 for a boolean), or the code of a word: purge_mode
 * 0 dontneed, 1 free; thp 0 system, 1 always, 2 never, 3 large; show_stats 0 none,
 * 1 every process, else 2^32 + the one pid that prints; for stats_json the length
 * of the path (0: none). -1 with errno = EINVAL for an unknown name or
 * NULL. */
int64_t tl_option_get(const char *name);

/* ---- Realtime mode ------------------------------------------------------
 * A marked thread whose malloc, free, calloc, realloc and aligned
 * allocations make no mmap, munmap, mremap, madvise, mprotect or brk call,
 * given tl_prewarm of its working set and a working set that does not
 * grow. The contract, its preconditions and what it cannot cover (stack,
 * code pages, other libraries, THP, first touches) are in README.md,
 * "Realtime mode". */

#define TL_RT_OFF 0   /* the allocator enters the kernel when it needs to */
#define TL_RT_DEFER 1 /* unmaps parked for tl_rt_drain, purges deferred */

/* Set the calling thread's realtime level (TL_RT_OFF or TL_RT_DEFER);
 * returns the previous one, or -1 with errno = EINVAL for another value.
 * Marking a thread also prepares its heap (as tl_prewarm does), for the
 * thread's life. */
int tl_rt_thread(int level);

/* From the realtime thread, outside its critical part: make counts[i]
 * blocks of sizes[i] bytes available to this thread without any system
 * call, their pages touched (faulted in, not just mapped). The heap keeps
 * them, unpurged, for the thread's life. Prewarm the whole working set in
 * one call; at most 8 blocks above 256 KiB in all. Returns 0, or -1 with
 * errno = ENOMEM (memory refused, an impossible size, too many large
 * blocks, an exiting thread). */
int tl_prewarm(const size_t *sizes, const size_t *counts, size_t n);

/* From any thread, outside critical sections: perform all the work that
 * deferring threads left, process-wide (unmap every parked range, run the
 * due purge of the shared caches). */
void tl_rt_drain(void);

/* Process-wide count of the times a marked thread entered the kernel
 * inside the allocator (to map, grow or purge memory it was not prepared
 * for). The contract held over a section iff this and
 * tl_rt_forced_releases() did not change. */
unsigned long long tl_rt_violations(void);

/* Frees of deferring threads that unmapped inline because
 * TLMALLOC_RT_PENDING_MAX bytes were parked already. */
unsigned long long tl_rt_forced_releases(void);

/* Bytes whose unmap is parked, awaiting tl_rt_drain or the background purger. */
size_t tl_rt_pending_bytes(void);

/* Lock (mlock: fault in and keep) every segment and large block tlmalloc
 * has mapped, and only those; returns the bytes locked (ranges the kernel
 * refuses, e.g. past RLIMIT_MEMLOCK, are skipped). A set-up call: no other
 * thread of the program may free or resize memory meanwhile (the background
 * purger waits for it). Memory mapped later is not locked; memory given
 * back later goes with its lock. tl_munlock undoes it for what is mapped
 * then and returns the bytes unlocked (so it may be fewer). */
size_t tl_mlock(void);
size_t tl_munlock(void);

/* The library version as a string, e.g. "0.1.0". */
const char *tl_version(void);

#ifdef __cplusplus
}
#endif

#endif /* TLMALLOC_H */
