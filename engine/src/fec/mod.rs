//! Forward error correction: Reed-Solomon codecs, groups, fixed and adaptive parity policies.
//!
//! FEC sits below ARQ: the sender groups consecutive outgoing datagrams and sends parity
//! shards after each group closes; the receiver hands every data payload on at once and
//! rebuilds lost ones from parity, so ARQ only retransmits what FEC could not rebuild.
//! Everything here is sans-IO: time is an argument, nothing reads a clock or touches a socket.

pub mod codec;
mod gf;
pub mod kernel;

pub use codec::{CauchyCodec, Codec, CodecError, CodecId, RsSimdCodec};
pub use kernel::{Kernel, SimdLevel};
