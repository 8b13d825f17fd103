/* A library with 1 MiB of thread-local storage. Loaded with dlopen, its
 * TLS is not in the static block: glibc mallocs each thread's copy on the
 * thread's first access (__tls_get_addr) and frees it with the thread's
 * cached stack (tests/c/stack_cache.c). */

__thread char big_tls[1 << 20];

char *touch_tls(void) {
    big_tls[0] = 1;
    big_tls[sizeof big_tls - 1] = 1;
    return big_tls;
}
