//! Connect tokens: how the game's backend lets a player onto a dedicated server.
//!
//! The model is netcode.io's. The backend authenticates the player (its own business: a login,
//! a platform ticket), picks servers, and issues a [`ConnectToken`] over a channel it already
//! trusts (HTTPS). The token names the servers the player may join, says when it expires,
//! carries up to [`MAX_USER_DATA`] bytes for the server application, and hands out the
//! session's [`SessionKeys`]. Its private part is sealed (XChaCha20-Poly1305, a random 24-byte
//! nonce) with a [`TokenKey`] that the backend shares with its servers and nobody else has;
//! a server opens it without contacting anyone. The client cannot read or alter the private
//! part; it learns the keys from the public part, which the backend sent it in confidence.
//!
//! One way to issue tokens: a backend in Rust uses `ricochet::TokenIssuer` (the wall clock, the
//! OS's generator, a validity); one in another language links the C library's issuer or
//! implements the layout below. This module holds the format and the sans-IO primitive that
//! issuer calls, [`ConnectToken::seal`], which takes the expiry and the generator as arguments
//! (tests and fuzz targets pass a seeded one):
//!
//! ```
//! use rand::SeedableRng;
//! use ricochet_proto::token::{ConnectToken, TokenKey, TokenParams};
//!
//! # fn main() -> Result<(), ricochet_proto::token::TokenError> {
//! let key = TokenKey::from_bytes([7; 32]); // in production: TokenKey::generate, kept secret
//! // A backend draws from a generator the OS seeds (e.g. `rand::rng()`); a fixed seed here.
//! let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(1);
//! let now_unix = 1_800_000_000; // the backend's clock, seconds since 1970
//! let token = ConnectToken::seal(
//!     &key,
//!     &TokenParams {
//!         protocol_id: 0x1234,
//!         client_id: 42,
//!         server_addresses: &["203.0.113.5:7777".parse().unwrap()],
//!         expires_unix: now_unix + 30,
//!         user_data: b"team=blue",
//!     },
//!     &mut rng,
//! )?;
//! let bytes = token.to_bytes(); // what the backend sends the player
//! assert_eq!(ConnectToken::from_bytes(&bytes)?, token);
//! # Ok(())
//! # }
//! ```
//!
//! Nothing here reads a clock or the OS: the caller passes the time (`now_unix`, seconds since
//! the Unix epoch) and the random generator.
//!
//! # Serialized connect token ([`CONNECT_TOKEN_LEN`] bytes)
//!
//! Integers are big-endian, like the rest of the wire format.
//!
//! | offset | size | field |
//! | ---: | ---: | --- |
//! | 0 | 16 | [`TOKEN_VERSION`] (ASCII) |
//! | 16 | 8 | protocol id: the game's own number; a server only takes tokens with its id |
//! | 24 | 8 | expiry, seconds since the Unix epoch |
//! | 32 | 1 | number of server addresses, 1..=[`MAX_SERVER_ADDRESSES`] |
//! | 33 | 19 × 8 | server addresses (see below), unused entries zero |
//! | 185 | 32 | client-to-server key |
//! | 217 | 32 | server-to-client key |
//! | 249 | 24 | nonce of the sealed part |
//! | 273 | [`SEALED_LEN`] | the sealed private part (ciphertext, then the 16-byte tag) |
//!
//! An address is 19 bytes: family (4 or 6), the IP in 16 bytes (IPv4 in the first four, the
//! rest zero), the port.
//!
//! # Private part ([`PRIVATE_LEN`] bytes before sealing)
//!
//! | offset | size | field |
//! | ---: | ---: | --- |
//! | 0 | 8 | client id (the backend's identity of the player) |
//! | 8 | 1 | number of server addresses |
//! | 9 | 19 × 8 | server addresses, as above |
//! | 161 | 32 | client-to-server key |
//! | 193 | 32 | server-to-client key |
//! | 225 | 2 | user data length, 0..=[`MAX_USER_DATA`] |
//! | 227 | 256 | user data, zero padded |
//! | 483 | 13 | zero |
//!
//! The private part is always the same size, so its length tells nothing about the user data.
//! Sealing authenticates [`TOKEN_VERSION`], the protocol id and the expiry as associated data:
//! the public copies a server reads before opening cannot be changed without the open failing.
//! The sealed part's tag (its last 16 bytes) identifies the token: a server accepts each tag
//! once.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use bytes::Bytes;
use rand::CryptoRng;

use crate::xchacha;
use crate::SessionKeys;

mod sizes;
pub use sizes::{NONCE_LEN, PRIVATE_LEN, SEALED_LEN, TAG_LEN};

/// The first bytes of a serialized token and part of what sealing authenticates: a token of
/// another format (or another program) never opens.
pub const TOKEN_VERSION: &[u8; 16] = b"ricochet token 1";
/// Most server addresses a token lists.
pub const MAX_SERVER_ADDRESSES: usize = 8;
/// Most bytes of application data a token carries to the server.
pub const MAX_USER_DATA: usize = 256;
/// Size of a serialized [`ConnectToken`].
pub const CONNECT_TOKEN_LEN: usize = 16 + 8 + 8 + ADDRESSES_LEN + 64 + NONCE_LEN + SEALED_LEN;

/// One encoded address: family, 16 IP bytes, port.
const ADDRESS_LEN: usize = 1 + 16 + 2;
/// The address list: count, then every entry.
const ADDRESSES_LEN: usize = 1 + ADDRESS_LEN * MAX_SERVER_ADDRESSES;
/// Where the user data length sits in the private part.
const USER_DATA_LEN_AT: usize = 8 + ADDRESSES_LEN + 64;

/// Why a token could not be made, read or opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TokenError {
    /// A token must name at least one server.
    #[error("a connect token must list at least one server address")]
    NoServerAddress,
    /// More than [`MAX_SERVER_ADDRESSES`] addresses.
    #[error("a connect token lists at most {MAX_SERVER_ADDRESSES} server addresses, not {0}")]
    TooManyServerAddresses(usize),
    /// More than [`MAX_USER_DATA`] bytes of user data.
    #[error("a connect token carries at most {MAX_USER_DATA} bytes of user data, not {0}")]
    UserDataTooLarge(usize),
    /// The bytes are not a serialized token of this version (wrong length, version, field).
    #[error("not a connect token of this version")]
    Malformed,
    /// The private part did not open: sealed with another key, for another protocol id or
    /// expiry than its public copy says, or altered.
    #[error("the connect token is not sealed with this key (or was altered)")]
    Invalid,
    /// The token opened but its expiry has passed.
    #[error("the connect token expired")]
    Expired,
}

/// The key the game's backend seals private token parts with, shared with its servers and
/// nobody else. Whoever holds it can admit anyone to every server that trusts it: keep it out
/// of clients, logs and repositories. `Debug` does not print it.
#[derive(Clone, PartialEq, Eq)]
pub struct TokenKey([u8; 32]);

impl Drop for TokenKey {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.0);
    }
}

impl TokenKey {
    /// A key from its 32 bytes (as stored in the backend's and the servers' secrets).
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        TokenKey(bytes)
    }

    /// A fresh random key.
    pub fn generate<R: CryptoRng + ?Sized>(rng: &mut R) -> Self {
        let mut k = [0u8; 32];
        rng.fill_bytes(&mut k);
        TokenKey(k)
    }

    /// The key's bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TokenKey { .. }")
    }
}

/// What the backend decides for one token.
#[derive(Debug, Clone, Copy)]
pub struct TokenParams<'a> {
    /// The game's protocol id: servers only accept tokens with their own.
    pub protocol_id: u64,
    /// Who the player is, as the backend knows them (the server application sees it).
    pub client_id: u64,
    /// The servers this token admits to, 1..=[`MAX_SERVER_ADDRESSES`], as the client reaches
    /// them (each server checks that one of its public addresses is listed). The client tries
    /// them in order.
    pub server_addresses: &'a [SocketAddr],
    /// Seconds since the Unix epoch after which no server accepts the token. It only needs to
    /// last until the handshake completes: tens of seconds.
    pub expires_unix: u64,
    /// Up to [`MAX_USER_DATA`] bytes for the server application (a team, a match id, a role).
    pub user_data: &'a [u8],
}

/// The private part of a token, sealed: opaque to the client. Its last [`TAG_LEN`] bytes (the
/// tag) identify the token.
#[derive(Clone, PartialEq, Eq)]
pub struct SealedToken {
    /// The random nonce it was sealed with.
    pub nonce: [u8; NONCE_LEN],
    /// Ciphertext, then the tag.
    pub bytes: [u8; SEALED_LEN],
}

impl SealedToken {
    /// The AEAD tag: a token's identity for the server's table of used tokens.
    pub fn tag(&self) -> [u8; TAG_LEN] {
        let mut t = [0u8; TAG_LEN];
        t.copy_from_slice(&self.bytes[PRIVATE_LEN..]);
        t
    }
}

impl fmt::Debug for SealedToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SealedToken {{ tag: {:02x?} }}", self.tag())
    }
}

/// The private part of a token, as the backend writes it and a server reads it once opened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrivateToken {
    /// The player's identity, as the backend knows it.
    pub client_id: u64,
    /// The servers the token admits to.
    pub server_addresses: Vec<SocketAddr>,
    /// The session's packet keys.
    pub keys: SessionKeys,
    /// Application data for the server, at most [`MAX_USER_DATA`] bytes.
    pub user_data: Bytes,
}

/// The associated data of the seal: version, protocol id, expiry.
fn associated_data(protocol_id: u64, expires_unix: u64) -> [u8; 32] {
    let mut ad = [0u8; 32];
    ad[..16].copy_from_slice(TOKEN_VERSION);
    ad[16..24].copy_from_slice(&protocol_id.to_be_bytes());
    ad[24..].copy_from_slice(&expires_unix.to_be_bytes());
    ad
}

fn check_addresses(addrs: &[SocketAddr]) -> Result<(), TokenError> {
    if addrs.is_empty() {
        return Err(TokenError::NoServerAddress);
    }
    if addrs.len() > MAX_SERVER_ADDRESSES {
        return Err(TokenError::TooManyServerAddresses(addrs.len()));
    }
    Ok(())
}

/// Write the address list (count, then [`MAX_SERVER_ADDRESSES`] entries, unused ones zero).
fn put_addresses(out: &mut [u8], addrs: &[SocketAddr]) {
    out[..ADDRESSES_LEN].fill(0);
    out[0] = addrs.len() as u8;
    for (i, a) in addrs.iter().take(MAX_SERVER_ADDRESSES).enumerate() {
        let e = &mut out[1 + i * ADDRESS_LEN..1 + (i + 1) * ADDRESS_LEN];
        match a.ip() {
            IpAddr::V4(v4) => {
                e[0] = 4;
                e[1..5].copy_from_slice(&v4.octets());
            }
            IpAddr::V6(v6) => {
                e[0] = 6;
                e[1..17].copy_from_slice(&v6.octets());
            }
        }
        e[17..19].copy_from_slice(&a.port().to_be_bytes());
    }
}

/// Read an address list written by [`put_addresses`]; anything else (a count out of range, an
/// unknown family, bytes where zeros belong) is malformed, so a list re-encodes to itself.
fn get_addresses(b: &[u8]) -> Result<Vec<SocketAddr>, TokenError> {
    let b = b.get(..ADDRESSES_LEN).ok_or(TokenError::Malformed)?;
    let n = usize::from(b[0]);
    if n == 0 || n > MAX_SERVER_ADDRESSES {
        return Err(TokenError::Malformed);
    }
    let mut out = Vec::with_capacity(n);
    for i in 0..MAX_SERVER_ADDRESSES {
        let e = &b[1 + i * ADDRESS_LEN..1 + (i + 1) * ADDRESS_LEN];
        if i >= n {
            if e.iter().any(|&x| x != 0) {
                return Err(TokenError::Malformed);
            }
            continue;
        }
        let port = u16::from_be_bytes([e[17], e[18]]);
        let ip = match e[0] {
            4 if e[5..17].iter().all(|&x| x == 0) => {
                IpAddr::V4(Ipv4Addr::new(e[1], e[2], e[3], e[4]))
            }
            6 => {
                let mut o = [0u8; 16];
                o.copy_from_slice(&e[1..17]);
                IpAddr::V6(Ipv6Addr::from(o))
            }
            _ => return Err(TokenError::Malformed),
        };
        out.push(SocketAddr::new(ip, port));
    }
    Ok(out)
}

impl PrivateToken {
    /// Seal with `key`, binding the protocol id and expiry, under a fresh random nonce.
    pub fn seal<R: CryptoRng + ?Sized>(
        &self,
        key: &TokenKey,
        protocol_id: u64,
        expires_unix: u64,
        rng: &mut R,
    ) -> Result<SealedToken, TokenError> {
        let mut bytes = [0u8; SEALED_LEN];
        self.encode(&mut bytes[..PRIVATE_LEN])?;
        let mut nonce = [0u8; NONCE_LEN];
        rng.fill_bytes(&mut nonce);
        let ad = associated_data(protocol_id, expires_unix);
        let (body, tag_out) = bytes.split_at_mut(PRIVATE_LEN);
        tag_out.copy_from_slice(&xchacha::seal(&key.0, &nonce, &ad, body));
        Ok(SealedToken { nonce, bytes })
    }

    /// Open a sealed part with `key`, given the protocol id and expiry its public copy states
    /// (a wrong one fails the open), then check the expiry against `now_unix`. An expired
    /// token is reported as [`TokenError::Expired`] only once it opened: the expiry is then
    /// known to be the backend's.
    pub fn open(
        key: &TokenKey,
        protocol_id: u64,
        expires_unix: u64,
        sealed: &SealedToken,
        now_unix: u64,
    ) -> Result<PrivateToken, TokenError> {
        let token = Self::unseal(key, protocol_id, expires_unix, sealed)?;
        if now_unix >= expires_unix {
            return Err(TokenError::Expired);
        }
        Ok(token)
    }

    /// Authenticate and decrypt a sealed part, without looking at the time (a server that
    /// refuses an expired token still wants its keys, to authenticate the refusal).
    pub fn unseal(
        key: &TokenKey,
        protocol_id: u64,
        expires_unix: u64,
        sealed: &SealedToken,
    ) -> Result<PrivateToken, TokenError> {
        let mut body = [0u8; PRIVATE_LEN];
        body.copy_from_slice(&sealed.bytes[..PRIVATE_LEN]);
        let tag = sealed.tag();
        let ad = associated_data(protocol_id, expires_unix);
        if !xchacha::open(&key.0, &sealed.nonce, &ad, &mut body, &tag) {
            return Err(TokenError::Invalid);
        }
        // Authentic, so written by the backend's encoder; decode defensively all the same.
        PrivateToken::decode(&body)
    }

    /// True when `addr` is one of the token's server addresses.
    pub fn lists(&self, addr: SocketAddr) -> bool {
        self.server_addresses.contains(&addr)
    }

    /// Write the [`PRIVATE_LEN`]-byte plaintext.
    fn encode(&self, out: &mut [u8]) -> Result<(), TokenError> {
        check_addresses(&self.server_addresses)?;
        if self.user_data.len() > MAX_USER_DATA {
            return Err(TokenError::UserDataTooLarge(self.user_data.len()));
        }
        let out = &mut out[..PRIVATE_LEN];
        out.fill(0);
        out[..8].copy_from_slice(&self.client_id.to_be_bytes());
        put_addresses(&mut out[8..], &self.server_addresses);
        let k = 8 + ADDRESSES_LEN;
        out[k..k + 32].copy_from_slice(&self.keys.client_to_server);
        out[k + 32..k + 64].copy_from_slice(&self.keys.server_to_client);
        out[USER_DATA_LEN_AT..USER_DATA_LEN_AT + 2]
            .copy_from_slice(&(self.user_data.len() as u16).to_be_bytes());
        out[USER_DATA_LEN_AT + 2..USER_DATA_LEN_AT + 2 + self.user_data.len()]
            .copy_from_slice(&self.user_data);
        Ok(())
    }

    /// Read a [`PRIVATE_LEN`]-byte plaintext. Strict: only what sealing writes decodes
    /// (lengths in range, zeros where zeros belong).
    pub fn decode(plain: &[u8]) -> Result<PrivateToken, TokenError> {
        if plain.len() != PRIVATE_LEN {
            return Err(TokenError::Malformed);
        }
        let mut id = [0u8; 8];
        id.copy_from_slice(&plain[..8]);
        let server_addresses = get_addresses(&plain[8..])?;
        let k = 8 + ADDRESSES_LEN;
        let keys = keys_at(&plain[k..k + 64]);
        let len = usize::from(u16::from_be_bytes([
            plain[USER_DATA_LEN_AT],
            plain[USER_DATA_LEN_AT + 1],
        ]));
        if len > MAX_USER_DATA {
            return Err(TokenError::Malformed);
        }
        let data = USER_DATA_LEN_AT + 2;
        if plain[data + len..].iter().any(|&x| x != 0) {
            return Err(TokenError::Malformed);
        }
        Ok(PrivateToken {
            client_id: u64::from_be_bytes(id),
            server_addresses,
            keys,
            user_data: Bytes::copy_from_slice(&plain[data..data + len]),
        })
    }
}

fn keys_at(b: &[u8]) -> SessionKeys {
    let mut k = SessionKeys {
        client_to_server: [0; 32],
        server_to_client: [0; 32],
    };
    k.client_to_server.copy_from_slice(&b[..32]);
    k.server_to_client.copy_from_slice(&b[32..64]);
    k
}

/// What the backend gives a player: where to connect, until when, the session keys, and the
/// sealed private part the player presents to the server. Treat it as a secret of that player
/// (its keys protect the session): send it over an encrypted channel only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectToken {
    /// The game's protocol id.
    pub protocol_id: u64,
    /// Seconds since the Unix epoch after which no server accepts the token.
    pub expires_unix: u64,
    /// The servers to try, in order.
    pub server_addresses: Vec<SocketAddr>,
    /// The session's packet keys (the same as in the sealed part).
    pub keys: SessionKeys,
    /// The private part, sealed with the backend's key.
    pub sealed: SealedToken,
}

impl ConnectToken {
    /// The sans-IO primitive that makes a token: draw the session keys and the nonce from
    /// `rng` (a cryptographic generator seeded by the OS, e.g. `rand::rng()`, outside tests),
    /// seal the private part with `key`, with the expiry the caller computed from its own
    /// clock. [`PrivateToken::open`] is its counterpart on the server.
    ///
    /// A backend in Rust issues tokens with `ricochet::TokenIssuer`, which calls this with
    /// the wall clock and the OS's generator: that is the one way a user is pointed to. This
    /// is for what must choose the time and the randomness itself (deterministic tests, fuzz
    /// targets, an embedder without the `ricochet` runtime).
    pub fn seal<R: CryptoRng + ?Sized>(
        key: &TokenKey,
        params: &TokenParams<'_>,
        rng: &mut R,
    ) -> Result<ConnectToken, TokenError> {
        check_addresses(params.server_addresses)?;
        if params.user_data.len() > MAX_USER_DATA {
            return Err(TokenError::UserDataTooLarge(params.user_data.len()));
        }
        let mut keys = SessionKeys {
            client_to_server: [0; 32],
            server_to_client: [0; 32],
        };
        rng.fill_bytes(&mut keys.client_to_server);
        rng.fill_bytes(&mut keys.server_to_client);
        let private = PrivateToken {
            client_id: params.client_id,
            server_addresses: params.server_addresses.to_vec(),
            keys: keys.clone(),
            user_data: Bytes::copy_from_slice(params.user_data),
        };
        let sealed = private.seal(key, params.protocol_id, params.expires_unix, rng)?;
        Ok(ConnectToken {
            protocol_id: params.protocol_id,
            expires_unix: params.expires_unix,
            server_addresses: private.server_addresses,
            keys,
            sealed,
        })
    }

    /// [`ConnectToken::seal`] under its old name.
    #[deprecated(
        note = "renamed `ConnectToken::seal` (the sans-IO primitive); to issue tokens use `ricochet::TokenIssuer`"
    )]
    pub fn generate<R: CryptoRng + ?Sized>(
        key: &TokenKey,
        params: &TokenParams<'_>,
        rng: &mut R,
    ) -> Result<ConnectToken, TokenError> {
        Self::seal(key, params, rng)
    }

    /// The serialized form (see the module docs), [`CONNECT_TOKEN_LEN`] bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = vec![0u8; CONNECT_TOKEN_LEN];
        out[..16].copy_from_slice(TOKEN_VERSION);
        out[16..24].copy_from_slice(&self.protocol_id.to_be_bytes());
        out[24..32].copy_from_slice(&self.expires_unix.to_be_bytes());
        // `from_bytes` and `seal` only make tokens with 1..=8 addresses; a token whose
        // list was edited since keeps its first eight.
        let n = self.server_addresses.len().min(MAX_SERVER_ADDRESSES);
        put_addresses(&mut out[32..], &self.server_addresses[..n]);
        let k = 32 + ADDRESSES_LEN;
        out[k..k + 32].copy_from_slice(&self.keys.client_to_server);
        out[k + 32..k + 64].copy_from_slice(&self.keys.server_to_client);
        out[k + 64..k + 64 + NONCE_LEN].copy_from_slice(&self.sealed.nonce);
        out[k + 64 + NONCE_LEN..].copy_from_slice(&self.sealed.bytes);
        out
    }

    /// Read a serialized token. Checks the layout only: whether the sealed part is genuine is
    /// for the server to find out.
    pub fn from_bytes(b: &[u8]) -> Result<ConnectToken, TokenError> {
        if b.len() != CONNECT_TOKEN_LEN || &b[..16] != TOKEN_VERSION {
            return Err(TokenError::Malformed);
        }
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_be_bytes(a)
        };
        let server_addresses = get_addresses(&b[32..])?;
        let k = 32 + ADDRESSES_LEN;
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&b[k + 64..k + 64 + NONCE_LEN]);
        let mut bytes = [0u8; SEALED_LEN];
        bytes.copy_from_slice(&b[k + 64 + NONCE_LEN..]);
        Ok(ConnectToken {
            protocol_id: u64_at(16),
            expires_unix: u64_at(24),
            server_addresses,
            keys: keys_at(&b[k..k + 64]),
            sealed: SealedToken { nonce, bytes },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha20Rng;

    fn params<'a>(addrs: &'a [SocketAddr], data: &'a [u8]) -> TokenParams<'a> {
        TokenParams {
            protocol_id: 9,
            client_id: 77,
            server_addresses: addrs,
            expires_unix: 1_000,
            user_data: data,
        }
    }

    #[test]
    fn a_token_round_trips_and_opens_with_its_key_only() {
        let mut rng = ChaCha20Rng::seed_from_u64(1);
        let key = TokenKey::generate(&mut rng);
        let addrs: Vec<SocketAddr> = vec![
            "10.0.0.1:7777".parse().unwrap(),
            "[2001:db8::1]:7778".parse().unwrap(),
        ];
        let t = ConnectToken::seal(&key, &params(&addrs, b"blue"), &mut rng).unwrap();
        let back = ConnectToken::from_bytes(&t.to_bytes()).unwrap();
        assert_eq!(back, t);
        let p = PrivateToken::open(&key, 9, 1_000, &t.sealed, 999).unwrap();
        assert_eq!(p.client_id, 77);
        assert_eq!(p.server_addresses, addrs);
        assert_eq!(p.keys, t.keys);
        assert_eq!(&p.user_data[..], b"blue");
        assert!(p.lists(addrs[1]));
        assert!(!p.lists("10.0.0.1:7778".parse().unwrap()));
        // Another key, another protocol id, another expiry: the open fails.
        let other = TokenKey::generate(&mut rng);
        assert_eq!(
            PrivateToken::open(&other, 9, 1_000, &t.sealed, 0),
            Err(TokenError::Invalid)
        );
        assert_eq!(
            PrivateToken::open(&key, 8, 1_000, &t.sealed, 0),
            Err(TokenError::Invalid)
        );
        assert_eq!(
            PrivateToken::open(&key, 9, 2_000, &t.sealed, 0),
            Err(TokenError::Invalid)
        );
        // Expired once now reaches the expiry.
        assert_eq!(
            PrivateToken::open(&key, 9, 1_000, &t.sealed, 1_000),
            Err(TokenError::Expired)
        );
        // Any flipped bit of the sealed part fails the open.
        for i in [0, PRIVATE_LEN / 2, SEALED_LEN - 1] {
            let mut s = t.sealed.clone();
            s.bytes[i] ^= 1;
            assert_eq!(
                PrivateToken::open(&key, 9, 1_000, &s, 0),
                Err(TokenError::Invalid)
            );
        }
    }

    #[test]
    fn limits_are_enforced_when_issuing() {
        let mut rng = ChaCha20Rng::seed_from_u64(2);
        let key = TokenKey::generate(&mut rng);
        let one: Vec<SocketAddr> = vec!["10.0.0.1:1".parse().unwrap()];
        let nine: Vec<SocketAddr> = (0..9)
            .map(|i| SocketAddr::from(([10, 0, 0, i], 1)))
            .collect();
        assert_eq!(
            ConnectToken::seal(&key, &params(&[], b""), &mut rng),
            Err(TokenError::NoServerAddress)
        );
        assert_eq!(
            ConnectToken::seal(&key, &params(&nine, b""), &mut rng),
            Err(TokenError::TooManyServerAddresses(9))
        );
        assert_eq!(
            ConnectToken::seal(&key, &params(&one, &[1; 257]), &mut rng),
            Err(TokenError::UserDataTooLarge(257))
        );
        let full = ConnectToken::seal(&key, &params(&nine[..8], &[0xab; 256]), &mut rng)
            .expect("8 addresses and 256 bytes fit");
        let p = PrivateToken::open(&key, 9, 1_000, &full.sealed, 0).unwrap();
        assert_eq!(p.server_addresses.len(), 8);
        assert_eq!(p.user_data.len(), 256);
    }

    #[test]
    fn malformed_serializations_are_refused() {
        let mut rng = ChaCha20Rng::seed_from_u64(3);
        let key = TokenKey::generate(&mut rng);
        let one: Vec<SocketAddr> = vec!["10.0.0.1:1".parse().unwrap()];
        let b = ConnectToken::seal(&key, &params(&one, b""), &mut rng)
            .unwrap()
            .to_bytes();
        assert_eq!(
            ConnectToken::from_bytes(&b[..b.len() - 1]),
            Err(TokenError::Malformed)
        );
        let mut v = b.clone();
        v[0] ^= 1;
        assert_eq!(ConnectToken::from_bytes(&v), Err(TokenError::Malformed));
        let mut zero = b.clone();
        zero[32] = 0;
        assert_eq!(ConnectToken::from_bytes(&zero), Err(TokenError::Malformed));
        let mut family = b.clone();
        family[33] = 5;
        assert_eq!(
            ConnectToken::from_bytes(&family),
            Err(TokenError::Malformed)
        );
        let mut stray = b;
        stray[33 + ADDRESS_LEN] = 1; // an unused entry that is not zero
        assert_eq!(ConnectToken::from_bytes(&stray), Err(TokenError::Malformed));
    }

    #[test]
    fn keys_are_not_printed() {
        let key = TokenKey::from_bytes([0x5a; 32]);
        assert!(!format!("{key:?}").contains("90"));
        let keys = keys_at(&[0x5a; 64]);
        assert!(!format!("{keys:?}").contains("90"));
    }
}
