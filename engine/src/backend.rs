//! What the game's backend does to let a player in, for backends written in Rust and for local
//! development: issue a [`ConnectToken`] with the OS's random generator and the wall clock.
//!
//! The token format and the sans-IO API (which takes the time and the generator as arguments)
//! are in [`ricochet_proto::token`]; a backend in another language implements that format.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use ricochet_proto::token::{ConnectToken, TokenError, TokenKey, TokenParams};

/// Issue a token that lets player `client_id` onto the servers at `servers` (tried in order)
/// for `valid_for` from now, carrying `user_data` (at most 256 bytes) to the server
/// application, sealed with the backend's `key` for the game's `protocol_id`.
///
/// Keep `valid_for` short (tens of seconds): a token only needs to last until the handshake
/// completes, and a server accepts it once.
pub fn issue_token(
    key: &TokenKey,
    protocol_id: u64,
    client_id: u64,
    servers: &[SocketAddr],
    valid_for: Duration,
    user_data: &[u8],
) -> Result<ConnectToken, TokenError> {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let params = TokenParams {
        protocol_id,
        client_id,
        server_addresses: servers,
        expires_unix: (now + valid_for).as_secs(),
        user_data,
    };
    ConnectToken::generate(key, &params, &mut rand::rng())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ricochet_proto::token::PrivateToken;

    #[test]
    fn an_issued_token_opens_until_it_expires() {
        let key = TokenKey::from_bytes([3; 32]);
        let server: SocketAddr = "127.0.0.1:7777".parse().unwrap();
        let t = issue_token(&key, 5, 9, &[server], Duration::from_secs(30), b"x").unwrap();
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        assert!(t.expires_unix >= now + 29 && t.expires_unix <= now + 31);
        let p = PrivateToken::open(&key, 5, t.expires_unix, &t.sealed, now).unwrap();
        assert_eq!((p.client_id, &p.user_data[..]), (9, &b"x"[..]));
        assert!(PrivateToken::open(&key, 5, t.expires_unix, &t.sealed, t.expires_unix).is_err());
    }
}
