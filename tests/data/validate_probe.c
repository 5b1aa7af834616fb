/* A small program for the runner tests: FNV-1a 64 of a file, after touching N MiB of memory.
 * Built static for aarch64 and run under qemu-user (directly, or through the fake adb). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: probe FILE MIB\n"); return 2; }
    FILE *f = fopen(argv[1], "rb");
    if (!f) { perror(argv[1]); return 3; }
    unsigned long long h = 1469598103934665603ULL;
    int c;
    while ((c = fgetc(f)) != EOF) { h ^= (unsigned char)c; h *= 1099511628211ULL; }
    fclose(f);
    size_t n = (size_t)atoi(argv[2]) << 20;
    char *m = malloc(n ? n : 1);
    if (!m) return 4;
    memset(m, 1, n);
    unsigned long long s = 0;
    for (size_t i = 0; i < n; i += 4096) s += (unsigned char)m[i];
    printf("fnv1a64=%016llx pages=%llu\n", h, s);
    fprintf(stderr, "probe: done\n");
    free(m);
    return 0;
}
