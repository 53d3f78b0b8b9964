//! The secrets that protect one session's packets.

use std::fmt;

use crate::wire::ConnectionId;

/// One key per direction for a session's packet protection, handed out by the game's backend in
/// the connect token: the client learns them from the token's public part, the server from its
/// sealed part. Never printed: `Debug` shows only that keys are present.
#[derive(Clone, PartialEq, Eq)]
pub struct SessionKeys {
    /// Seals what the client sends (and opens it at the server).
    pub client_to_server: [u8; 32],
    /// Seals what the server sends (and opens it at the client).
    pub server_to_client: [u8; 32],
}

impl SessionKeys {
    /// Keys for the test path ([`crate::EndpointConfig::test_session_secret`]): derived from a
    /// secret both endpoints hold and the handshake's client connection id and nonce. Not for
    /// production: the cid and nonce travel in clear, so the secret alone yields every
    /// session's keys.
    pub fn derive_for_test(secret: &[u8; 32], client_cid: ConnectionId, nonce: u64) -> Self {
        let key = |label: &[u8; 4]| {
            let mut msg = [0u8; 4 + 8 + 8];
            msg[..4].copy_from_slice(label);
            msg[4..12].copy_from_slice(&client_cid.0.to_be_bytes());
            msg[12..].copy_from_slice(&nonce.to_be_bytes());
            *blake3::keyed_hash(secret, &msg).as_bytes()
        };
        SessionKeys {
            client_to_server: key(b"c->s"),
            server_to_client: key(b"s->c"),
        }
    }
}

impl fmt::Debug for SessionKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SessionKeys { .. }")
    }
}
