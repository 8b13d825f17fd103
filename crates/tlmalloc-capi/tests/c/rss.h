/* Resident set size of this process, in KiB, from /proc/self/status
 * (0 if it cannot be read). Shared by the thread tests. */
#ifndef TL_TEST_RSS_H
#define TL_TEST_RSS_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static inline size_t rss_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    size_t kib = 0;
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "VmRSS:", 6) == 0) kib = strtoul(line + 6, NULL, 10);
    if (f) fclose(f);
    return kib;
}

#endif
