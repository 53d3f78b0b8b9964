//! `bench rudp` over real loopback sockets: short direct and relayed rounds pass every check,
//! FEC policies this build cannot run are refused, and messages of 0 B to 1 MiB on every
//! channel kind cross the impairment relay under `random` and `burst` exactly once (reliable),
//! at most once (unreliable), intact, and in order where the channel orders.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bench::relay::{Relay, RelayConfig};
use bench::rudp::run::{config_for, run_round, validate};
use bench::rudp::server::EchoServer;
use bench::rudp::FecPolicy;
use ricochet::{Client, ClientConfig, ClientEvent};
use ricochet_proto::{ChannelKind, Config, EndpointConfig};
use ricochet_testkit::Profile;

/// Serializes the tests that run traffic. A round checks the process's RSS for growth after
/// its warm-up, and RSS is process-wide: a round running beside another test's 1 MiB
/// messages would see that test's memory as its own growth.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

fn short(profile: Profile, direct: bool) -> bench::schema::RudpConfig {
    // Direct: per-core, 1 worker; relayed: shared, 2 threads (two handlers serve one endpoint).
    let (model, threads) = if direct {
        ("per-core", 1)
    } else {
        ("shared", 2)
    };
    let mut cfg = config_for(
        profile,
        1024,
        2,
        4,
        model,
        threads,
        "auto",
        FecPolicy::Off,
        direct,
        0.2,
        0.6,
        42,
    );
    cfg.drain_s = 10.0;
    cfg
}

fn assert_ok(r: &bench::schema::RudpRun) {
    assert!(r.ok, "round not ok: {:#?}", r.errors);
    assert!(r.round_trips > 0);
    assert_eq!(r.measured.sent, r.measured.echoed);
    assert_eq!(r.warmup.sent, r.warmup.echoed);
    assert!(r.rtt_us.is_some());
    // Both sides sent at least the application bytes (headers, ACKs on top).
    assert!(r.wire_overhead_percent.is_some_and(|w| w > 0.0), "{r:#?}");
    // Every message was echoed once: both sides handed the same application bytes to `send`.
    assert_eq!(r.server_wire.app_bytes_sent, r.client_wire.app_bytes_sent);
    assert!(r.server_wire.bytes_sent >= r.server_wire.app_bytes_sent);
}

#[test]
fn short_direct_round_passes_every_check() {
    let _serial = one_at_a_time();
    let r = run_round(&short(Profile::None, true));
    assert_ok(&r);
    assert!(r.relay.is_none());
}

#[test]
fn short_relayed_random_round_passes_every_check() {
    let _serial = one_at_a_time();
    let r = run_round(&short(Profile::Random, false));
    assert_ok(&r);
    let relay = r.relay.expect("relay counters");
    assert_eq!(relay.routes, 2);
    assert!(
        relay.up.dropped_random + relay.down.dropped_random > 0,
        "{relay:?}"
    );
    assert!(r.retransmitted_per_1000.is_some_and(|x| x > 0.0));
}

#[test]
fn fec_policies_run_as_asked() {
    let _serial = one_at_a_time();
    // Off must mean no parity at all, even though the game profile defaults to adaptive.
    let off = run_round(&short(Profile::Random, false));
    assert_ok(&off);
    assert!(off.fec.is_none());
    assert_eq!(
        off.client_wire.fec_parity_sent + off.server_wire.fec_parity_sent,
        0
    );
    let mut cfg = short(Profile::Random, false);
    cfg.fec = FecPolicy::Fixed.name().into();
    let fixed = run_round(&cfg);
    assert_ok(&fixed);
    let f = fixed.fec.expect("FEC metrics with FEC on");
    assert!(fixed.client_wire.fec_parity_sent > 0 && fixed.server_wire.fec_parity_sent > 0);
    assert_eq!(f.max_parity, 2);
    assert!(FecPolicy::from_str("sometimes").is_err());
}

#[test]
fn direct_with_a_loss_profile_is_refused() {
    assert!(validate(&short(Profile::Random, true)).is_err());
}

const SIZES: [usize; 10] = [0, 1, 31, 1000, 1200, 1201, 4096, 65_536, 200_000, 1 << 20];

fn pattern(channel: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u32)
                .wrapping_mul(31)
                .wrapping_add(len as u32 * 7 + channel as u32) as u8
        })
        .collect()
}

/// Send every size on every channel through a relay with `profile`, check the echoes.
fn sizes_through_relay(profile: Profile, io_model: &str, backend: &str) {
    let config = Config::game();
    let kinds = config.channels.clone();
    let endpoint = EndpointConfig::default().with(|c| c.connection = Arc::new(config));
    let key = ricochet_proto::token::TokenKey::generate(&mut rand::rng());
    let server = EchoServer::start(
        "127.0.0.1:0".parse().unwrap(),
        io_model,
        2,
        backend,
        "balanced",
        bench::rudp::run::DEFAULT_SERVER_SLICE_US,
        "auto",
        endpoint.clone(),
        Some(key.clone()),
        7,
    )
    .unwrap();
    let relay =
        Relay::start(RelayConfig::new(server.local_addr(), profile.impairment()).with_seed(7))
            .unwrap();
    // The client reaches the server through the relay's front door; the server checks its own
    // address.
    let token =
        bench::rudp::protocol::mint_token(&key, 1, &[relay.addr(), server.local_addr()]).unwrap();
    let mut cc = ClientConfig::new()
        .seed(11)
        .backend(backend.parse().unwrap());
    cc.endpoint = endpoint;
    cc.connect_timeout = Some(Duration::from_secs(10));
    let mut client = Client::connect_blocking(&token, cc).unwrap();
    for (ch, _) in kinds.iter().enumerate() {
        for &len in &SIZES {
            client.send(ch as u8, pattern(ch as u8, len)).unwrap();
        }
    }
    // channel -> sizes in arrival order
    let mut got: BTreeMap<u8, Vec<usize>> = BTreeMap::new();
    let reliable_total = kinds.iter().filter(|k| k.is_reliable()).count() * SIZES.len();
    let deadline = Instant::now() + Duration::from_secs(90);
    let reliable_done = |got: &BTreeMap<u8, Vec<usize>>| {
        kinds
            .iter()
            .enumerate()
            .filter(|(_, k)| k.is_reliable())
            .map(|(c, _)| got.get(&(c as u8)).map_or(0, Vec::len))
            .sum::<usize>()
            >= reliable_total
    };
    while !reliable_done(&got) && Instant::now() < deadline {
        client.wait(Duration::from_millis(5)).unwrap();
        while let Some(ev) = client.poll_event() {
            match ev {
                ClientEvent::Message { channel, data } => {
                    assert!(
                        SIZES.contains(&data.len()),
                        "unexpected size {}",
                        data.len()
                    );
                    assert!(
                        data[..] == pattern(channel, data.len())[..],
                        "corrupted {} B message on channel {channel}",
                        data.len()
                    );
                    got.entry(channel).or_default().push(data.len());
                }
                ClientEvent::Disconnected { reason, .. } => panic!("disconnected: {reason:?}"),
                _ => {}
            }
        }
    }
    // Give straggling unreliable echoes a moment, so duplicates would show.
    let settle = Instant::now() + Duration::from_millis(300);
    while Instant::now() < settle {
        client.wait(Duration::from_millis(5)).unwrap();
        while let Some(ev) = client.poll_event() {
            if let ClientEvent::Message { channel, data } = ev {
                assert!(data[..] == pattern(channel, data.len())[..]);
                got.entry(channel).or_default().push(data.len());
            }
        }
    }
    for (ch, kind) in kinds.iter().enumerate() {
        let seen = got.remove(&(ch as u8)).unwrap_or_default();
        let mut sorted = seen.clone();
        sorted.sort_unstable();
        let mut dedup = sorted.clone();
        dedup.dedup();
        assert_eq!(sorted, dedup, "{kind:?}: a message arrived twice: {seen:?}");
        match kind {
            ChannelKind::ReliableOrdered => {
                assert_eq!(seen, SIZES.to_vec(), "{kind:?} under {profile}")
            }
            ChannelKind::ReliableUnordered => {
                assert_eq!(sorted, SIZES.to_vec(), "{kind:?} under {profile}")
            }
            // Sizes were sent in increasing order: a sequenced channel never goes back.
            ChannelKind::UnreliableSequenced => {
                assert_eq!(seen, sorted, "{kind:?} delivered out of order")
            }
            ChannelKind::Unreliable => {}
            other => panic!("no expectation for channel kind {other:?}"),
        }
    }
    client.close();
    drop(relay);
    server.shutdown().unwrap();
}

fn backends() -> Vec<String> {
    ricochet_platform::probe()
        .backends()
        .into_iter()
        .map(|b| b.to_string())
        .collect()
}

#[test]
fn zero_to_one_mib_on_every_channel_through_random_loss_per_core() {
    let _serial = one_at_a_time();
    let b = backends();
    sizes_through_relay(Profile::Random, "per-core", &b[0]);
}

#[test]
fn zero_to_one_mib_on_every_channel_through_burst_loss_shared() {
    let _serial = one_at_a_time();
    let b = backends();
    sizes_through_relay(Profile::Burst, "shared", &b[b.len() - 1]);
}

#[test]
fn matrix_plans_the_reference_sets() {
    use bench::commands::matrix::{plan, RudpMatrixArgs};
    let args = |set: &str, quick: bool| RudpMatrixArgs {
        set: set.into(),
        quick,
        backend: vec!["uring".into(), "mmsg".into()],
        io_model: vec!["per-core".into(), "shared".into()],
        fec: Vec::new(),
        rounds: None,
        seed: 42,
    };
    let main = plan(&args("main", false)).unwrap();
    // 2 IO models × 2 backends × (1 direct + 3 conditions × 3 policies).
    assert_eq!(main.len(), 40);
    assert!(main.iter().all(|p| p.rounds == 3
        && p.config.payload == 1024
        && p.config.window == 16
        && p.config.clients == 4
        && p.config.warmup_s == 2.0
        && p.config.seconds == 3.0));
    assert_eq!(main.iter().filter(|p| p.config.direct).count(), 4);
    let dims = plan(&args("dims", false)).unwrap();
    assert_eq!(dims.len(), 18);
    assert!(dims
        .iter()
        .all(|p| p.config.profile == "random" && p.config.io_threads == 1));
    let sustained = plan(&args("sustained", false)).unwrap();
    assert_eq!(sustained.len(), 3);
    assert!(sustained.iter().all(|p| p.config.seconds == 120.0
        && p.config.payload == 4096
        && p.config.io_threads == 4
        && p.config.burst == Some((3, 100))
        && p.config.loss_percent == 2.0));
    assert_eq!(plan(&args("all", false)).unwrap().len(), 61);
    // Quick: only the policies this build runs, short rounds.
    let quick = plan(&args("all", true)).unwrap();
    assert!(quick.iter().all(|p| {
        FecPolicy::from_str(&p.config.fec)
            .unwrap()
            .available()
            .is_ok()
            && p.rounds == 1
            && p.config.seconds <= 2.0
    }));
}

#[test]
fn clients_sharing_threads_pass_every_check() {
    let _serial = one_at_a_time();
    // Three clients on two threads: one thread drives two clients through a ClientSet, the
    // other steps its lone client; the server parks when idle.
    let mut cfg = short(Profile::None, true);
    cfg.clients = 3;
    cfg.client_threads = Some(2);
    cfg.server_idle = Some("park".into());
    let r = run_round(&cfg);
    assert_ok(&r);
    assert_eq!(r.config.resolved_client_threads(), 2);
    for bad in [0, 4] {
        let c = bench::schema::RudpConfig {
            client_threads: Some(bad),
            ..cfg.clone()
        };
        assert!(validate(&c).is_err(), "{bad} client threads for 3 clients");
    }
    let c = bench::schema::RudpConfig {
        server_idle: Some("nap".into()),
        ..cfg.clone()
    };
    assert!(validate(&c).is_err());
}

#[test]
fn client_placement_defaults_by_route_and_is_checked() {
    let _serial = one_at_a_time();
    assert_eq!(
        short(Profile::None, true).client_placement.as_deref(),
        Some("with-worker")
    );
    assert_eq!(
        short(Profile::Random, false).client_placement.as_deref(),
        Some("os")
    );
    // Two workers, three client threads pinned beside the workers serving them.
    let mut cfg = short(Profile::None, true);
    cfg.io_threads = 2;
    cfg.clients = 3;
    let r = run_round(&cfg);
    assert_ok(&r);
    assert_eq!(r.config.client_placement.as_deref(), Some("with-worker"));
    let c = bench::schema::RudpConfig {
        client_placement: Some("anywhere".into()),
        ..cfg.clone()
    };
    assert!(validate(&c).is_err());
}

#[test]
fn separate_client_process_runs_direct_and_through_the_relay() {
    let _serial = one_at_a_time();
    // The test binary is not the bench: the bench binary plays the client process.
    bench::rudp::fleet::set_client_executable(env!("CARGO_BIN_EXE_bench"));
    for (profile, direct) in [(Profile::None, true), (Profile::Burst, false)] {
        let mut cfg = short(profile, direct);
        cfg.clients_process = Some("separate".into());
        cfg.client_placement = Some("os".into());
        cfg.client_threads = Some(1);
        let r = run_round(&cfg);
        assert_ok(&r);
        assert_eq!(r.relay.is_some(), !direct);
        // Only the child reports these, after its clients finished.
        let p = r.client_process.expect("the client process's own figures");
        let child_cpu = p.cpu.user_s + p.cpu.sys_s;
        assert!(child_cpu > 0.0, "{p:?}");
        assert!(p.peak_rss_kib.is_some_and(|k| k > 0));
        // The round's CPU is both processes'.
        assert!(
            r.cpu.user_s + r.cpu.sys_s >= child_cpu,
            "{:?} vs {p:?}",
            r.cpu
        );
        // The machine's CPU over the window includes the round's own.
        let h = r
            .host_cpu
            .expect("the machine's CPU (Linux has /proc/stat)");
        assert!(h.busy_percent > 0.0 && h.other_percent >= 0.0, "{h:?}");
    }
    // In process, nothing of the kind.
    let r = run_round(&short(Profile::None, true));
    assert!(r.client_process.is_none());
    // Placement is what an outside load generator cannot do.
    let mut cfg = short(Profile::None, true);
    cfg.clients_process = Some("separate".into());
    assert_eq!(cfg.client_placement.as_deref(), Some("with-worker"));
    assert!(validate(&cfg).is_err());
    cfg.clients_process = Some("elsewhere".into());
    cfg.client_placement = Some("os".into());
    assert!(validate(&cfg).is_err());
}
