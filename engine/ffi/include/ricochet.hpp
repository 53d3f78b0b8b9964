// ricochet.hpp: a short C++17 RAII wrapper over ricochet.h (the shape an Unreal module would
// use). Handles are owned by move-only objects whose destructors destroy or stop them; a
// failed call throws ricochet::Error with the library's message. Threading and buffer rules
// are ricochet.h's.
#ifndef RICOCHET_HPP
#define RICOCHET_HPP

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "ricochet.h"

namespace ricochet {

/// A failed call: the status and the library's message for it.
class Error : public std::runtime_error {
public:
    Error(ricochet_status status, const std::string &what)
        : std::runtime_error(what), status_(status) {}
    ricochet_status status() const noexcept { return status_; }

private:
    ricochet_status status_;
};

/// Throw an Error for a failed status (with ricochet_last_error's detail).
inline void check(ricochet_status s) {
    if (s == RICOCHET_OK) {
        return;
    }
    std::string message = ricochet_error_text(static_cast<int32_t>(s));
    char detail[512];
    if (ricochet_last_error(detail, sizeof detail, nullptr) == RICOCHET_OK && detail[0]) {
        message += ": ";
        message += detail;
    }
    throw Error(s, message);
}

/// An event and, for a message, its bytes.
struct Event {
    ricochet_event_kind kind = RICOCHET_EVENT_NONE;
    uint8_t channel = 0;
    uint8_t reason = 0;
    bool by_peer = false;
    ricochet_session session{};  // server events only
    std::vector<uint8_t> data;   // message events only
};

/// A connection to a server. Destroyed (socket closed) with the object; call close() and
/// update until Disconnected first to tell the server.
class Client {
public:
    static Client connect(const std::vector<uint8_t> &token,
                          const ricochet_client_config *config = nullptr) {
        ricochet_client c{};
        check(ricochet_client_connect(token.data(), token.size(), config, &c));
        return Client(c);
    }
    static Client connect_insecure(const std::string &address,
                                   const ricochet_client_config *config = nullptr) {
        ricochet_client c{};
        check(ricochet_client_connect_insecure(address.c_str(), config, &c));
        return Client(c);
    }
    Client(Client &&o) noexcept : h_(std::exchange(o.h_, ricochet_client{})) {}
    Client &operator=(Client &&o) noexcept {
        std::swap(h_, o.h_);
        return *this;
    }
    Client(const Client &) = delete;
    Client &operator=(const Client &) = delete;
    ~Client() {
        if (h_.id != 0) {
            ricochet_client_destroy(h_);
        }
    }

    void send(uint8_t channel, const void *data, size_t len) {
        check(ricochet_client_send(h_, channel, static_cast<const uint8_t *>(data), len));
    }
    void update(uint32_t timeout_ms = 0) { check(ricochet_client_update(h_, timeout_ms)); }
    /// The next event (kind RICOCHET_EVENT_NONE when none); grows `buf_` to fit a message.
    Event poll() {
        Event e;
        ricochet_client_event ev{};
        ricochet_status s = ricochet_client_poll(h_, &ev, buf_.data(), buf_.size());
        if (s == RICOCHET_ERROR_BUFFER_TOO_SMALL) {
            buf_.resize(ev.len);
            s = ricochet_client_poll(h_, &ev, buf_.data(), buf_.size());
        }
        check(s);
        e.kind = ev.kind;
        e.channel = ev.channel;
        e.reason = ev.reason;
        e.by_peer = ev.by_peer != 0;
        if (ev.kind == RICOCHET_EVENT_MESSAGE) {
            e.data.assign(buf_.begin(), buf_.begin() + static_cast<std::ptrdiff_t>(ev.len));
        }
        return e;
    }
    ricochet_stats stats() const {
        ricochet_stats s{};
        check(ricochet_client_stats(h_, &s));
        return s;
    }
    void close() { check(ricochet_client_close(h_)); }

private:
    explicit Client(ricochet_client h) : h_(h), buf_(2048) {}
    ricochet_client h_;
    std::vector<uint8_t> buf_;
};

/// A running server, stopped with the object.
class Server {
public:
    static Server start(const ricochet_server_config &config) {
        ricochet_server s{};
        check(ricochet_server_start(&config, &s));
        return Server(s);
    }
    Server(Server &&o) noexcept : h_(std::exchange(o.h_, ricochet_server{})) {}
    Server &operator=(Server &&o) noexcept {
        std::swap(h_, o.h_);
        return *this;
    }
    Server(const Server &) = delete;
    Server &operator=(const Server &) = delete;
    ~Server() {
        if (h_.id != 0) {
            ricochet_server_stop(h_);
        }
    }

    std::string local_address() const {
        char buf[128];
        check(ricochet_server_local_address(h_, buf, sizeof buf, nullptr));
        return buf;
    }
    /// The next event of any worker (kind RICOCHET_EVENT_NONE when none).
    Event poll(uint32_t worker = RICOCHET_ANY_WORKER) {
        Event e;
        ricochet_server_event ev{};
        ricochet_status s = ricochet_server_poll(h_, worker, &ev, buf_.data(), buf_.size());
        if (s == RICOCHET_ERROR_BUFFER_TOO_SMALL) {
            buf_.resize(ev.len);
            s = ricochet_server_poll(h_, worker, &ev, buf_.data(), buf_.size());
        }
        check(s);
        e.kind = ev.kind;
        e.session = ev.session;
        e.channel = ev.channel;
        e.reason = ev.reason;
        e.by_peer = ev.by_peer != 0;
        if (ev.kind == RICOCHET_EVENT_MESSAGE) {
            e.data.assign(buf_.begin(), buf_.begin() + static_cast<std::ptrdiff_t>(ev.len));
        }
        return e;
    }
    void send(ricochet_session session, uint8_t channel, const void *data, size_t len) {
        check(ricochet_server_send(h_, session, channel, static_cast<const uint8_t *>(data), len));
    }
    void close_session(ricochet_session session) {
        check(ricochet_server_close_session(h_, session));
    }
    /// Stop now (also done by the destructor, which ignores errors).
    void stop() { check(ricochet_server_stop(std::exchange(h_, ricochet_server{}))); }

private:
    explicit Server(ricochet_server h) : h_(h), buf_(2048) {}
    ricochet_server h_;
    std::vector<uint8_t> buf_;
};

}  // namespace ricochet

#endif
