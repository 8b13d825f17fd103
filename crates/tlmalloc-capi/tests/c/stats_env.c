/* Allocates, then closes its standard error before exiting (as GNU
 * coreutils do): tlmalloc's summary must still appear when asked for. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(void) {
    void *blocks[100];
    for (int i = 0; i < 100; i++) blocks[i] = malloc((size_t)i * 1000 + 1);
    for (int i = 0; i < 100; i++) free(blocks[i]);
    close(2);
    return 0;
}
