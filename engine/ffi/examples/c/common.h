/* Helpers shared by the C examples: hex, clocks, the echo messages' pattern. */
#ifndef RICOCHET_EXAMPLES_COMMON_H
#define RICOCHET_EXAMPLES_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ricochet.h"

/* Decode `hex` (2 * cap digits) into `out`; the byte count, or -1 on a bad digit or size. */
static inline long hex_decode(const char *hex, uint8_t *out, size_t cap) {
    size_t n = strlen(hex);
    if (n % 2 != 0 || n / 2 > cap) {
        return -1;
    }
    for (size_t i = 0; i < n / 2; i++) {
        unsigned int b;
        if (sscanf(hex + 2 * i, "%2x", &b) != 1) {
            return -1;
        }
        out[i] = (uint8_t)b;
    }
    return (long)(n / 2);
}

static inline double now_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static inline void sleep_micros(long us) {
    struct timespec t = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&t, NULL);
}

/* Fill an echo message: sequence number and client index, then a pattern of both. */
static inline void fill_message(uint8_t *buf, size_t len, uint64_t seq, uint32_t client) {
    for (size_t i = 0; i < len; i++) {
        buf[i] = (uint8_t)(seq * 31u + i * 7u + client);
    }
    if (len >= 12) {
        memcpy(buf, &seq, 8);
        memcpy(buf + 8, &client, 4);
    }
}

/* Print the library's message for a failed call and exit. */
static inline void die(const char *what, ricochet_status status) {
    char detail[512];
    size_t len = 0;
    if (ricochet_last_error(detail, sizeof detail, &len) != RICOCHET_OK) {
        detail[0] = '\0';
    }
    fprintf(stderr, "%s: %s (%s)\n", what, ricochet_error_text((int32_t)status), detail);
    exit(1);
}

#define CHECK(call)                          \
    do {                                     \
        ricochet_status check_s_ = (call);   \
        if (check_s_ != RICOCHET_OK) {       \
            die(#call, check_s_);            \
        }                                    \
    } while (0)

#endif
