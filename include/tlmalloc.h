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
 *  - Blocks of 16 bytes or more are 16-byte aligned; smaller ones are
 *    8-byte aligned (enough for any object that fits).
 *  - A request that cannot be met returns NULL with errno = ENOMEM.
 *  - Passing a pointer tlmalloc did not hand out to a function that frees,
 *    resizes or measures a block prints one line naming the pointer and the
 *    function on stderr, then calls abort().
 *  - Blocks may be freed by any thread, not only the one that allocated them.
 *
 * Environment: TLMALLOC_SHOW_STATS=1 prints a statistics summary on stderr
 * when each process exits; TLMALLOC_SHOW_STATS=pid:N only when process N
 * does (what `tlmalloc run --stats` sets). A process that ends with _exit()
 * prints nothing.
 */
#ifndef TLMALLOC_H
#define TLMALLOC_H

#include <stddef.h>

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

/* tl_free for a caller that knows the size it asked for (C23 free_sized). */
void tl_free_sized(void *p, size_t size);

/* tl_free for a caller that knows the alignment and size it asked for
 * (C23 free_aligned_sized). */
void tl_free_aligned_sized(void *p, size_t alignment, size_t size);

/* The bytes usable in the block at `p`: at least what was asked for, and all
 * of them may be written. 0 for NULL. */
size_t tl_usable_size(const void *p);

/* The usable size a request of `size` bytes would get (so a growing buffer
 * can ask for exactly what it will receive); SIZE_MAX when no block that
 * large can exist. */
size_t tl_good_size(size_t size);

/* Return to the OS what the calling thread can now: memory freed to its
 * heap by other threads is collected, empty pages are released, segments of
 * exited threads are taken over, and the cache of empty segments is
 * unmapped. Never needed for correctness. */
void tl_collect(void);

/* Write a short human-readable summary of the process-wide counters (memory
 * mapped now and at peak, mmap/munmap calls, segments) to file descriptor
 * `fd`. Allocates nothing. */
void tl_print_stats(int fd);

/* The library version as a string, e.g. "0.1.0". */
const char *tl_version(void);

#ifdef __cplusplus
}
#endif

#endif /* TLMALLOC_H */
