/* Threads that never call malloc, only free another thread's blocks: the
 * first such free gives the thread a heap (so its frees wait in a batch),
 * and the thread's exit hands that heap and its batch back. Each round the
 * main thread allocates 90 blocks; a new thread frees them, either in its
 * body or in a pthread key destructor at its exit (a free there sets the
 * heap up during the destructor passes); then every block must come back
 * to the main thread among a few pages' worth of new blocks. With
 * TLMALLOC_SHOW_STATS=1 the summary at exit shows one live thread heap
 * (the main thread's): none of the heaps made in the rounds was kept.
 * Usage: free_only ROUNDS. Prints "free_only ok". */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define N 90
#define AGAIN (4 * N + 256)

static void *blocks[N];
static pthread_key_t key;

static void free_all(void) {
    for (int i = 0; i < N; i++) free(blocks[i]);
}

static void at_exit_of_thread(void *value) {
    (void)value;
    free_all();
}

static void *frees_in_body(void *arg) {
    (void)arg;
    free_all();
    return NULL;
}

static void *frees_at_exit(void *arg) {
    (void)arg;
    /* No malloc: glibc keeps the first 32 keys' values in the thread. */
    pthread_setspecific(key, (void *)1);
    return NULL;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 100;
    if (pthread_key_create(&key, at_exit_of_thread) != 0) return 1;
    static void *again[AGAIN];
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < N; i++) {
            blocks[i] = malloc(512);
            if (!blocks[i]) return 1;
        }
        pthread_t t;
        if (pthread_create(&t, NULL, r % 2 ? frees_at_exit : frees_in_body, NULL) != 0) return 1;
        pthread_join(t, NULL);
        int back = 0;
        for (int i = 0; i < AGAIN; i++) {
            again[i] = malloc(512);
            for (int j = 0; j < N; j++) back += again[i] == blocks[j];
        }
        for (int i = 0; i < AGAIN; i++) free(again[i]);
        if (back != N) {
            printf("round %d: %d of %d blocks freed by a thread that only frees came back\n", r, back, N);
            return 1;
        }
    }
    printf("free_only ok\n");
    return 0;
}
