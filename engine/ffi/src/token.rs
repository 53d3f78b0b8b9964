//! Connect tokens from C: a backend (or a test) that links the library issues tokens with
//! the OS's randomness ([`ricochet_token_issue`]) or encodes one from every field, keys and
//! nonce included ([`ricochet_token_encode`], for test vectors and for backends that draw
//! their own randomness). The byte layout is in `docs/tokens.md`.

use std::ffi::{c_char, CStr};
use std::net::SocketAddr;
use std::time::Duration;

use ricochet::proto::token::{ConnectToken, PrivateToken, NONCE_LEN};
use ricochet::proto::SessionKeys;
use ricochet::TokenIssuer;
use ricochet::{Bytes, TokenKey};

use crate::handles::{self, Object};
use crate::ricochet_status;
use crate::status::{guard, write_bytes, Error};

/// Size of a serialized connect token, in bytes (every token has this size).
pub const RICOCHET_CONNECT_TOKEN_LEN: usize = 785;
/// Size of a token key (the backend's secret shared with its servers), and of each session key.
pub const RICOCHET_KEY_LEN: usize = 32;
/// Size of the nonce a token's private part is sealed with.
pub const RICOCHET_TOKEN_NONCE_LEN: usize = 24;
/// Most server addresses a token lists.
pub const RICOCHET_MAX_SERVER_ADDRESSES: usize = 8;
/// Most bytes of user data a token carries.
pub const RICOCHET_MAX_USER_DATA: usize = 256;

/// A token issuer: the backend's key, the game's protocol id and the tokens' validity.
/// Opaque; 0 is the null handle.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ricochet_token_issuer {
    /// The handle's id (opaque).
    pub id: u64,
}

pub(crate) struct IssuerCell(TokenIssuer);

fn issuer_cell(h: ricochet_token_issuer) -> Result<std::sync::Arc<IssuerCell>, Error> {
    match handles::get(h.id) {
        Some(Object::Issuer(i)) => Ok(i),
        _ => Err(Error::invalid_handle("token issuer")),
    }
}

/// Read a 32-byte key.
///
/// # Safety
///
/// `p` null or 32 readable bytes.
pub(crate) unsafe fn read_key(p: *const u8, what: &str) -> Result<[u8; 32], Error> {
    if p.is_null() {
        return Err(Error::null(what));
    }
    let mut k = [0u8; 32];
    // SAFETY: 32 readable bytes by the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(p, k.as_mut_ptr(), 32) };
    Ok(k)
}

/// A NUL-terminated UTF-8 string as `&str`.
///
/// # Safety
///
/// `p` null or a NUL-terminated string that outlives `'a`.
pub(crate) unsafe fn read_str<'a>(p: *const c_char, what: &str) -> Result<&'a str, Error> {
    if p.is_null() {
        return Err(Error::null(what));
    }
    // SAFETY: NUL-terminated and alive for the call, by the caller's contract.
    unsafe { CStr::from_ptr(p) }.to_str().map_err(|_| {
        Error::new(
            ricochet_status::RICOCHET_ERROR_INVALID_ARGUMENT,
            format!("{what} is not UTF-8"),
        )
    })
}

/// Parse "ip:port" (IPv6 in brackets).
///
/// # Safety
///
/// As [`read_str`].
pub(crate) unsafe fn read_addr(p: *const c_char, what: &str) -> Result<SocketAddr, Error> {
    // SAFETY: the caller's contract.
    let s = unsafe { read_str(p, what) }?;
    s.parse().map_err(|_| {
        Error::new(
            ricochet_status::RICOCHET_ERROR_INVALID_ARGUMENT,
            format!("{what} {s:?} is not an \"ip:port\" address"),
        )
    })
}

/// Read `count` addresses from an array of strings.
///
/// # Safety
///
/// `addresses` null or `count` readable pointers, each a NUL-terminated string.
unsafe fn read_addrs(
    addresses: *const *const c_char,
    count: usize,
) -> Result<Vec<SocketAddr>, Error> {
    if count > RICOCHET_MAX_SERVER_ADDRESSES {
        return Err(Error::new(
            ricochet_status::RICOCHET_ERROR_TOKEN,
            format!("a token lists at most {RICOCHET_MAX_SERVER_ADDRESSES} addresses, not {count}"),
        ));
    }
    if count == 0 {
        return Err(Error::new(
            ricochet_status::RICOCHET_ERROR_TOKEN,
            "a token must list at least one server address",
        ));
    }
    if addresses.is_null() {
        return Err(Error::null("addresses"));
    }
    (0..count)
        .map(|i| {
            // SAFETY: `count` readable pointers, each a string (caller's contract).
            unsafe { read_addr(*addresses.add(i), "a server address") }
        })
        .collect()
}

/// Borrow `len` bytes at `p` (null allowed when `len` is 0).
///
/// # Safety
///
/// `p` null or `len` readable bytes that outlive `'a`.
pub(crate) unsafe fn read_bytes<'a>(
    p: *const u8,
    len: usize,
    what: &str,
) -> Result<&'a [u8], Error> {
    if len == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(Error::null(what));
    }
    // SAFETY: `len` readable bytes, alive for the call (caller's contract).
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
}

fn token_error(e: ricochet::proto::token::TokenError) -> Error {
    Error::new(ricochet_status::RICOCHET_ERROR_TOKEN, e.to_string())
}

/// Make a token issuer for the backend's `key` (32 bytes, read during the call only; the
/// issuer keeps a copy, wiped when destroyed) and the game's `protocol_id`, whose tokens stay
/// valid `valid_for_secs` seconds (0: the default, 30 s). Writes the handle to `*out`; destroy
/// it with [`ricochet_token_issuer_destroy`].
///
/// # Safety
///
/// `key` null or 32 readable bytes; `out` null or one writable handle.
#[no_mangle]
pub unsafe extern "C" fn ricochet_token_issuer_new(
    key: *const u8,
    protocol_id: u64,
    valid_for_secs: u64,
    out: *mut ricochet_token_issuer,
) -> ricochet_status {
    guard(|| {
        if out.is_null() {
            return Err(Error::null("out"));
        }
        // SAFETY: the caller's contract.
        let key = TokenKey::from_bytes(unsafe { read_key(key, "key") }?);
        let mut issuer = TokenIssuer::new(key, protocol_id);
        if valid_for_secs != 0 {
            issuer = issuer.valid_for(Duration::from_secs(valid_for_secs));
        }
        let id = handles::insert(Object::Issuer(std::sync::Arc::new(IssuerCell(issuer))));
        // SAFETY: non-null and writable (caller's contract).
        unsafe { out.write(ricochet_token_issuer { id }) };
        Ok(())
    })
}

/// Destroy a token issuer; its handle is invalid from now on.
#[no_mangle]
pub extern "C" fn ricochet_token_issuer_destroy(issuer: ricochet_token_issuer) -> ricochet_status {
    guard(|| {
        handles::remove(issuer.id, |o| matches!(o, Object::Issuer(_)))
            .map(drop)
            .ok_or_else(|| Error::invalid_handle("token issuer"))
    })
}

/// Issue a token for player `client_id`, listing the `address_count` servers in `addresses`
/// (an array of "ip:port" strings, tried in order; 1..=8) and carrying `user_data_len` bytes
/// of `user_data` (0..=256; `user_data` may be null when 0) to the server application. The
/// session keys and the nonce come from the OS's generator; the expiry is now plus the
/// issuer's validity. Writes the [`RICOCHET_CONNECT_TOKEN_LEN`] bytes into `out` (`cap` bytes,
/// caller-owned, written during the call only) and their count into `*out_len` (if not null).
/// Inputs are read during the call only. Send the token to the player over an encrypted
/// channel: its session keys are the player's secret.
///
/// # Safety
///
/// `addresses` null or `address_count` readable string pointers; `user_data` null or
/// `user_data_len` readable bytes; `out` null or `cap` writable bytes; `out_len` null or one
/// writable `size_t`.
#[no_mangle]
pub unsafe extern "C" fn ricochet_token_issue(
    issuer: ricochet_token_issuer,
    client_id: u64,
    addresses: *const *const c_char,
    address_count: usize,
    user_data: *const u8,
    user_data_len: usize,
    out: *mut u8,
    cap: usize,
    out_len: *mut usize,
) -> ricochet_status {
    guard(|| {
        let cell = issuer_cell(issuer)?;
        // SAFETY: the caller's contract, for each of the three.
        let servers = unsafe { read_addrs(addresses, address_count) }?;
        // SAFETY: the pointers are as this function's `# Safety` requires.
        let data = unsafe { read_bytes(user_data, user_data_len, "user_data") }?;
        let token = cell
            .0
            .issue_with_data(client_id, &servers, data)
            .map_err(token_error)?;
        // SAFETY: the pointers are as this function's `# Safety` requires.
        unsafe { write_bytes(&token.to_bytes(), out, cap, out_len) }
    })
}

/// Encode a token from every field, the random ones included: the session keys
/// `client_to_server_key` and `server_to_client_key` (32 bytes each) and the seal's `nonce`
/// (24 bytes). Deterministic, for test vectors (`docs/tokens.md`) and for a backend that
/// draws its own randomness: each key and nonce must come from a cryptographic generator,
/// fresh for every token (a repeated nonce under one `key` breaks the seal's secrecy).
/// `expires_unix` is the expiry in seconds since 1970. Otherwise as [`ricochet_token_issue`]:
/// inputs are read during the call only, the token goes into the caller's `out`.
///
/// # Safety
///
/// `key`, `client_to_server_key`, `server_to_client_key`: null or 32 readable bytes; `nonce`
/// null or 24 readable bytes; the rest as [`ricochet_token_issue`].
#[no_mangle]
pub unsafe extern "C" fn ricochet_token_encode(
    key: *const u8,
    protocol_id: u64,
    client_id: u64,
    expires_unix: u64,
    addresses: *const *const c_char,
    address_count: usize,
    user_data: *const u8,
    user_data_len: usize,
    client_to_server_key: *const u8,
    server_to_client_key: *const u8,
    nonce: *const u8,
    out: *mut u8,
    cap: usize,
    out_len: *mut usize,
) -> ricochet_status {
    guard(|| {
        // SAFETY (all reads below): the caller's contract.
        // SAFETY: the pointers are as this function's `# Safety` requires.
        let key = TokenKey::from_bytes(unsafe { read_key(key, "key") }?);
        let keys = SessionKeys {
            // SAFETY: the pointers are as this function's `# Safety` requires.
            client_to_server: unsafe { read_key(client_to_server_key, "client_to_server_key") }?,
            // SAFETY: the pointers are as this function's `# Safety` requires.
            server_to_client: unsafe { read_key(server_to_client_key, "server_to_client_key") }?,
        };
        if nonce.is_null() {
            return Err(Error::null("nonce"));
        }
        let mut n = [0u8; NONCE_LEN];
        // SAFETY: 24 readable bytes (caller's contract).
        unsafe { std::ptr::copy_nonoverlapping(nonce, n.as_mut_ptr(), NONCE_LEN) };
        // SAFETY: the pointers are as this function's `# Safety` requires.
        let servers = unsafe { read_addrs(addresses, address_count) }?;
        // SAFETY: the pointers are as this function's `# Safety` requires.
        let data = unsafe { read_bytes(user_data, user_data_len, "user_data") }?;
        let token = encode(
            &key,
            protocol_id,
            client_id,
            expires_unix,
            &servers,
            data,
            keys,
            n,
        )?;
        // SAFETY: the pointers are as this function's `# Safety` requires.
        unsafe { write_bytes(&token.to_bytes(), out, cap, out_len) }
    })
}

/// A token from every field: the private part sealed under the given nonce.
#[allow(clippy::too_many_arguments)]
pub(crate) fn encode(
    key: &TokenKey,
    protocol_id: u64,
    client_id: u64,
    expires_unix: u64,
    servers: &[SocketAddr],
    user_data: &[u8],
    keys: SessionKeys,
    nonce: [u8; NONCE_LEN],
) -> Result<ConnectToken, Error> {
    let private = PrivateToken {
        client_id,
        server_addresses: servers.to_vec(),
        keys: keys.clone(),
        user_data: Bytes::copy_from_slice(user_data),
    };
    let mut source = GivenNonce {
        nonce,
        taken: 0,
        overdrawn: false,
    };
    let sealed = private
        .seal(key, protocol_id, expires_unix, &mut source)
        .map_err(token_error)?;
    if source.overdrawn || source.taken != NONCE_LEN {
        // Sealing draws exactly the nonce; anything else would make the bytes not the ones asked.
        return Err(Error::new(
            ricochet_status::RICOCHET_ERROR_TOKEN,
            "sealing drew other randomness than its nonce",
        ));
    }
    Ok(ConnectToken {
        protocol_id,
        expires_unix,
        server_addresses: private.server_addresses,
        keys,
        sealed,
    })
}

/// The "generator" sealing draws its nonce from: the caller's nonce, once. Any further draw
/// yields zeros and is flagged, and [`encode`] then fails rather than return a token that
/// used bytes nobody chose.
struct GivenNonce {
    nonce: [u8; NONCE_LEN],
    taken: usize,
    overdrawn: bool,
}

impl rand::RngCore for GivenNonce {
    fn next_u32(&mut self) -> u32 {
        let mut b = [0u8; 4];
        self.fill_bytes(&mut b);
        u32::from_le_bytes(b)
    }

    fn next_u64(&mut self) -> u64 {
        let mut b = [0u8; 8];
        self.fill_bytes(&mut b);
        u64::from_le_bytes(b)
    }

    fn fill_bytes(&mut self, dst: &mut [u8]) {
        for d in dst {
            match self.nonce.get(self.taken) {
                Some(&b) => *d = b,
                None => {
                    *d = 0;
                    self.overdrawn = true;
                }
            }
            self.taken += 1;
        }
    }
}

// Only ever handed to `PrivateToken::seal`, which takes exactly the nonce from it (checked
// by `encode`): the caller vouches for the nonce's randomness.
impl rand::CryptoRng for GivenNonce {}

#[cfg(test)]
mod tests {
    use super::*;
    use ricochet::proto::token::{self, CONNECT_TOKEN_LEN};

    #[test]
    fn the_header_constants_match_the_token_format() {
        assert_eq!(RICOCHET_CONNECT_TOKEN_LEN, CONNECT_TOKEN_LEN);
        assert_eq!(RICOCHET_TOKEN_NONCE_LEN, token::NONCE_LEN);
        assert_eq!(RICOCHET_MAX_SERVER_ADDRESSES, token::MAX_SERVER_ADDRESSES);
        assert_eq!(RICOCHET_MAX_USER_DATA, token::MAX_USER_DATA);
    }
}
