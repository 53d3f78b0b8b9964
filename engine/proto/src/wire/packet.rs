//! Packets: the [`Packet`] enum (handshake and connection packets), their decoding and
//! encoding, and the clear header packet protection reads (layouts in the module docs).

use super::codec::{Reader, Writer};
use super::*;
use crate::token::{NONCE_LEN, SEALED_LEN};

/// The token section of a hello or cookie echo (see the module docs), borrowing from the
/// datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenSection<'a> {
    /// Public copy of the token's protocol id.
    pub protocol_id: u64,
    /// Public copy of the token's expiry (Unix seconds).
    pub expires_unix: u64,
    /// Nonce of the sealed part.
    pub nonce: &'a [u8; NONCE_LEN],
    /// The sealed private part.
    pub sealed: &'a [u8; SEALED_LEN],
    /// Proof that the sender holds the token's keys.
    pub proof: [u8; HANDSHAKE_TAG_LEN],
}

/// A decoded packet, borrowing from the datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Packet<'a> {
    /// Client hello.
    ClientHello {
        /// The client's connection id (servers reply to it).
        client_cid: ConnectionId,
        /// Client's random nonce.
        nonce: u64,
        /// The connect token, when the client has one.
        token: Option<TokenSection<'a>>,
    },
    /// Server challenge: echo the cookie to prove the address.
    ServerChallenge {
        /// The client's connection id.
        client_cid: ConnectionId,
        /// The nonce from the hello.
        nonce: u64,
        /// The server's token covered by the cookie: ms on its cookie clock in bits 0–47, and
        /// optionally the owner worker (see the module docs). The client echoes it unchanged.
        timestamp: u64,
        /// The cookie.
        cookie: [u8; COOKIE_LEN],
        /// With a token: a MAC under a key derived from the server-to-client key.
        tag: Option<[u8; HANDSHAKE_TAG_LEN]>,
    },
    /// Client hello echoing a cookie.
    ClientCookieEcho {
        /// The client's connection id.
        client_cid: ConnectionId,
        /// The nonce from the hello.
        nonce: u64,
        /// Timestamp from the challenge.
        timestamp: u64,
        /// Cookie from the challenge.
        cookie: [u8; COOKIE_LEN],
        /// The connect token again, when the client has one.
        token: Option<TokenSection<'a>>,
    },
    /// Server accept of a handshake without a token.
    ServerAccept {
        /// The client's connection id.
        client_cid: ConnectionId,
        /// The server's connection id (the client writes it in every later packet).
        server_cid: ConnectionId,
    },
    /// Server accept with a token: the server cid and the session's stateless reset token,
    /// sealed with a key derived from the server-to-client key.
    SealedAccept {
        /// The client's connection id.
        client_cid: ConnectionId,
        /// The seal's random nonce, fresh for each session: also the server random the
        /// session's packet keys are bound to (the tag authenticates it).
        nonce: &'a [u8; NONCE_LEN],
        /// Ciphertext and tag.
        sealed: &'a [u8; SEALED_ACCEPT_BODY_LEN],
    },
    /// Server refuses the handshake.
    Refuse {
        /// The client's connection id.
        client_cid: ConnectionId,
        /// Why.
        reason: CloseReason,
        /// The application's message ([`CloseReason::Rejected`]), at most
        /// [`MAX_REFUSE_MESSAGE`] bytes; empty otherwise.
        message: &'a [u8],
        /// With a token the server opened: a MAC under a key derived from the
        /// server-to-client key.
        tag: Option<[u8; HANDSHAKE_TAG_LEN]>,
    },
    /// A server without state for `cid` answers a packet sent to it.
    StatelessReset {
        /// The connection id the triggering packet was sent to (the server's id of the
        /// session).
        cid: ConnectionId,
        /// The session's reset token: only the server that issued the id can compute it.
        token: [u8; HANDSHAKE_TAG_LEN],
    },
    /// Data packet.
    Data {
        /// The receiver's connection id.
        dst_cid: ConnectionId,
        /// Packet number (never reused within a connection).
        packet_number: u64,
        /// The frames, decode with [`frames`].
        payload: &'a [u8],
    },
    /// FEC data shard, opaque to this layer.
    FecData {
        /// The receiver's connection id.
        dst_cid: ConnectionId,
        /// Body (layout owned by `fec`).
        body: &'a [u8],
    },
    /// FEC parity shard, opaque to this layer.
    FecParity {
        /// The receiver's connection id.
        dst_cid: ConnectionId,
        /// The sender's parity counter (the packet-protection nonce of this packet).
        number: u64,
        /// Body (layout owned by `fec`).
        body: &'a [u8],
    },
}

/// Read the destination connection id of a connection packet (`Data`, `FecData`, `FecParity`)
/// or the client cid of a server handshake reply, without decoding the rest.
pub fn peek_cid(datagram: &[u8]) -> Option<ConnectionId> {
    let b = datagram.get(CID_OFFSET..CID_OFFSET + 8)?;
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    Some(ConnectionId(u64::from_be_bytes(a)))
}

/// Decode one datagram's packet header (frames are decoded separately with [`frames`]).
///
/// A version other than [`VERSION`] yields [`WireError::VersionMismatch`].
pub fn decode_packet(datagram: &[u8]) -> Result<Packet<'_>, WireError> {
    let mut r = Reader::new(datagram);
    let ty = PacketType::from_u8(r.u8()?)?;
    let version = r.u8()?;
    if version != VERSION {
        return Err(WireError::VersionMismatch(version));
    }
    let cid = ConnectionId(r.u64()?);
    let cookie = |r: &mut Reader<'_>| -> Result<[u8; COOKIE_LEN], WireError> {
        let mut c = [0u8; COOKIE_LEN];
        c.copy_from_slice(r.bytes(COOKIE_LEN)?);
        Ok(c)
    };
    Ok(match ty {
        PacketType::ClientHello => {
            let nonce = r.u64()?;
            let token = token_section(&mut r, datagram.len())?;
            Packet::ClientHello {
                client_cid: cid,
                nonce,
                token,
            }
        }
        PacketType::ServerChallenge => Packet::ServerChallenge {
            client_cid: cid,
            nonce: r.u64()?,
            timestamp: r.u64()?,
            cookie: cookie(&mut r)?,
            tag: optional_tag(&mut r)?,
        },
        PacketType::ClientCookieEcho => {
            let nonce = r.u64()?;
            let timestamp = r.u64()?;
            let cookie = cookie(&mut r)?;
            let token = token_section(&mut r, datagram.len())?;
            Packet::ClientCookieEcho {
                client_cid: cid,
                nonce,
                timestamp,
                cookie,
                token,
            }
        }
        PacketType::ServerAccept => Packet::ServerAccept {
            client_cid: cid,
            server_cid: ConnectionId(r.u64()?),
        },
        PacketType::SealedAccept => Packet::SealedAccept {
            client_cid: cid,
            nonce: array(r.bytes(NONCE_LEN)?)?,
            sealed: array(r.bytes(SEALED_ACCEPT_BODY_LEN)?)?,
        },
        PacketType::Refuse => {
            let reason = CloseReason::from_u8(r.u8()?);
            let flags = r.u8()?;
            if flags > 1 {
                return Err(WireError::BadLength);
            }
            let len = usize::from(r.u8()?);
            if len > MAX_REFUSE_MESSAGE {
                return Err(WireError::BadLength);
            }
            let message = r.bytes(len)?;
            let tag = if flags & 1 == 1 {
                Some(tag_of(&mut r)?)
            } else {
                None
            };
            Packet::Refuse {
                client_cid: cid,
                reason,
                message,
                tag,
            }
        }
        PacketType::StatelessReset => Packet::StatelessReset {
            cid,
            token: tag_of(&mut r)?,
        },
        PacketType::Data => Packet::Data {
            dst_cid: cid,
            packet_number: r.u64()?,
            payload: r.rest(),
        },
        PacketType::FecData => Packet::FecData {
            dst_cid: cid,
            body: r.rest(),
        },
        PacketType::FecParity => Packet::FecParity {
            dst_cid: cid,
            number: r.u64()?,
            body: r.rest(),
        },
    })
}

pub(super) fn array<const N: usize>(b: &[u8]) -> Result<&[u8; N], WireError> {
    b.try_into().map_err(|_| WireError::Truncated)
}

pub(super) fn tag_of(r: &mut Reader<'_>) -> Result<[u8; HANDSHAKE_TAG_LEN], WireError> {
    Ok(*array(r.bytes(HANDSHAKE_TAG_LEN)?)?)
}

/// A tag when the packet has one more tag's worth of bytes (trailing bytes beyond are ignored,
/// as after every fixed-size packet).
pub(super) fn optional_tag(
    r: &mut Reader<'_>,
) -> Result<Option<[u8; HANDSHAKE_TAG_LEN]>, WireError> {
    if r.remaining() >= HANDSHAKE_TAG_LEN {
        Ok(Some(tag_of(r)?))
    } else {
        Ok(None)
    }
}

/// The mode byte of a hello or echo and what follows it: a token section, or padding (the
/// datagram must then be at least [`MIN_CLIENT_HELLO_LEN`] long).
pub(super) fn token_section<'a>(
    r: &mut Reader<'a>,
    total: usize,
) -> Result<Option<TokenSection<'a>>, WireError> {
    if total < MIN_CLIENT_HELLO_LEN {
        return Err(WireError::Unpadded);
    }
    match r.u8()? {
        MODE_INSECURE => Ok(None),
        MODE_TOKEN => Ok(Some(TokenSection {
            protocol_id: r.u64()?,
            expires_unix: r.u64()?,
            nonce: array(r.bytes(NONCE_LEN)?)?,
            sealed: array(r.bytes(SEALED_LEN)?)?,
            proof: tag_of(r)?,
        })),
        m => Err(WireError::UnknownMode(m)),
    }
}

/// The clear header of a connection packet (`Data`, `FecData`, `FecParity`): what packet
/// protection authenticates without encrypting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClearHeader {
    /// `Data`, `FecData` or `FecParity`.
    pub ty: PacketType,
    /// The receiver's connection id.
    pub dst_cid: ConnectionId,
    /// The packet number (`Data`, `FecData`) or parity number (`FecParity`): the nonce.
    pub number: u64,
    /// Bytes of clear header: 18 (`Data`, `FecParity`) or [`FEC_DATA_CLEAR_LEN`] (`FecData`).
    pub len: usize,
}

/// Reads the clear header of a connection packet without touching the rest (which may be
/// sealed). Handshake packets are [`WireError::UnknownPacketType`] here.
pub fn clear_header(datagram: &[u8]) -> Result<ClearHeader, WireError> {
    let mut r = Reader::new(datagram);
    let b = r.u8()?;
    let ty = PacketType::from_u8(b)?;
    let version = r.u8()?;
    if version != VERSION {
        return Err(WireError::VersionMismatch(version));
    }
    let dst_cid = ConnectionId(r.u64()?);
    let len = match ty {
        PacketType::Data | PacketType::FecParity => DATA_HEADER_LEN,
        PacketType::FecData => {
            r.bytes(crate::fec::DATA_HEADER_LEN)?;
            FEC_DATA_CLEAR_LEN
        }
        _ => return Err(WireError::UnknownPacketType(b)),
    };
    Ok(ClearHeader {
        ty,
        dst_cid,
        number: r.u64()?,
        len,
    })
}

/// Splits an ARQ datagram taken from its packet number on (what follows the part every
/// connection packet shares: a `Data` packet's, or one FEC delivered) into its packet number
/// and its frames. `None` when it is too short for a packet number.
pub(crate) fn split_packet_number(arq: &[u8]) -> Option<(u64, &[u8])> {
    let (pn, frames) = arq.split_first_chunk::<8>()?;
    Some((u64::from_be_bytes(*pn), frames))
}

/// Read the version byte of a datagram whose type is a client hello, if present: used to answer
/// a hello from another version with a refuse.
pub fn hello_version(datagram: &[u8]) -> Option<u8> {
    match datagram.first() {
        Some(&t)
            if t == PacketType::ClientHello as u8 || t == PacketType::ClientCookieEcho as u8 =>
        {
            datagram.get(1).copied()
        }
        _ => None,
    }
}

pub(super) fn header(
    w: &mut Writer<'_>,
    ty: PacketType,
    cid: ConnectionId,
) -> Result<(), WireError> {
    w.u8(ty as u8)?;
    w.u8(VERSION)?;
    w.u64(cid.0)
}

/// Encode a handshake or FEC packet completely (for `Data`, use [`encode_data_header`] and then
/// frames). Returns the bytes written.
pub fn encode_packet(p: &Packet<'_>, out: &mut [u8]) -> Result<usize, WireError> {
    let mut w = Writer::new(out);
    match *p {
        Packet::ClientHello {
            client_cid,
            nonce,
            token,
        } => {
            header(&mut w, PacketType::ClientHello, client_cid)?;
            w.u64(nonce)?;
            put_token_section(&mut w, token)?;
        }
        Packet::ServerChallenge {
            client_cid,
            nonce,
            timestamp,
            cookie,
            tag,
        } => {
            header(&mut w, PacketType::ServerChallenge, client_cid)?;
            w.u64(nonce)?;
            w.u64(timestamp)?;
            w.bytes(&cookie)?;
            if let Some(t) = tag {
                w.bytes(&t)?;
            }
        }
        Packet::ClientCookieEcho {
            client_cid,
            nonce,
            timestamp,
            cookie,
            token,
        } => {
            header(&mut w, PacketType::ClientCookieEcho, client_cid)?;
            w.u64(nonce)?;
            w.u64(timestamp)?;
            w.bytes(&cookie)?;
            put_token_section(&mut w, token)?;
        }
        Packet::ServerAccept {
            client_cid,
            server_cid,
        } => {
            header(&mut w, PacketType::ServerAccept, client_cid)?;
            w.u64(server_cid.0)?;
        }
        Packet::SealedAccept {
            client_cid,
            nonce,
            sealed,
        } => {
            header(&mut w, PacketType::SealedAccept, client_cid)?;
            w.bytes(nonce)?;
            w.bytes(sealed)?;
        }
        Packet::Refuse {
            client_cid,
            reason,
            message,
            tag,
        } => {
            if message.len() > MAX_REFUSE_MESSAGE {
                return Err(WireError::ValueOutOfRange);
            }
            header(&mut w, PacketType::Refuse, client_cid)?;
            w.u8(reason.to_u8())?;
            w.u8(u8::from(tag.is_some()))?;
            w.u8(message.len() as u8)?;
            w.bytes(message)?;
            if let Some(t) = tag {
                w.bytes(&t)?;
            }
        }
        Packet::StatelessReset { cid, token } => {
            header(&mut w, PacketType::StatelessReset, cid)?;
            w.bytes(&token)?;
        }
        Packet::Data {
            dst_cid,
            packet_number,
            payload,
        } => {
            header(&mut w, PacketType::Data, dst_cid)?;
            w.u64(packet_number)?;
            w.bytes(payload)?;
        }
        Packet::FecData { dst_cid, body } => {
            header(&mut w, PacketType::FecData, dst_cid)?;
            w.bytes(body)?;
        }
        Packet::FecParity {
            dst_cid,
            number,
            body,
        } => {
            header(&mut w, PacketType::FecParity, dst_cid)?;
            w.u64(number)?;
            w.bytes(body)?;
        }
    }
    Ok(w.len())
}

/// The mode byte and a token section, or the mode byte and zero padding up to
/// [`MIN_CLIENT_HELLO_LEN`].
pub(super) fn put_token_section(
    w: &mut Writer<'_>,
    token: Option<TokenSection<'_>>,
) -> Result<(), WireError> {
    match token {
        Some(t) => {
            w.u8(MODE_TOKEN)?;
            w.u64(t.protocol_id)?;
            w.u64(t.expires_unix)?;
            w.bytes(t.nonce)?;
            w.bytes(t.sealed)?;
            w.bytes(&t.proof)
        }
        None => {
            w.u8(MODE_INSECURE)?;
            w.zeros(MIN_CLIENT_HELLO_LEN.saturating_sub(w.len()))
        }
    }
}

/// Write the header a `FecData` packet to `dst_cid` starts with (type, version, cid: the
/// bytes every connection packet starts with); its body follows.
pub fn encode_fec_data_header(dst_cid: ConnectionId, out: &mut [u8]) -> Result<usize, WireError> {
    let mut w = Writer::new(out);
    header(&mut w, PacketType::FecData, dst_cid)?;
    Ok(w.len())
}

/// Write a `Data` packet header; frames follow at offset [`DATA_HEADER_LEN`].
pub fn encode_data_header(
    dst_cid: ConnectionId,
    packet_number: u64,
    out: &mut [u8],
) -> Result<usize, WireError> {
    let mut w = Writer::new(out);
    header(&mut w, PacketType::Data, dst_cid)?;
    w.u64(packet_number)?;
    Ok(w.len())
}
