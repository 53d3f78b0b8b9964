//! The proto names renamed for issue 37 still work for one release, deprecated: the one place
//! in the tree that uses them.

use rand::SeedableRng;
use ricochet_proto::token::{ConnectToken, TokenKey, TokenParams};
use ricochet_proto::{Config, ListenConfig};

#[test]
#[allow(deprecated)]
fn the_old_proto_names_still_work() {
    // `Config::competitive` is the game profile, `Config::game`.
    assert_eq!(
        format!("{:?}", Config::competitive()),
        format!("{:?}", Config::game())
    );

    // `ConnectToken::generate` is `ConnectToken::seal`: from the same generator, the same token.
    let key = TokenKey::from_bytes([4; 32]);
    let servers = ["127.0.0.1:7777".parse().unwrap()];
    let params = TokenParams {
        protocol_id: 9,
        client_id: 3,
        server_addresses: &servers,
        expires_unix: 1_800_000_000,
        user_data: b"blue",
    };
    let rng = || rand_chacha::ChaCha20Rng::seed_from_u64(5);
    let old = ConnectToken::generate(&key, &params, &mut rng()).unwrap();
    let new = ConnectToken::seal(&key, &params, &mut rng()).unwrap();
    assert_eq!(old, new);

    // The cache hint, now `ricochet_platform::prefetch`, is still callable by its old path
    // (the test would not compile without it).
    ricochet_proto::prefetch(&params);

    // `ServerConfig` is `ListenConfig`.
    let listen: ricochet_proto::ServerConfig = ListenConfig::insecure();
    assert_eq!(
        format!("{listen:?}"),
        format!("{:?}", ListenConfig::insecure())
    );
}
