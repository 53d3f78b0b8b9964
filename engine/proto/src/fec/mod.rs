//! Forward error correction: a sliding-window random linear code and Reed-Solomon block codes,
//! with fixed and adaptive redundancy policies.
//!
//! FEC sits below ARQ, with one of two schemes ([`FecConfig::scheme`], both ends alike):
//!
//! - Block ([`FecScheme::Block`]): the sender ([`FecSender`]) puts consecutive outgoing
//!   datagrams into a group, closes it when it holds [`FecConfig::max_data_shards`] or when its
//!   [`FecConfig::group_wait`] runs out, and yields parity right after. The receiver
//!   ([`FecReceiver`]) hands every data payload on at once, keeps the shards of incomplete
//!   groups within a byte budget ([`RetentionBudget`]) and an age limit, and rebuilds lost data
//!   shards when enough shards arrive.
//! - Sliding window ([`FecScheme::Sliding`], the default; RFC 8681 / Tetrys style): every
//!   datagram is a source with its own seq; the sender ([`SlidingSender`]) emits a repair, a
//!   random linear combination over GF(2^8) of the most recent sources (at most
//!   [`SlidingConfig::window`], none older than [`SlidingConfig::max_age`]), every
//!   `span / level` sources (the level follows the loss estimate) and, when it goes quiet for
//!   [`SlidingConfig::tail_wait`] with sources not yet covered, up to
//!   [`SlidingConfig::tail_repairs`] more (as many as the loss estimate asks for,
//!   [`SlidingConfig::tail_residual`]; none when those sources are likely all received,
//!   [`SlidingConfig::tail_skip_residual`], and the next repair covers them). After a recent
//!   loss burst the tail also covers what one burst among the recent datagrams could erase
//!   beyond the repairs already sent after it, even when a ratio repair ended the run. The
//!   receiver
//!   ([`SlidingReceiver`]) keeps recent sources and pending repair equations within the same
//!   budget, substitutes known sources, solves single unknowns at once and small systems by
//!   Gaussian elimination. A group of a few datagrams needs its own parity; a repair covers
//!   every recent source, so fewer repairs protect the same stream. The datagrams of an
//!   unreliable message of several fragments (which one lost fragment loses whole, and ARQ
//!   never repairs) are coded in chunks of their own instead, each chunk's repairs sized by the
//!   binomial tail at the reported loss and sent after its last source (see
//!   `SlidingSender::protect_fragment`, which the connection calls).
//!
//! Either way ARQ only retransmits what FEC could not rebuild.
//!
//! Everything here is sans-IO: time is an argument, nothing reads a clock or touches a
//! socket. Byte layouts are in [`header`].
//!
//! ```
//! use std::time::Instant;
//! use ricochet_proto::fec::{FecConfig, FecPolicy, FecReceiver, FecSender};
//!
//! let cfg = FecConfig::with_policy(FecPolicy::Fixed { parity: 1 });
//! let (mut tx, mut rx) = (FecSender::new(cfg), FecReceiver::new(cfg));
//! # let now = ricochet_testkit::SimClock::new().now(); // time is an argument: any clock
//! let mut buf = vec![0u8; cfg.max_parity_body()];
//! let mut bodies = Vec::new();
//! for msg in [[1u8; 20], [2; 20], [3; 20], [4; 20]] {
//!     let n = tx.protect(now, &msg, &mut buf).unwrap(); // body of a `FecData` packet
//!     bodies.push(buf[..n].to_vec());
//! }
//! // The group's wait runs out and its parity follows (body of a `FecParity` packet).
//! let deadline = tx.poll_timeout().unwrap();
//! let n = tx.poll_parity(deadline, &mut buf).unwrap();
//! let parity = buf[..n].to_vec();
//! // The second datagram is lost: the receiver rebuilds it from the parity.
//! let mut got = Vec::new();
//! for body in [&bodies[0], &bodies[2], &bodies[3]] {
//!     rx.on_data(now, body, |p| got.push(p.to_vec())).unwrap();
//! }
//! rx.on_parity(now, &parity, |p| got.push(p.to_vec())).unwrap();
//! assert_eq!(got[3], [2u8; 20]);
//! assert_eq!(rx.stats().data_recovered, 1);
//! ```

// The codecs, senders and receivers: left out without the `fec` feature (a connection then
// sends no FEC, and unwraps its peer's `FecData` packets without recovery).
#[cfg(feature = "fec")]
pub mod codec;
mod config;
mod error;
// Fuzz drivers (the fuzz crate and this crate's tests): with the `test-util` feature only.
#[cfg(all(feature = "fec", feature = "test-util"))]
pub mod fuzz;
#[cfg(feature = "fec")]
mod gf;
pub mod header;
#[cfg(feature = "fec")]
pub mod kernel;
#[cfg(feature = "fec")]
mod policy;
#[cfg(feature = "fec")]
mod receiver;
#[cfg(feature = "fec")]
pub(crate) mod scheme;
#[cfg(feature = "fec")]
mod sender;
#[cfg(feature = "fec")]
mod sliding;
mod stats;
#[cfg(feature = "fec")]
mod track;

#[cfg(feature = "fec")]
pub use codec::{CauchyCodec, Codec, CodecError, CodecId, RsSimdCodec};
pub use config::{AdaptiveConfig, FecConfig, FecPolicy, FecScheme, SlidingConfig};
pub use error::FecError;
pub use header::{
    max_protected_payload, repair_coefficient, DataHeader, ParityHeader, RepairHeader,
    DATA_HEADER_LEN, MAX_REPAIR_SOURCES, PARITY_HEADER_LEN, SLIDING_CODEC_ID,
};
#[cfg(feature = "fec")]
pub use kernel::{Kernel, SimdLevel};
#[cfg(feature = "fec")]
pub use receiver::FecReceiver;
#[cfg(feature = "fec")]
pub use sender::{FecSender, MAX_QUEUED_PARITY};
#[cfg(feature = "fec")]
pub use sliding::{SlidingReceiver, SlidingSender, MAX_PENDING_REPAIRS};
pub use stats::{
    LossReport, MalformedCounts, ReceiverStats, RetentionBudget, SenderStats,
    DEFAULT_RETENTION_BUDGET,
};
