//! The secrets that protect one session's packets.

use std::fmt;

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

impl fmt::Debug for SessionKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SessionKeys { .. }")
    }
}
