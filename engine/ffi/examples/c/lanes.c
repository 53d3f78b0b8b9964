/* Lanes from C: a server and a client in one process, both configured with the same two
 * lanes (the reliable-ordered event channel 0 first, channels 1 to 3 after it, weighted and
 * capped), exchange messages on channels 0 and 3; then lane lists that do not describe the
 * channels are refused with RICOCHET_ERROR_INVALID_CONFIG, a missing array with
 * RICOCHET_ERROR_NULL_POINTER. Prints one JSON line; exits 0 when every check held.
 *
 *   lanes [--messages N]
 */
#define _POSIX_C_SOURCE 200809L
#include "common.h"

#define SIZE 200

static const uint8_t EVENTS[] = {0};
static const uint8_t REST[] = {1, 2, 3};

static void lanes_of(ricochet_lane out[2]) {
    memset(out, 0, 2 * sizeof out[0]);
    out[0].channels = EVENTS;
    out[0].channel_count = sizeof EVENTS;
    out[0].priority = 0;
    out[1].channels = REST;
    out[1].channel_count = sizeof REST;
    out[1].priority = 1;
    out[1].weight = 2;
    out[1].queue_limit = 1 << 20;
}

static int failures = 0;

static void expect(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "lanes: check failed: %s\n", what);
        failures++;
    }
}

static ricochet_status start_server(const ricochet_lane *lanes, size_t count,
                                    ricochet_server *out) {
    ricochet_server_config cfg;
    CHECK(ricochet_server_config_default(&cfg));
    cfg.bind = "127.0.0.1:0";
    cfg.admission = RICOCHET_ADMISSION_INSECURE;
    cfg.workers = 1;
    cfg.lanes = lanes;
    cfg.lane_count = count;
    return ricochet_server_start(&cfg, out);
}

int main(int argc, char **argv) {
    long messages = 100;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--messages") == 0 && i + 1 < argc) {
            messages = atol(argv[++i]);
        }
    }
    ricochet_lane lanes[2];
    lanes_of(lanes);
    ricochet_server server;
    CHECK(start_server(lanes, 2, &server));
    char address[128];
    CHECK(ricochet_server_local_address(server, address, sizeof address, NULL));

    ricochet_client_config ccfg;
    CHECK(ricochet_client_config_default(&ccfg));
    expect(ccfg.lanes == NULL && ccfg.lane_count == 0, "the default config has no lanes");
    ccfg.lanes = lanes;
    ccfg.lane_count = 2;
    ricochet_client client;
    CHECK(ricochet_client_connect_insecure(address, &ccfg, &client));

    uint8_t out[SIZE], in[SIZE];
    long sent = 0, echoed[4] = {0, 0, 0, 0}, mismatched = 0;
    int connected = 0;
    double deadline = now_seconds() + 30.0;
    while (echoed[0] + echoed[3] < 2 * messages && now_seconds() < deadline) {
        CHECK(ricochet_client_update(client, 1));
        for (;;) {
            ricochet_client_event ev;
            CHECK(ricochet_client_poll(client, &ev, in, SIZE));
            if (ev.kind == RICOCHET_EVENT_NONE) {
                break;
            }
            if (ev.kind == RICOCHET_EVENT_CONNECTED) {
                connected = 1;
            } else if (ev.kind == RICOCHET_EVENT_DISCONNECTED) {
                fprintf(stderr, "lanes: disconnected (%s)\n", ricochet_close_reason_text(ev.reason));
                return 1;
            } else if (ev.kind == RICOCHET_EVENT_MESSAGE && ev.channel < 4 && ev.len == SIZE) {
                uint64_t seq;
                memcpy(&seq, in, 8);
                fill_message(out, SIZE, seq, ev.channel);
                mismatched += memcmp(in, out, SIZE) != 0;
                echoed[ev.channel]++;
            } else {
                mismatched++;
            }
        }
        /* Both channels get a message per turn once connected: events on the first lane,
         * sequenced unreliable messages on the second. */
        if (connected && sent < messages) {
            fill_message(out, SIZE, (uint64_t)sent, 0);
            CHECK(ricochet_client_send(client, 0, out, SIZE));
            fill_message(out, SIZE, (uint64_t)sent, 3);
            CHECK(ricochet_client_send(client, 3, out, SIZE));
            sent++;
        }
        for (;;) {
            ricochet_server_event ev;
            CHECK(ricochet_server_poll(server, RICOCHET_ANY_WORKER, &ev, in, SIZE));
            if (ev.kind == RICOCHET_EVENT_NONE) {
                break;
            }
            if (ev.kind == RICOCHET_EVENT_MESSAGE) {
                ricochet_status s = ricochet_server_send(server, ev.session, ev.channel, in, ev.len);
                expect(s == RICOCHET_OK, "the server echoes on the message's channel");
            }
        }
    }
    expect(echoed[0] == messages, "every reliable message on the event lane came back");
    /* Loopback loses nothing in practice, but channel 3 is unreliable: ask for most. */
    expect(echoed[3] >= messages / 2, "the snapshot lane's messages came back");
    expect(mismatched == 0, "every message came back whole on its own channel");
    CHECK(ricochet_client_close(client));
    CHECK(ricochet_client_destroy(client));
    CHECK(ricochet_server_stop(server));

    /* Lane lists that do not describe the channels are refused, by both sides. */
    ricochet_server refused;
    ricochet_lane bad[2];
    lanes_of(bad);
    bad[1].channel_count = 2; /* channel 3 in no lane */
    expect(start_server(bad, 2, &refused) == RICOCHET_ERROR_INVALID_CONFIG,
           "a server refuses a channel in no lane");
    lanes_of(bad);
    bad[1].channels = EVENTS; /* channel 0 in two lanes */
    bad[1].channel_count = 1;
    expect(start_server(bad, 2, &refused) == RICOCHET_ERROR_INVALID_CONFIG,
           "a server refuses a channel in two lanes");
    expect(start_server(NULL, 2, &refused) == RICOCHET_ERROR_NULL_POINTER,
           "a server refuses a lane count without lanes");
    lanes_of(bad);
    bad[1].channel_count = 2;
    ccfg.lanes = bad;
    ricochet_client none;
    expect(ricochet_client_connect_insecure(address, &ccfg, &none) == RICOCHET_ERROR_INVALID_CONFIG,
           "a client refuses a channel in no lane");

    printf("{\"sent\":%ld,\"echoed_events\":%ld,\"echoed_snapshots\":%ld,\"mismatched\":%ld,"
           "\"ok\":%s}\n",
           sent, echoed[0], echoed[3], mismatched, failures == 0 ? "true" : "false");
    return failures == 0 ? 0 : 1;
}
