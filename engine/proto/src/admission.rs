//! Who a server lets in: connect-token admission or the explicit insecure mode, the table of
//! used tokens, what the application sees of a client before it exists (and how it refuses),
//! the keys that authenticate the handshake, and stateless reset tokens.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fmt;
use std::net::SocketAddr;

use bytes::Bytes;

use super::keys::KeyContext;
use super::{CloseReason, ConnectionId, SessionKeys};
use crate::token::{TokenKey, NONCE_LEN, TAG_LEN};
use crate::wire::{
    self, COOKIE_LEN, HANDSHAKE_TAG_LEN, MAX_REFUSE_MESSAGE, SEALED_ACCEPT_BODY_LEN,
};
use crate::xchacha;

/// How a server admits clients.
#[derive(Debug, Clone)]
pub enum Admission {
    /// Only clients with a [connect token](crate::token) sealed with the backend's key get in;
    /// the session's keys come from the token. The production mode.
    Tokens(TokenAdmission),
    /// Anyone who proves their address gets in, and nothing authenticates the session's
    /// packets. For LAN play and local tests only: an attacker who sees the traffic can close,
    /// hijack or inject into any session.
    Insecure,
}

impl Admission {
    /// True for [`Admission::Insecure`].
    pub fn is_insecure(&self) -> bool {
        matches!(self, Admission::Insecure)
    }
}

/// Settings of token admission.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TokenAdmission {
    /// The key the backend seals tokens with.
    pub key: TokenKey,
    /// The game's protocol id: tokens for another id are refused.
    pub protocol_id: u64,
    /// The addresses clients reach this server at (as the backend lists them in tokens): a
    /// token is accepted only if it lists one of them. The first also seeds the server's
    /// stateless reset key, so keep it stable across restarts.
    pub public_addresses: Vec<SocketAddr>,
    /// Most used tokens remembered (each is refused a second time until it expires; at least
    /// one). Size it for the peak handshakes per second times the token lifetime the backend
    /// issues: when the table is full of unexpired tokens, a new token takes the place of the
    /// one that expires soonest, which is then no longer refused a second time, and
    /// [`EndpointStats::tokens_evicted`](crate::EndpointStats::tokens_evicted) counts it.
    /// About 90 bytes each (6 MB for the default 65,536).
    pub used_token_capacity: usize,
    /// Stateless resets sent per second at most (the rest are not sent; the client then
    /// learns of the lost session from its idle timeout).
    pub max_resets_per_second: u32,
}

impl TokenAdmission {
    /// Token admission with `key` for `protocol_id` at `public_addresses`; 65,536 used tokens
    /// remembered, 4,096 resets per second.
    pub fn new(key: TokenKey, protocol_id: u64, public_addresses: Vec<SocketAddr>) -> Self {
        TokenAdmission {
            key,
            protocol_id,
            public_addresses,
            used_token_capacity: 65_536,
            max_resets_per_second: 4_096,
        }
    }
}

/// Who is connecting, as the server application sees them before and after the session
/// exists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// The client's address when the handshake completed.
    pub address: SocketAddr,
    /// The player's identity from the token (`None` in insecure mode).
    pub client_id: Option<u64>,
    /// The token's user data (empty in insecure mode).
    pub user_data: Bytes,
}

/// The server application's refusal of a client: a code (0..=127) and an optional message of
/// at most [`MAX_REFUSE_MESSAGE`] bytes (longer ones are cut), both delivered to the client
/// as [`CloseReason::Rejected`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The application's reason code; only the low 7 bits travel.
    pub code: u8,
    /// A short message for the player (UTF-8 by convention).
    pub message: Bytes,
}

impl Refusal {
    /// A refusal with `code` and `message`.
    pub fn new(code: u8, message: impl Into<Bytes>) -> Self {
        Refusal {
            code,
            message: message.into(),
        }
    }

    pub(crate) fn reason(&self) -> CloseReason {
        CloseReason::Rejected(self.code & 0x7f)
    }

    pub(crate) fn wire_message(&self) -> &[u8] {
        &self.message[..self.message.len().min(MAX_REFUSE_MESSAGE)]
    }
}

/// Why a [`TokenLedger`] did not record a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LedgerRefusal {
    /// The token was used before, by another client, and has not expired.
    Used,
    /// The same client (same claimant) recorded the token before: a copy of its own
    /// handshake, not a second use.
    Duplicate,
    /// No room: the table is full of unexpired tokens. The client is refused with
    /// [`CloseReason::ServerFull`]. [`UsedTokens`] never answers this (it makes room); a
    /// ledger of the embedder's may.
    Full,
}

/// How a [`TokenLedger`] recorded a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Recorded {
    /// In free room.
    Added,
    /// In place of an unexpired token, forgotten before its expiry to make room (its second
    /// use is no longer refused): the table was full.
    Evicted,
}

/// The tokens a server has accepted, so that each is accepted once.
///
/// An endpoint keeps its own [`UsedTokens`]; servers that run several endpoints for one
/// address (one per worker) share one table between them, since a client may reach any of
/// them ([`Endpoint::set_token_ledger`](crate::Endpoint::set_token_ledger)).
///
/// A use is recorded with its claimant, a fingerprint of the client's address and connection id
/// that the endpoint computes: a copy of a client's own handshake (duplicated on the path, or
/// handled by another worker after its echo was admitted) is then told apart from a second use.
///
/// An endpoint consults it once per cookie echo that passed every other check, just before
/// the echo opens a session: never for a hello, which anyone who saw one can replay.
pub trait TokenLedger: Send + fmt::Debug {
    /// Record `tag` (a token expiring at `expires_unix`) as used now by `claimant`, unless it
    /// already is (or there is no room, for a ledger that refuses rather than evicts).
    fn record(
        &mut self,
        tag: &[u8; TAG_LEN],
        expires_unix: u64,
        now_unix: u64,
        claimant: u64,
    ) -> Result<Recorded, LedgerRefusal>;
}

/// A bounded table of used tokens: each entry leaves when its token expires, or, when the
/// table is full, when a new token needs its place and it expires no later than every other.
///
/// Evicting rather than refusing is a choice between two failures of a table too small for
/// the handshake rate: refusing would lock every new player out of the server until old tokens
/// expire (up to a token lifetime), while evicting lets only the soonest-expiring token be
/// used a second time, within what is left of its life. Only a genuine handshake (valid
/// token, proven address, proven keys) adds an entry: forcing evictions takes a fresh token
/// from the backend per entry, so the backend's issuing rate, not this table, is the limit.
#[derive(Debug)]
pub struct UsedTokens {
    capacity: usize,
    /// Per token: its expiry and who used it.
    expiry: HashMap<[u8; TAG_LEN], (u64, u64)>,
    by_expiry: BinaryHeap<Reverse<(u64, [u8; TAG_LEN])>>,
}

impl UsedTokens {
    /// An empty table for at most `capacity` tokens (at least one).
    pub fn new(capacity: usize) -> Self {
        UsedTokens {
            capacity: capacity.max(1),
            expiry: HashMap::new(),
            by_expiry: BinaryHeap::new(),
        }
    }

    /// Tokens remembered now.
    pub fn len(&self) -> usize {
        self.expiry.len()
    }

    /// True when no token is remembered.
    pub fn is_empty(&self) -> bool {
        self.expiry.is_empty()
    }

    fn purge(&mut self, now_unix: u64) {
        while let Some(Reverse((t, tag))) = self.by_expiry.peek().copied() {
            if t > now_unix {
                break;
            }
            self.by_expiry.pop();
            self.expiry.remove(&tag);
        }
    }
}

#[cfg(test)]
impl UsedTokens {
    /// The claimant that recorded `tag`, if it was recorded and has not expired.
    fn used_by(&mut self, tag: &[u8; TAG_LEN], now_unix: u64) -> Option<u64> {
        self.expiry
            .get(tag)
            .and_then(|&(t, claimant)| (t > now_unix).then_some(claimant))
    }
}

impl TokenLedger for UsedTokens {
    fn record(
        &mut self,
        tag: &[u8; TAG_LEN],
        expires_unix: u64,
        now_unix: u64,
        claimant: u64,
    ) -> Result<Recorded, LedgerRefusal> {
        self.purge(now_unix);
        if let Some(&(_, by)) = self.expiry.get(tag) {
            return Err(if by == claimant {
                LedgerRefusal::Duplicate
            } else {
                LedgerRefusal::Used
            });
        }
        let mut recorded = Recorded::Added;
        if self.expiry.len() >= self.capacity {
            // Full of unexpired tokens (purged above): the soonest to expire gives way.
            if let Some(Reverse((_, old))) = self.by_expiry.pop() {
                self.expiry.remove(&old);
                recorded = Recorded::Evicted;
            }
        }
        self.expiry.insert(*tag, (expires_unix, claimant));
        self.by_expiry.push(Reverse((expires_unix, *tag)));
        Ok(recorded)
    }
}

fn mac(key: &[u8; 32], parts: &[&[u8]]) -> [u8; HANDSHAKE_TAG_LEN] {
    let mut h = blake3::Hasher::new_keyed(key);
    for p in parts {
        h.update(p);
    }
    let mut out = [0u8; HANDSHAKE_TAG_LEN];
    out.copy_from_slice(&h.finalize().as_bytes()[..HANDSHAKE_TAG_LEN]);
    out
}

pub(crate) fn tags_equal(a: &[u8; HANDSHAKE_TAG_LEN], b: &[u8; HANDSHAKE_TAG_LEN]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The handshake's keys, derived from the session keys so that they never seal a packet the
/// session keys seal (separate domains, no shared nonces).
#[derive(Clone)]
pub(crate) struct HandshakeKeys {
    /// Client proof in hello and echo (from the client-to-server key).
    proof: [u8; 32],
    /// Tags of the challenge and of refusals (from the server-to-client key).
    server: [u8; 32],
    /// Seals the accept (from the server-to-client key).
    accept: [u8; 32],
}

impl Drop for HandshakeKeys {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.proof);
        zeroize::Zeroize::zeroize(&mut self.server);
        zeroize::Zeroize::zeroize(&mut self.accept);
    }
}

impl fmt::Debug for HandshakeKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("HandshakeKeys { .. }")
    }
}

impl HandshakeKeys {
    pub(crate) fn new(keys: &SessionKeys) -> Self {
        static PROOF: KeyContext = KeyContext::new("ricochet 2026 handshake client proof");
        static SERVER: KeyContext = KeyContext::new("ricochet 2026 handshake server tag");
        static ACCEPT: KeyContext = KeyContext::new("ricochet 2026 handshake accept seal");
        HandshakeKeys {
            proof: PROOF.derive(&keys.client_to_server),
            server: SERVER.derive(&keys.server_to_client),
            accept: ACCEPT.derive(&keys.server_to_client),
        }
    }

    /// The client's proof in a hello (`timestamp` 0, `cookie` zero) or cookie echo.
    pub(crate) fn proof(
        &self,
        ty: wire::PacketType,
        client_cid: ConnectionId,
        nonce: u64,
        timestamp: u64,
        cookie: &[u8; COOKIE_LEN],
        token_tag: &[u8; TAG_LEN],
    ) -> [u8; HANDSHAKE_TAG_LEN] {
        mac(
            &self.proof,
            &[
                &[ty as u8],
                &client_cid.0.to_be_bytes(),
                &nonce.to_be_bytes(),
                &timestamp.to_be_bytes(),
                cookie,
                token_tag,
            ],
        )
    }

    /// The tag of a challenge.
    pub(crate) fn challenge_tag(
        &self,
        client_cid: ConnectionId,
        nonce: u64,
        timestamp: u64,
        cookie: &[u8; COOKIE_LEN],
    ) -> [u8; HANDSHAKE_TAG_LEN] {
        mac(
            &self.server,
            &[
                &[wire::PacketType::ServerChallenge as u8],
                &client_cid.0.to_be_bytes(),
                &nonce.to_be_bytes(),
                &timestamp.to_be_bytes(),
                cookie,
            ],
        )
    }

    /// The tag of a refusal of the handshake with client nonce `nonce`.
    pub(crate) fn refuse_tag(
        &self,
        client_cid: ConnectionId,
        nonce: u64,
        reason: CloseReason,
        message: &[u8],
    ) -> [u8; HANDSHAKE_TAG_LEN] {
        mac(
            &self.server,
            &[
                &[wire::PacketType::Refuse as u8, reason.to_u8()],
                &client_cid.0.to_be_bytes(),
                &nonce.to_be_bytes(),
                &[message.len() as u8],
                message,
            ],
        )
    }

    /// Seal the server cid and reset token for the client of `client_cid` (nonce: random,
    /// from the caller).
    pub(crate) fn seal_accept(
        &self,
        nonce: &[u8; NONCE_LEN],
        client_cid: ConnectionId,
        server_cid: ConnectionId,
        reset_token: &[u8; HANDSHAKE_TAG_LEN],
    ) -> [u8; SEALED_ACCEPT_BODY_LEN] {
        let mut out = [0u8; SEALED_ACCEPT_BODY_LEN];
        out[..8].copy_from_slice(&server_cid.0.to_be_bytes());
        out[8..24].copy_from_slice(reset_token);
        let ad = accept_ad(client_cid);
        let (body, tag_out) = out.split_at_mut(24);
        tag_out.copy_from_slice(&xchacha::seal(&self.accept, nonce, &ad, body));
        out
    }

    /// Open a sealed accept: the server cid and the session's reset token.
    pub(crate) fn open_accept(
        &self,
        nonce: &[u8; NONCE_LEN],
        client_cid: ConnectionId,
        sealed: &[u8; SEALED_ACCEPT_BODY_LEN],
    ) -> Option<(ConnectionId, [u8; HANDSHAKE_TAG_LEN])> {
        let mut body = [0u8; 24];
        body.copy_from_slice(&sealed[..24]);
        let ad = accept_ad(client_cid);
        let mut tag = [0u8; xchacha::TAG_LEN];
        tag.copy_from_slice(&sealed[24..]);
        if !xchacha::open(&self.accept, nonce, &ad, &mut body, &tag) {
            return None;
        }
        let mut cid = [0u8; 8];
        cid.copy_from_slice(&body[..8]);
        let mut reset = [0u8; HANDSHAKE_TAG_LEN];
        reset.copy_from_slice(&body[8..24]);
        Some((ConnectionId(u64::from_be_bytes(cid)), reset))
    }
}

fn accept_ad(client_cid: ConnectionId) -> [u8; 10] {
    let mut ad = [0u8; 10];
    ad[0] = wire::PacketType::SealedAccept as u8;
    ad[1] = wire::VERSION;
    ad[2..].copy_from_slice(&client_cid.0.to_be_bytes());
    ad
}

/// A server's stateless reset key: derived from the backend's key and the server's first
/// public address, so a restarted server computes the same key (and so the same reset token
/// for every connection id it issued before), while other servers of the same backend
/// compute other keys. A reset token is a function of the id alone (RFC 9000 §10.3.2's
/// static key), which is safe because a server's ids do not repeat, across its restarts
/// either (see the endpoint's `ConnectionHandle`).
#[derive(Clone)]
pub(crate) struct ResetKey([u8; 32]);

impl Drop for ResetKey {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.0);
    }
}

impl fmt::Debug for ResetKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ResetKey { .. }")
    }
}

impl ResetKey {
    pub(crate) fn new(key: &TokenKey, public_address: SocketAddr) -> Self {
        let mut h = blake3::Hasher::new_derive_key("ricochet 2026 stateless reset key");
        h.update(key.as_bytes());
        h.update(public_address.to_string().as_bytes());
        ResetKey(*h.finalize().as_bytes())
    }

    /// The reset token of the session whose server connection id is `cid`.
    pub(crate) fn token(&self, cid: ConnectionId) -> [u8; HANDSHAKE_TAG_LEN] {
        mac(&self.0, &[b"reset", &cid.0.to_be_bytes()])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn used_tokens_refuse_a_second_use_until_expiry_and_stay_bounded() {
        let mut t = UsedTokens::new(2);
        assert_eq!(t.record(&[1; 16], 100, 10, 7), Ok(Recorded::Added));
        assert_eq!(t.used_by(&[1; 16], 10), Some(7));
        assert_eq!(t.record(&[1; 16], 100, 11, 8), Err(LedgerRefusal::Used));
        assert_eq!(
            t.record(&[1; 16], 100, 11, 7),
            Err(LedgerRefusal::Duplicate)
        );
        assert_eq!(t.record(&[2; 16], 50, 11, 7), Ok(Recorded::Added));
        // Token 2 expires at 50: its entry leaves and makes room.
        assert_eq!(t.record(&[3; 16], 100, 50, 7), Ok(Recorded::Added));
        assert_eq!(t.len(), 2);
        assert_eq!(t.used_by(&[2; 16], 50), None);
        // Once expired, a token is forgotten (the server refuses it as expired anyway).
        assert_eq!(t.used_by(&[1; 16], 100), None);
        assert_eq!(t.record(&[4; 16], 200, 100, 7), Ok(Recorded::Added));
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn a_full_table_forgets_the_token_that_expires_soonest() {
        let mut t = UsedTokens::new(3);
        assert_eq!(t.record(&[1; 16], 300, 10, 7), Ok(Recorded::Added));
        assert_eq!(t.record(&[2; 16], 100, 10, 7), Ok(Recorded::Added));
        assert_eq!(t.record(&[3; 16], 200, 10, 7), Ok(Recorded::Added));
        // Full of unexpired tokens: the new one takes the place of token 2 (expiry 100), not of
        // the oldest entry (token 1).
        assert_eq!(t.record(&[4; 16], 400, 11, 8), Ok(Recorded::Evicted));
        assert_eq!(t.len(), 3);
        assert_eq!(t.used_by(&[2; 16], 11), None);
        assert_eq!(t.record(&[1; 16], 300, 11, 9), Err(LedgerRefusal::Used));
        assert_eq!(t.record(&[3; 16], 200, 11, 9), Err(LedgerRefusal::Used));
        assert_eq!(t.record(&[4; 16], 400, 11, 9), Err(LedgerRefusal::Used));
        // Room again once a token expires.
        assert_eq!(t.record(&[5; 16], 400, 200, 7), Ok(Recorded::Added));
        // A table asked for no room holds one token.
        let mut one = UsedTokens::new(0);
        assert_eq!(one.record(&[1; 16], 100, 10, 7), Ok(Recorded::Added));
        assert_eq!(one.record(&[1; 16], 100, 10, 8), Err(LedgerRefusal::Used));
        assert_eq!(one.record(&[2; 16], 100, 10, 8), Ok(Recorded::Evicted));
        assert_eq!(one.len(), 1);
    }

    #[test]
    fn the_accept_opens_only_with_its_keys_and_client() {
        let keys = SessionKeys {
            client_to_server: [1; 32],
            server_to_client: [2; 32],
        };
        let hk = HandshakeKeys::new(&keys);
        let nonce = [9; NONCE_LEN];
        let sealed = hk.seal_accept(&nonce, ConnectionId(5), ConnectionId(6), &[7; 16]);
        assert_eq!(
            hk.open_accept(&nonce, ConnectionId(5), &sealed),
            Some((ConnectionId(6), [7; 16]))
        );
        assert_eq!(hk.open_accept(&nonce, ConnectionId(4), &sealed), None);
        let mut bad = sealed;
        bad[0] ^= 1;
        assert_eq!(hk.open_accept(&nonce, ConnectionId(5), &bad), None);
        let other = HandshakeKeys::new(&SessionKeys {
            client_to_server: [1; 32],
            server_to_client: [3; 32],
        });
        assert_eq!(other.open_accept(&nonce, ConnectionId(5), &sealed), None);
    }

    #[test]
    fn reset_keys_differ_by_server_and_survive_a_restart() {
        let key = TokenKey::from_bytes([4; 32]);
        let a: SocketAddr = "10.0.0.1:7777".parse().unwrap();
        let b: SocketAddr = "10.0.0.2:7777".parse().unwrap();
        let cid = ConnectionId(0x1234);
        assert_eq!(
            ResetKey::new(&key, a).token(cid),
            ResetKey::new(&key, a).token(cid)
        );
        assert_ne!(
            ResetKey::new(&key, a).token(cid),
            ResetKey::new(&key, b).token(cid)
        );
        assert_ne!(
            ResetKey::new(&key, a).token(cid),
            ResetKey::new(&key, a).token(ConnectionId(0x1235))
        );
    }
}
