//! Short echo runs through the real harness: the tokio server, and Ricochet's runtime in both IO
//! models with 1 and 2 workers. Bounded by message count, so they are quick and exact.

use bench::schema::UdpConfig;
use bench::udp::run::run_udp;

fn config(server: &str, io_model: &str, threads: usize) -> UdpConfig {
    UdpConfig {
        payload: 512,
        clients: 4,
        window: 8,
        server: server.into(),
        io_model: io_model.into(),
        io_threads: threads,
        backend: "auto".into(),
        idle: "balanced".into(),
        pin_cores: true,
        work_ns: 0,
        warmup_s: 0.05,
        seconds: 20.0,
        drain_s: 2.0,
        messages: Some(300),
        address_family: "ipv4".into(),
        recv_buffer: Some(1 << 20),
        send_buffer: None,
        client_io: "mmsg".into(),
    }
}

fn assert_clean(cfg: &UdpConfig) {
    let run = run_udp(cfg, "test");
    assert!(run.ok, "{:?}", run.errors);
    let m = run.phases.measured;
    let expected = cfg.messages.unwrap() * cfg.clients as u64;
    assert_eq!((m.sent, m.received), (expected, expected), "{run:#?}");
    assert_eq!(m.errors(), 0);
    assert_eq!(run.rtt_us.unwrap().count, expected);
    let server = run.server.unwrap();
    assert_eq!(server.kind, cfg.server);
    assert!(!server.sockets.is_empty());
    assert_eq!(server.sockets[0].recv_requested, Some(1 << 20));
}

#[test]
fn tokio_echo_one_and_two_threads() {
    assert_clean(&config("tokio", "shared", 1));
    assert_clean(&config("tokio", "shared", 2));
}

#[test]
fn tokio_echo_ipv6() {
    let mut cfg = config("tokio", "shared", 1);
    cfg.address_family = "ipv6".into();
    cfg.payload = 9000;
    assert_clean(&cfg);
}

#[test]
fn invalid_configuration_is_reported_not_dropped() {
    let mut cfg = config("tokio", "shared", 1);
    cfg.payload = 65_508;
    let run = run_udp(&cfg, "too big");
    assert!(!run.ok);
    assert!(run.errors[0].contains("65507"), "{:?}", run.errors);
    assert!(run.server.is_none());
}

#[test]
fn ricochet_both_io_models_one_and_two_workers() {
    for model in ["per-core", "shared"] {
        for workers in [1, 2] {
            let cfg = config("ricochet", model, workers);
            assert_clean(&cfg);
            let run = run_udp(&cfg, "workers");
            let server = run.server.unwrap();
            assert_eq!(server.io_model, model);
            assert_eq!(server.threads, workers);
            assert_eq!(server.workers.len(), workers);
            let echoed: u64 = server.workers.iter().map(|w| w.datagrams_out).sum();
            // Warm-up and measured messages all came back through the workers.
            assert_eq!(
                echoed,
                run.phases.warmup.sent + run.phases.measured.sent,
                "{model} ×{workers}"
            );
            let sockets = if model == "per-core" { workers } else { 1 };
            assert_eq!(server.sockets.len(), sockets);
        }
    }
}

#[test]
fn ricochet_every_local_backend() {
    for backend in ["mmsg", "uring"] {
        let mut cfg = config("ricochet", "per-core", 1);
        cfg.backend = backend.into();
        let run = run_udp(&cfg, backend);
        // io_uring may be unavailable on a host (then the server says why and the run is not ok);
        // where it starts, the echo must be exact.
        if let Some(s) = &run.server {
            assert!(run.ok, "{backend}: {:?}", run.errors);
            assert_eq!(s.backend, backend, "{}", s.selection_reason);
        } else {
            assert!(
                run.errors[0].contains("server failed to start"),
                "{:?}",
                run.errors
            );
        }
    }
}

/// The `gso` client mode (GSO-coalesced refills, GRO receive) against every server kind, IPv4
/// and IPv6: exact counts, no errors. Where the kernel lacks GSO or GRO the run falls back to
/// `mmsg` and records that mode.
#[test]
fn gso_clients_against_every_server_kind() {
    for (server, model) in [
        ("ricochet", "per-core"),
        ("ricochet", "shared"),
        ("tokio", "shared"),
    ] {
        for family in ["ipv4", "ipv6"] {
            let mut cfg = config(server, model, 2);
            cfg.client_io = "gso".into();
            cfg.address_family = family.into();
            cfg.payload = 1_200;
            cfg.window = 16;
            let run = run_udp(&cfg, "test");
            let expected_mode = bench::udp::client::ClientIo::Gso
                .resolve(cfg.window)
                .0
                .as_str();
            assert_eq!(run.config.client_io, expected_mode);
            assert!(run.ok, "{server} {model} {family}: {:?}", run.errors);
            let m = run.phases.measured;
            let expected = cfg.messages.unwrap() * cfg.clients as u64;
            assert_eq!((m.sent, m.received), (expected, expected), "{run:#?}");
            assert_eq!(m.errors(), 0, "{server} {model} {family}");
        }
    }
}
