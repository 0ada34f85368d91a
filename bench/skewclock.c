/* A host whose wall clock runs SKEW_CLOCK_SECONDS ahead (or behind), for one process tree:
 * loaded with LD_PRELOAD, it shifts what CLOCK_REALTIME reads (clock_gettime,
 * gettimeofday, time) and nothing else. A real skewed host's CLOCK_MONOTONIC, sleeps and
 * timed waits are not shifted, so neither are they here (see bench/skewclock.py for why
 * libfaketime is not used). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

static long skew_seconds(void) {
    static int read = 0;
    static long skew = 0;
    if (!read) {
        const char *value = getenv("SKEW_CLOCK_SECONDS");
        skew = value ? strtol(value, NULL, 10) : 0;
        read = 1;
    }
    return skew;
}

static int is_wall_clock(clockid_t clock) {
    return clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE || clock == CLOCK_TAI;
}

int clock_gettime(clockid_t clock, struct timespec *tp) {
    static int (*real)(clockid_t, struct timespec *) = NULL;
    if (!real) real = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    int result = real(clock, tp);
    if (result == 0 && is_wall_clock(clock)) tp->tv_sec += skew_seconds();
    return result;
}

int gettimeofday(struct timeval *tv, void *tz) {
    static int (*real)(struct timeval *, void *) = NULL;
    if (!real) real = (int (*)(struct timeval *, void *))dlsym(RTLD_NEXT, "gettimeofday");
    int result = real(tv, tz);
    if (result == 0) tv->tv_sec += skew_seconds();
    return result;
}

time_t time(time_t *out) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    if (out) *out = now.tv_sec;
    return now.tv_sec;
}
