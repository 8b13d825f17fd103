/* The misuse glibc's default build stops, chosen by argv[1]: double frees
 * of small and medium blocks (immediate, after other traffic, across
 * threads) and frees of pointers inside a block. Prints the pointer on
 * stdout first; the test expects tlmalloc's one-line report naming it on
 * stderr, then SIGABRT. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void show(void *p) {
    printf("%p\n", p);
    fflush(stdout);
}

static void *free_it(void *p) {
    free(p);
    return NULL;
}

static void free_in_thread(void *p) {
    pthread_t t;
    if (pthread_create(&t, NULL, free_it, p) != 0) exit(3);
    pthread_join(t, NULL);
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    const char *mode = argv[1];
    if (strcmp(mode, "double-free-64") == 0) {
        char *p = malloc(64);
        show(p);
        free(p);
        free(p);
    } else if (strcmp(mode, "double-free-after-traffic") == 0) {
        char *p = malloc(64);
        show(p);
        free(p);
        void *others[64];
        for (int i = 0; i < 64; i++) others[i] = malloc(64);
        for (int i = 0; i < 64; i++) free(others[i]);
        free(p);
    } else if (strcmp(mode, "double-free-48k") == 0) {
        char *p = malloc(48 << 10);
        show(p);
        free(p);
        free(p);
    } else if (strcmp(mode, "double-free-cross-thread") == 0) {
        char *p = malloc(64);
        show(p);
        free(p);
        free_in_thread(p);
    } else if (strcmp(mode, "interior-cross-thread") == 0) {
        char *p = malloc(64);
        show(p + 16);
        free_in_thread(p + 16);
    } else if (strcmp(mode, "interior-large") == 0) {
        char *p = malloc(1 << 20);
        show(p + 16);
        free(p + 16);
    } else {
        return 2;
    }
    puts("not detected");
    return 0;
}
