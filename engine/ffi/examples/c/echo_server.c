/*
 * Echo server: sends every message back on its channel, from a loop that drains the
 * server's event queues (no callbacks).
 *
 *   echo_server BIND [--insecure | --key HEX --protocol-id N] [--workers N]
 *               [--sessions N] [--seconds T]
 *
 * Prints "listening ADDRESS" (the bound address) once it serves. Stops after N sessions
 * (default 1) have connected and ended, or after T seconds (default 120: exit status 1).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

enum { MAX_SIZE = 65536 };

static void usage(void) {
    fprintf(stderr, "usage: echo_server BIND [--insecure | --key HEX --protocol-id N] "
                    "[--workers N] [--sessions N] [--seconds T]\n");
    exit(2);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage();
    }
    ricochet_server_config cfg;
    CHECK(ricochet_server_config_default(&cfg));
    cfg.bind = argv[1];
    long sessions = 1;
    double seconds = 120;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--insecure") == 0) {
            cfg.admission = RICOCHET_ADMISSION_INSECURE;
            continue;
        }
        if (!v) {
            usage();
        }
        i++;
        if (strcmp(a, "--key") == 0) {
            if (hex_decode(v, cfg.token_key, sizeof cfg.token_key) != (long)sizeof cfg.token_key) {
                usage();
            }
            cfg.admission = RICOCHET_ADMISSION_TOKENS;
        } else if (strcmp(a, "--protocol-id") == 0) {
            cfg.protocol_id = strtoull(v, NULL, 0);
        } else if (strcmp(a, "--workers") == 0) {
            cfg.workers = (uint32_t)strtoul(v, NULL, 0);
        } else if (strcmp(a, "--sessions") == 0) {
            sessions = atol(v);
        } else if (strcmp(a, "--seconds") == 0) {
            seconds = atof(v);
        } else {
            usage();
        }
    }
    ricochet_server server;
    CHECK(ricochet_server_start(&cfg, &server));
    char address[128];
    CHECK(ricochet_server_local_address(server, address, sizeof address, NULL));
    printf("listening %s\n", address);
    fflush(stdout);

    uint8_t *buf = malloc(MAX_SIZE);
    if (!buf) {
        return 1;
    }
    long connected = 0, ended = 0;
    unsigned long long echoed = 0;
    int status = 0;
    double deadline = now_seconds() + seconds;
    while (ended < sessions) {
        if (now_seconds() > deadline) {
            fprintf(stderr, "echo_server: timed out\n");
            status = 1;
            break;
        }
        ricochet_server_event ev;
        ricochet_status s = ricochet_server_poll(server, RICOCHET_ANY_WORKER, &ev, buf, MAX_SIZE);
        if (s != RICOCHET_OK) {
            die("ricochet_server_poll", s);
        }
        switch (ev.kind) {
        case RICOCHET_EVENT_NONE:
            sleep_micros(100);
            break;
        case RICOCHET_EVENT_CONNECTED:
            connected++;
            break;
        case RICOCHET_EVENT_MESSAGE:
            s = ricochet_server_send(server, ev.session, ev.channel, buf, ev.len);
            /* A session that just ended has its disconnected event queued next. */
            if (s != RICOCHET_OK && s != RICOCHET_ERROR_CLOSED) {
                die("ricochet_server_send", s);
            }
            echoed++;
            break;
        case RICOCHET_EVENT_DISCONNECTED:
            ended++;
            break;
        }
    }
    fprintf(stderr, "echo_server: %ld sessions, %llu messages echoed\n", connected, echoed);
    CHECK(ricochet_server_stop(server));
    free(buf);
    return status;
}
