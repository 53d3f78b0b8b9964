// The C++ wrapper end to end, in one process: a server and an insecure client, N echoes of
// checked bytes. `raii_echo [N]`.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "ricochet.hpp"

int main(int argc, char **argv) {
    const int total = argc > 1 ? std::atoi(argv[1]) : 1000;
    try {
        ricochet_server_config cfg;
        ricochet::check(ricochet_server_config_default(&cfg));
        cfg.bind = "127.0.0.1:0";
        cfg.admission = RICOCHET_ADMISSION_INSECURE;
        cfg.workers = 1;
        ricochet::Server server = ricochet::Server::start(cfg);
        ricochet::Client client = ricochet::Client::connect_insecure(server.local_address());
        int sent = 0, received = 0;
        auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
        while (received < total) {
            if (std::chrono::steady_clock::now() > deadline) {
                std::fprintf(stderr, "timed out at %d\n", received);
                return 1;
            }
            if (sent < total && sent - received < 8) {
                uint8_t msg[64];
                for (size_t i = 0; i < sizeof msg; i++) {
                    msg[i] = static_cast<uint8_t>(sent + i);
                }
                try {
                    client.send(0, msg, sizeof msg);
                    sent++;
                } catch (const ricochet::Error &e) {
                    // Not connected yet is fine: messages queue; anything else is not.
                    if (e.status() != RICOCHET_ERROR_QUEUE_FULL) {
                        throw;
                    }
                }
            }
            client.update(1);
            for (auto ev = server.poll(); ev.kind != RICOCHET_EVENT_NONE; ev = server.poll()) {
                if (ev.kind == RICOCHET_EVENT_MESSAGE) {
                    server.send(ev.session, ev.channel, ev.data.data(), ev.data.size());
                }
            }
            for (auto ev = client.poll(); ev.kind != RICOCHET_EVENT_NONE; ev = client.poll()) {
                if (ev.kind == RICOCHET_EVENT_MESSAGE) {
                    for (size_t i = 0; i < ev.data.size(); i++) {
                        if (ev.data.size() != 64 || ev.data[i] != static_cast<uint8_t>(received + i)) {
                            std::fprintf(stderr, "echo %d differs\n", received);
                            return 1;
                        }
                    }
                    received++;
                }
            }
        }
        std::printf("raii_echo: %d echoes checked\n", received);
    } catch (const ricochet::Error &e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}
