//! A sliding-window FEC sender talking to a block-code receiver, and the reverse: each side
//! rejects the other scheme's repair/parity bodies (counted malformed), so FEC rebuilds
//! nothing, yet every echo still arrives exactly once, intact and in order, because ARQ
//! retransmits every loss.

use std::time::Duration;

use ricochet_proto::fec::{FecPolicy, FecScheme};
use ricochet_proto::Config;
use ricochet_testkit::echo::EchoScenario;
use ricochet_testkit::Profile;

fn config(scheme: FecScheme) -> Config {
    let mut c = Config::game();
    c.fec.policy = FecPolicy::Adaptive { max_parity: 4 };
    c.fec.scheme = scheme;
    c
}

fn mixed(client: FecScheme, server: FecScheme, profile: Profile) {
    let r = EchoScenario {
        clients: 2,
        window: 8,
        warmup: Duration::from_millis(500),
        seconds: Duration::from_secs(3),
        config: config(client),
        server_config: Some(config(server)),
        ..EchoScenario::new(profile, 5)
    }
    .run()
    .unwrap();
    let name = format!("{client:?} client, {server:?} server, {profile}");
    // Every echo came back once, intact and in order (the client checks each one's sequence
    // number and bytes), and no connection gave up.
    assert!(r.is_ok(), "{name}: {:?}", r.problems());
    assert!(
        r.round_trips > 1000,
        "{name}: {} round trips",
        r.round_trips
    );
    // Both sides send parity the other cannot use: nothing is rebuilt, ARQ retransmits it all.
    assert!(
        r.fec_parity_shards.unwrap_or(0) > 0,
        "{name}: no parity sent"
    );
    assert_eq!(r.fec_recovered, Some(0), "{name}");
    assert!(
        r.retransmitted_segments > 0,
        "{name}: loss must cause resends"
    );
}

#[test]
fn sliding_client_block_server_delivers_every_message_once() {
    mixed(FecScheme::Sliding, FecScheme::Block, Profile::Random);
    mixed(FecScheme::Sliding, FecScheme::Block, Profile::Burst);
}

#[test]
fn block_client_sliding_server_delivers_every_message_once() {
    mixed(FecScheme::Block, FecScheme::Sliding, Profile::Random);
    mixed(FecScheme::Block, FecScheme::Sliding, Profile::Burst);
}
