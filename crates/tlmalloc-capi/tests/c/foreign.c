/* Passes a pointer tlmalloc did not allocate to one function, chosen by
 * argv[1]; prints the pointer on stdout first. The test expects a one-line
 * report naming the function and the pointer on stderr, then SIGABRT. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static char global_buffer[4096] __attribute__((aligned(64)));

static void show(void *p) {
    printf("%p\n", p);
    fflush(stdout);
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    const char *mode = argv[1];
    char stack_buffer[256];
    void *p;
    /* A valid block first, so the allocator is fully set up. */
    free(malloc(10));
    if (strcmp(mode, "free-static") == 0) {
        p = global_buffer + 16;
        show(p);
        free(p);
    } else if (strcmp(mode, "free-stack") == 0) {
        p = stack_buffer;
        show(p);
        free(p);
    } else if (strcmp(mode, "free-mmap") == 0) {
        p = mmap(NULL, 8 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        show(p);
        free(p);
    } else if (strcmp(mode, "realloc-static") == 0) {
        p = global_buffer;
        show(p);
        p = realloc(p, 100);
    } else if (strcmp(mode, "usable-stack") == 0) {
        p = stack_buffer + 8;
        show(p);
        printf("%zu\n", malloc_usable_size(p));
    } else if (strcmp(mode, "delete-static") == 0) {
        void (*del)(void *) = (void (*)(void *))dlsym(RTLD_DEFAULT, "_ZdlPv");
        p = global_buffer + 64;
        show(p);
        del(p);
    } else if (strcmp(mode, "free-sized-static") == 0) {
        void (*fs)(void *, size_t) = (void (*)(void *, size_t))dlsym(RTLD_DEFAULT, "free_sized");
        p = global_buffer + 128;
        show(p);
        fs(p, 10);
    } else {
        return 2;
    }
    puts("not detected");
    return 0;
}
