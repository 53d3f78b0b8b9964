/*
 * Echo client: N clients (a thread each) keep W messages of S bytes in flight on the
 * reliable-ordered channel and check every echoed byte and the order.
 *
 *   echo_client ADDRESS [--insecure | --token HEX | --key HEX --protocol-id N]
 *               [--clients N] [--window W] [--size S] [--messages M | --seconds T]
 *
 * --token connects one client with a token the backend issued (hex); --key makes this
 * program its own backend, issuing one token per client with the C ABI's token issuer.
 * With --messages each client echoes M messages; with --seconds it sends for T seconds and
 * counts the round trips completed in them (the echoes still in flight then are checked too). Exit status 0 only when every echo was right.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

enum { MAX_SIZE = 65536 };

struct options {
    const char *address;
    int insecure;
    uint8_t token[RICOCHET_CONNECT_TOKEN_LEN];
    int have_token;
    uint8_t key[RICOCHET_KEY_LEN];
    int have_key;
    uint64_t protocol_id;
    int clients;
    uint64_t window;
    size_t size;
    uint64_t messages;
    double seconds;
};

struct worker {
    const struct options *opt;
    uint32_t index;
    ricochet_token_issuer issuer;
    uint64_t round_trips;
    int failed;
};

static int run_client(struct worker *w) {
    const struct options *o = w->opt;
    ricochet_client_config cfg;
    CHECK(ricochet_client_config_default(&cfg));
    ricochet_client client;
    if (o->insecure) {
        CHECK(ricochet_client_connect_insecure(o->address, &cfg, &client));
    } else if (o->have_token) {
        CHECK(ricochet_client_connect(o->token, sizeof o->token, &cfg, &client));
    } else {
        uint8_t token[RICOCHET_CONNECT_TOKEN_LEN];
        size_t len = 0;
        const char *servers[1] = {o->address};
        CHECK(ricochet_token_issue(w->issuer, 1000 + w->index, servers, 1, NULL, 0, token,
                                   sizeof token, &len));
        CHECK(ricochet_client_connect(token, len, &cfg, &client));
    }

    uint8_t *out = malloc(o->size);
    uint8_t *expect = malloc(o->size);
    uint8_t *in = malloc(MAX_SIZE);
    if (!out || !expect || !in) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    int failed = 0;
    int connected = 0;
    uint64_t sent = 0, received = 0;
    /* With --seconds: the echoes back before sending stopped, over exactly that time. */
    uint64_t at_stop = 0;
    int stopped = 0;
    double start = now_seconds();
    double stop_sending = start + o->seconds;
    double deadline = start + (o->seconds > 0 ? o->seconds + 30 : 120);
    for (;;) {
        double now = now_seconds();
        if (now > deadline) {
            fprintf(stderr, "client %u: timed out (%llu of %llu echoed)\n", w->index,
                    (unsigned long long)received, (unsigned long long)sent);
            failed = 1;
            break;
        }
        int more = o->seconds > 0 ? now < stop_sending : sent < o->messages;
        if (o->seconds > 0 && !more && !stopped) {
            stopped = 1;
            at_stop = received;
        }
        if (connected) {
            while (more && (o->seconds > 0 || sent < o->messages) && sent - received < o->window) {
                fill_message(out, o->size, sent, w->index);
                ricochet_status s = ricochet_client_send(client, 0, out, o->size);
                if (s == RICOCHET_ERROR_QUEUE_FULL) {
                    break;
                }
                if (s != RICOCHET_OK) {
                    die("ricochet_client_send", s);
                }
                sent++;
            }
            if (!more && received == sent) {
                break;
            }
        }
        CHECK(ricochet_client_update(client, 1));
        ricochet_client_event ev;
        for (;;) {
            CHECK(ricochet_client_poll(client, &ev, in, MAX_SIZE));
            if (ev.kind == RICOCHET_EVENT_NONE) {
                break;
            }
            if (ev.kind == RICOCHET_EVENT_CONNECTED) {
                connected = 1;
            } else if (ev.kind == RICOCHET_EVENT_DISCONNECTED) {
                fprintf(stderr, "client %u: disconnected: %s\n", w->index,
                        ricochet_close_reason_text(ev.reason));
                failed = 1;
                goto done;
            } else if (ev.kind == RICOCHET_EVENT_MESSAGE) {
                fill_message(expect, o->size, received, w->index);
                if (ev.channel != 0 || ev.len != o->size || memcmp(in, expect, o->size) != 0) {
                    fprintf(stderr, "client %u: echo %llu differs from what was sent\n", w->index,
                            (unsigned long long)received);
                    failed = 1;
                    goto done;
                }
                received++;
            }
        }
    }
done:
    w->round_trips = o->seconds > 0 ? at_stop : received;
    /* A graceful close: the server learns it at once instead of timing the session out. */
    if (ricochet_client_close(client) == RICOCHET_OK) {
        double until = now_seconds() + 3;
        while (now_seconds() < until) {
            ricochet_client_event ev;
            if (ricochet_client_update(client, 5) != RICOCHET_OK ||
                ricochet_client_poll(client, &ev, in, MAX_SIZE) != RICOCHET_OK ||
                ev.kind == RICOCHET_EVENT_DISCONNECTED) {
                break;
            }
        }
    }
    CHECK(ricochet_client_destroy(client));
    free(out);
    free(expect);
    free(in);
    return failed;
}

static void *thread_main(void *arg) {
    struct worker *w = arg;
    w->failed = run_client(w);
    return NULL;
}

static void usage(void) {
    fprintf(stderr,
            "usage: echo_client ADDRESS [--insecure | --token HEX | --key HEX --protocol-id N]\n"
            "       [--clients N] [--window W] [--size S] [--messages M | --seconds T]\n");
    exit(2);
}

int main(int argc, char **argv) {
    static struct options o;
    memset(&o, 0, sizeof o);
    o.clients = 1;
    o.window = 16;
    o.size = 1024;
    o.messages = 10000;
    if (argc < 2) {
        usage();
    }
    o.address = argv[1];
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--insecure") == 0) {
            o.insecure = 1;
            continue;
        }
        if (!v) {
            usage();
        }
        i++;
        if (strcmp(a, "--token") == 0) {
            o.have_token = hex_decode(v, o.token, sizeof o.token) == (long)sizeof o.token;
            if (!o.have_token) {
                usage();
            }
        } else if (strcmp(a, "--key") == 0) {
            o.have_key = hex_decode(v, o.key, sizeof o.key) == (long)sizeof o.key;
            if (!o.have_key) {
                usage();
            }
        } else if (strcmp(a, "--protocol-id") == 0) {
            o.protocol_id = strtoull(v, NULL, 0);
        } else if (strcmp(a, "--clients") == 0) {
            o.clients = atoi(v);
        } else if (strcmp(a, "--window") == 0) {
            o.window = strtoull(v, NULL, 0);
        } else if (strcmp(a, "--size") == 0) {
            o.size = (size_t)strtoull(v, NULL, 0);
        } else if (strcmp(a, "--messages") == 0) {
            o.messages = strtoull(v, NULL, 0);
        } else if (strcmp(a, "--seconds") == 0) {
            o.seconds = atof(v);
        } else {
            usage();
        }
    }
    if (o.clients < 1 || o.clients > 256 || o.size < 12 || o.size > MAX_SIZE || o.window < 1 ||
        (!o.insecure && !o.have_token && !o.have_key) || (o.have_token && o.clients != 1)) {
        usage();
    }
    ricochet_token_issuer issuer = {0};
    if (o.have_key) {
        CHECK(ricochet_token_issuer_new(o.key, o.protocol_id, 30, &issuer));
    }
    struct worker *ws = calloc((size_t)o.clients, sizeof *ws);
    pthread_t *ts = calloc((size_t)o.clients, sizeof *ts);
    if (!ws || !ts) {
        return 1;
    }
    double start = now_seconds();
    for (int i = 0; i < o.clients; i++) {
        ws[i].opt = &o;
        ws[i].index = (uint32_t)i;
        ws[i].issuer = issuer;
        if (pthread_create(&ts[i], NULL, thread_main, &ws[i]) != 0) {
            fprintf(stderr, "pthread_create failed\n");
            return 1;
        }
    }
    uint64_t total = 0;
    int failed = 0;
    for (int i = 0; i < o.clients; i++) {
        pthread_join(ts[i], NULL);
        total += ws[i].round_trips;
        failed |= ws[i].failed;
    }
    double elapsed = o.seconds > 0 ? o.seconds : now_seconds() - start;
    if (o.have_key) {
        CHECK(ricochet_token_issuer_destroy(issuer));
    }
    printf("{\"client\":\"c\",\"clients\":%d,\"round_trips\":%llu,\"seconds\":%.3f,\"ok\":%s}\n",
           o.clients, (unsigned long long)total, elapsed, failed ? "false" : "true");
    free(ws);
    free(ts);
    return failed;
}
