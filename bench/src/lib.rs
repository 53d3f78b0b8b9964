//! `bench`: Ricochet's benchmark, as a library the binary and the tests share.
//!
//! - [`relay`]: the impairment relay (the simulator's impairment model on real sockets).

pub mod relay;
