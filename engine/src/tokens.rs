//! Connect tokens: what the game's backend does to let a player in. [`TokenIssuer`] is the one
//! way to issue a [`ConnectToken`] from Rust (a backend, or local development): it keeps the
//! key, the game's protocol id and the validity, and seals with the OS's random generator and
//! the wall clock.
//!
//! The token format is in [`ricochet_proto::token`] (whose `ConnectToken::seal` is the
//! sans-IO primitive this issuer calls, taking the time and the generator as arguments); a
//! backend in another language implements that format, or links the C library's issuer.
//! (Not to be confused with [`BackendKind`](crate::BackendKind), the datagram I/O backend.)

use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use ricochet_proto::token::{ConnectToken, TokenError, TokenKey, TokenParams};

/// What a backend keeps to let players in: the key it shares with the game's servers, the
/// game's protocol id, and how long its tokens stay valid (30 s unless changed). Make one at
/// startup; [`issue`](Self::issue) a token per player who logs in.
///
/// ```
/// use ricochet::{TokenIssuer, TokenKey};
/// use std::time::Duration;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let key = TokenKey::from_bytes([7; 32]); // from your secret store
/// let issuer = TokenIssuer::new(key, 0x1234).valid_for(Duration::from_secs(20));
/// let servers = ["203.0.113.5:7777".parse()?, "203.0.113.6:7777".parse()?];
/// let token = issuer.issue(42, &servers)?; // player 42, who may join either server
/// let bytes = token.to_bytes(); // send these to the player (over HTTPS)
/// # assert!(!bytes.is_empty());
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct TokenIssuer {
    key: TokenKey,
    protocol_id: u64,
    valid_for: Duration,
}

impl std::fmt::Debug for TokenIssuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("TokenIssuer")
            .field("protocol_id", &self.protocol_id)
            .field("valid_for", &self.valid_for)
            .finish_non_exhaustive()
    }
}

impl TokenIssuer {
    /// Issue tokens sealed with `key` (the one the servers get in
    /// [`ServerConfig::tokens`](crate::ServerConfig::tokens)) for the game's `protocol_id`,
    /// valid for 30 s.
    pub fn new(key: TokenKey, protocol_id: u64) -> Self {
        TokenIssuer {
            key,
            protocol_id,
            valid_for: Duration::from_secs(30),
        }
    }

    /// How long a token stays valid once issued. Keep it short (tens of seconds): a token
    /// only needs to last until the handshake completes, and a server accepts it once.
    pub fn valid_for(mut self, valid_for: Duration) -> Self {
        self.valid_for = valid_for;
        self
    }

    /// A token that lets player `client_id` onto the servers at `servers` (tried in order).
    pub fn issue(
        &self,
        client_id: u64,
        servers: &[SocketAddr],
    ) -> Result<ConnectToken, TokenError> {
        self.issue_with_data(client_id, servers, &[])
    }

    /// Like [`issue`](Self::issue), carrying `user_data` (at most 256 bytes) to the server
    /// application ([`Handler::on_accept`](crate::Handler::on_accept) sees it).
    pub fn issue_with_data(
        &self,
        client_id: u64,
        servers: &[SocketAddr],
        user_data: &[u8],
    ) -> Result<ConnectToken, TokenError> {
        seal(
            &self.key,
            self.protocol_id,
            client_id,
            servers,
            self.valid_for,
            user_data,
        )
    }
}

/// A token for `client_id` valid for `valid_for` from now (the wall clock), sealed with the OS's
/// random generator.
pub(crate) fn seal(
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
        // `Duration::MAX` ("never") expires at the end of time rather than overflowing.
        expires_unix: now.saturating_add(valid_for).as_secs(),
        user_data,
    };
    ConnectToken::seal(key, &params, &mut rand::rng())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ricochet_proto::token::PrivateToken;

    #[test]
    fn an_issued_token_opens_until_it_expires() {
        let key = TokenKey::from_bytes([3; 32]);
        let server: SocketAddr = "127.0.0.1:7777".parse().unwrap();
        let t = seal(&key, 5, 9, &[server], Duration::from_secs(30), b"x").unwrap();
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        assert!(t.expires_unix >= now + 29 && t.expires_unix <= now + 31);
        let p = PrivateToken::open(&key, 5, t.expires_unix, &t.sealed, now).unwrap();
        assert_eq!((p.client_id, &p.user_data[..]), (9, &b"x"[..]));
        assert!(PrivateToken::open(&key, 5, t.expires_unix, &t.sealed, t.expires_unix).is_err());
    }

    /// A validity of `Duration::MAX` ("never") does not overflow: the token expires at the
    /// end of time.
    #[test]
    fn a_token_valid_for_ever_does_not_overflow() {
        let key = TokenKey::from_bytes([5; 32]);
        let server: SocketAddr = "127.0.0.1:7777".parse().unwrap();
        let issuer = TokenIssuer::new(key.clone(), 1).valid_for(Duration::MAX);
        let t = issuer.issue(2, &[server]).unwrap();
        assert_eq!(t.expires_unix, u64::MAX);
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        assert!(PrivateToken::open(&key, 1, t.expires_unix, &t.sealed, now).is_ok());
    }

    #[test]
    fn an_issuer_seals_for_its_game_with_its_validity() {
        let key = TokenKey::from_bytes([4; 32]);
        let server: SocketAddr = "127.0.0.1:7777".parse().unwrap();
        let issuer = TokenIssuer::new(key.clone(), 77).valid_for(Duration::from_secs(90));
        let t = issuer.issue_with_data(3, &[server], b"blue team").unwrap();
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        assert!(t.expires_unix >= now + 89 && t.expires_unix <= now + 91);
        assert_eq!(t.server_addresses, vec![server]);
        let p = PrivateToken::open(&key, 77, t.expires_unix, &t.sealed, now).unwrap();
        assert_eq!((p.client_id, &p.user_data[..]), (3, &b"blue team"[..]));
        // Sealed for game 77 only.
        assert!(PrivateToken::open(&key, 78, t.expires_unix, &t.sealed, now).is_err());
        let plain = issuer.issue(4, &[server]).unwrap();
        let p = PrivateToken::open(&key, 77, plain.expires_unix, &plain.sealed, now).unwrap();
        assert_eq!((p.client_id, p.user_data.len()), (4, 0));
        assert!(!format!("{issuer:?}").contains("key"));
    }
}
