//! The old name of [`crate::tokens`] (the connect-token issuer), kept for one release: it sat
//! beside [`BackendKind`](crate::BackendKind), the datagram I/O backend, under the same word.

use std::net::SocketAddr;
use std::time::Duration;

use ricochet_proto::token::{ConnectToken, TokenError, TokenKey};

/// The old path of [`crate::TokenIssuer`].
#[deprecated(note = "use `ricochet::TokenIssuer` (module `ricochet::tokens`)")]
pub type TokenIssuer = crate::tokens::TokenIssuer;

/// Issue a token that lets player `client_id` onto the servers at `servers` (tried in order)
/// for `valid_for` from now, carrying `user_data` (at most 256 bytes) to the server
/// application, sealed with the backend's `key` for the game's `protocol_id`.
#[deprecated(
    note = "use `ricochet::TokenIssuer::new(key, protocol_id).valid_for(..).issue_with_data(..)`"
)]
pub fn issue_token(
    key: &TokenKey,
    protocol_id: u64,
    client_id: u64,
    servers: &[SocketAddr],
    valid_for: Duration,
    user_data: &[u8],
) -> Result<ConnectToken, TokenError> {
    crate::tokens::seal(key, protocol_id, client_id, servers, valid_for, user_data)
}
