//! Why an FEC operation failed.

/// Why an FEC operation failed. Receiver errors mean the body was dropped (and counted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FecError {
    /// The body is shorter than its header says.
    #[error("truncated FEC body")]
    Truncated,
    /// A reserved header bit is set.
    #[error("reserved FEC header bits set")]
    ReservedBits,
    /// Data or parity shard count is zero or above the supported maximum.
    #[error("bad FEC group shape")]
    BadShape,
    /// A shard index is outside its group.
    #[error("FEC shard index out of range")]
    IndexOutOfRange,
    /// The codec id is unknown.
    #[error("unknown FEC codec")]
    UnknownCodec,
    /// A payload or coded shard is longer than the configuration allows.
    #[error("FEC length too large")]
    LengthTooLarge,
    /// The shard contradicts what earlier shards said about its group.
    #[error("FEC shard inconsistent with its group")]
    InconsistentGroup,
    /// Parity for a group outside the window of groups the receiver can know about.
    #[error("FEC parity for an unknown group")]
    UnknownGroup,
    /// The caller's output buffer is too small.
    #[error("output buffer too small: need {need} bytes")]
    BufferTooSmall {
        /// Bytes needed.
        need: usize,
    },
}
