//! The secrets that protect one session's packets.

use std::fmt;
use std::sync::OnceLock;

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

/// A `blake3::derive_key` context hashed once per process: `derive_key` hashes its context
/// string again for every key, a full compression of the few a short key takes, and sessions
/// derive several keys each.
pub(crate) struct KeyContext {
    context: &'static str,
    hasher: OnceLock<blake3::Hasher>,
}

impl KeyContext {
    /// The context `context` (a hard-coded, globally unique string, as blake3 asks).
    pub(crate) const fn new(context: &'static str) -> Self {
        KeyContext {
            context,
            hasher: OnceLock::new(),
        }
    }

    /// `blake3::derive_key(context, material)`.
    pub(crate) fn derive(&self, material: &[u8]) -> [u8; 32] {
        let mut h = self
            .hasher
            .get_or_init(|| blake3::Hasher::new_derive_key(self.context))
            .clone();
        h.update(material);
        *h.finalize().as_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::KeyContext;

    #[test]
    fn a_key_context_derives_what_blake3_derive_key_does() {
        static CONTEXT: KeyContext = KeyContext::new("ricochet test context");
        for len in [0usize, 1, 32, 41, 64, 65, 1024, 1025] {
            let material: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
            // Twice: the first call makes the cached hasher, the second clones it.
            for _ in 0..2 {
                assert_eq!(
                    CONTEXT.derive(&material),
                    blake3::derive_key("ricochet test context", &material),
                    "{len} bytes of material"
                );
            }
        }
    }
}
