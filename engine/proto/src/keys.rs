//! The secrets that protect one session's packets.

use std::fmt;
use std::sync::OnceLock;

use crate::wire::ConnectionId;

/// One key per direction for a session's packet protection, handed out by the game's backend in
/// the connect token: the client learns them from the token's public part, the server from its
/// sealed part. A token's keys are not used as they are: each session binds them to itself
/// (both connection ids and the server random of its sealed accept) before any packet is
/// sealed, since one token can make several sessions. Never printed: `Debug` shows only that
/// keys are present.
#[derive(Clone, PartialEq, Eq)]
pub struct SessionKeys {
    /// Seals what the client sends (and opens it at the server).
    pub client_to_server: [u8; 32],
    /// Seals what the server sends (and opens it at the client).
    pub server_to_client: [u8; 32],
}

impl Drop for SessionKeys {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.client_to_server);
        zeroize::Zeroize::zeroize(&mut self.server_to_client);
    }
}

impl SessionKeys {
    /// Keys for the test path (`EndpointConfig::test_session_secret`): derived from a secret
    /// both endpoints hold and the handshake's client connection id and nonce. Not for
    /// production: the cid and nonce travel in clear, so the secret alone yields every
    /// session's keys. With the `test-util` feature only.
    #[cfg(feature = "test-util")]
    pub fn derive_for_test(secret: &[u8; 32], client_cid: ConnectionId, nonce: u64) -> Self {
        Self::test_path(secret, client_cid, nonce)
    }

    /// What `derive_for_test` derives, for the endpoint's test path (whose secret only the
    /// `test-util` feature lets an embedder set).
    pub(crate) fn test_path(secret: &[u8; 32], client_cid: ConnectionId, nonce: u64) -> Self {
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

impl SessionKeys {
    /// The packet secrets of one session made with these keys: each direction's key bound, with
    /// BLAKE3's key derivation, to what makes the session unique, which both sides know once
    /// the handshake is done: the client's and the server's connection ids and
    /// `server_random`, the 24 random bytes the server chose for this session (the nonce of
    /// its sealed accept, which authenticates them). A connect token's keys can make several
    /// sessions (at each server it lists, again after a server restart, again after a client
    /// fell back to the next server); the packet keys and IVs of each are their own, so no two
    /// of them ever seal under the same key and nonce, and what one seals opens in no other.
    pub(crate) fn for_session(
        &self,
        client_cid: ConnectionId,
        server_cid: ConnectionId,
        server_random: &[u8; SERVER_RANDOM_LEN],
    ) -> Self {
        static CONTEXT: KeyContext = KeyContext::new("ricochet 2026 session packet secret");
        let bind = |direction: u8, key: &[u8; 32]| {
            let mut material = [0u8; 1 + 32 + 8 + 8 + SERVER_RANDOM_LEN];
            material[0] = direction;
            material[1..33].copy_from_slice(key);
            material[33..41].copy_from_slice(&client_cid.0.to_be_bytes());
            material[41..49].copy_from_slice(&server_cid.0.to_be_bytes());
            material[49..].copy_from_slice(server_random);
            let secret = CONTEXT.derive(&material);
            zeroize::Zeroize::zeroize(&mut material);
            secret
        };
        SessionKeys {
            client_to_server: bind(0, &self.client_to_server),
            server_to_client: bind(1, &self.server_to_client),
        }
    }
}

/// Bytes of the server's random value for one session (see [`SessionKeys::for_session`]): the
/// nonce of its sealed accept.
pub(crate) const SERVER_RANDOM_LEN: usize = crate::token::NONCE_LEN;

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

/// Bits of a connection id that [`IdKey::seal`] fills: all but the slot field (low 20) and the
/// router's 9 bits (32..=40).
pub(crate) const SEALED_ID_BITS: u32 = 35;

/// The per-endpoint key that turns a slot's use count into the 35 bits of its connection id
/// outside the slot field and the router's bits: a keyed permutation of the count, so a
/// slot's ids never repeat while its count does not (2^32 uses), a later id cannot be told
/// from earlier ones, and the ids of two boots (two random keys) are independent.
///
/// The permutation is a 10-round Feistel network over 35 bits (halves of 17 and 18 bits,
/// alternating as in NIST SP 800-38G's FF1) whose round function is keyed BLAKE3 over the
/// round, the slot (a tweak: each slot has a permutation of its own) and the half. It is only
/// ever computed forwards, once per connection an endpoint opens: nothing needs to invert it.
#[derive(Clone)]
pub(crate) struct IdKey([u8; 32]);

impl Drop for IdKey {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.0);
    }
}

impl fmt::Debug for IdKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("IdKey { .. }")
    }
}

impl IdKey {
    /// A key from 32 random bytes (the endpoint's random source).
    pub(crate) fn new(key: [u8; 32]) -> Self {
        IdKey(key)
    }

    /// The 35 sealed bits of the id of use `count` of slot `slot`.
    pub(crate) fn seal(&self, slot: u32, count: u32) -> u64 {
        const LEFT: u32 = 17;
        const RIGHT: u32 = SEALED_ID_BITS - LEFT;
        let (mut a, mut b) = (
            u64::from(count) >> RIGHT,
            u64::from(count) & ((1 << RIGHT) - 1),
        );
        for round in 0..10u8 {
            // `a` holds LEFT bits in even rounds and RIGHT bits in odd ones.
            let width = if round % 2 == 0 { LEFT } else { RIGHT };
            let mut msg = [0u8; 1 + 4 + 8];
            msg[0] = round;
            msg[1..5].copy_from_slice(&slot.to_be_bytes());
            msg[5..].copy_from_slice(&b.to_be_bytes());
            let h = blake3::keyed_hash(&self.0, &msg);
            let mut f = [0u8; 8];
            f.copy_from_slice(&h.as_bytes()[..8]);
            let c = (a ^ u64::from_be_bytes(f)) & ((1 << width) - 1);
            a = b;
            b = c;
        }
        (a << RIGHT) | b
    }
}

#[cfg(test)]
mod tests {
    use super::{IdKey, KeyContext, SessionKeys, SEALED_ID_BITS};
    use crate::wire::ConnectionId;

    #[test]
    fn every_input_of_a_session_changes_both_directions_keys() {
        let keys = SessionKeys {
            client_to_server: [1; 32],
            server_to_client: [2; 32],
        };
        let (c, s, r) = (
            ConnectionId(5),
            ConnectionId(6),
            [7u8; super::SERVER_RANDOM_LEN],
        );
        let base = keys.for_session(c, s, &r);
        assert_eq!(base, keys.for_session(c, s, &r), "deterministic");
        assert_ne!(base.client_to_server, keys.client_to_server);
        assert_ne!(base.server_to_client, keys.server_to_client);
        let mut other_random = r;
        other_random[23] ^= 1;
        let other_direction_keys = SessionKeys {
            client_to_server: [2; 32],
            server_to_client: [1; 32],
        };
        for (name, other) in [
            ("client cid", keys.for_session(ConnectionId(4), s, &r)),
            ("server cid", keys.for_session(c, ConnectionId(4), &r)),
            ("server random", keys.for_session(c, s, &other_random)),
        ] {
            assert_ne!(other.client_to_server, base.client_to_server, "{name}");
            assert_ne!(other.server_to_client, base.server_to_client, "{name}");
        }
        // Swapped session keys do not give swapped packet secrets: the direction is bound too.
        let swapped = other_direction_keys.for_session(c, s, &r);
        assert_ne!(swapped.client_to_server, base.server_to_client);
        assert_ne!(swapped.server_to_client, base.client_to_server);
    }

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

    #[test]
    fn a_slots_sealed_ids_never_repeat_and_differ_by_key_and_slot() {
        let key = IdKey::new([3; 32]);
        let mut seen = std::collections::HashSet::new();
        for count in 0..1u32 << 16 {
            let v = key.seal(0, count);
            assert!(v < 1 << SEALED_ID_BITS);
            assert!(seen.insert(v), "use {count} repeats an earlier id");
        }
        // Counts far apart (the high half of the input) stay distinct too.
        for count in (0..u32::MAX).step_by(1 << 20) {
            let v = key.seal(0, count | 1 << 16);
            assert!(seen.insert(v), "use {count} repeats an earlier id");
        }
        // Another boot (key) or slot: a permutation of its own.
        let other = IdKey::new([4; 32]);
        let same = (0..1000u32)
            .filter(|&c| other.seal(0, c) == key.seal(0, c) || key.seal(1, c) == key.seal(0, c))
            .count();
        assert!(
            same <= 1,
            "{same} of 1,000 ids equal under another key or slot"
        );
    }
}
