//! [`SessionId`]: the runtime's name for one client's session, and the one a handler, the
//! metrics endpoint and the server's commands share (a leaf, so that none of them depends on
//! another for it).

use std::fmt;

use ricochet_proto::ConnectionHandle;

/// A session: the worker (endpoint) that owns it and its connection handle there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId {
    /// The owning worker (always 0 in the shared IO model: one endpoint).
    pub worker: u32,
    /// The connection on that worker's endpoint.
    pub handle: ConnectionHandle,
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{:016x}", self.worker, self.handle.0)
    }
}
