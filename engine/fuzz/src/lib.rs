//! Fuzz target bodies, shared by the cargo-fuzz binaries and by the proptest run in
//! `engine/proto/tests/proto_fuzz_bodies.rs` (which includes `bodies.rs` by path).
pub mod bodies;
