//! Sizes of a connect token's sealed part, which the packet layouts ([`crate::wire`]) and the
//! session keys embed: a leaf, so that neither needs the token's code.

/// Size of the private part before sealing.
pub const PRIVATE_LEN: usize = 496;
/// Size of the AEAD tag.
pub const TAG_LEN: usize = 16;
/// Size of the sealed private part (ciphertext and tag).
pub const SEALED_LEN: usize = PRIVATE_LEN + TAG_LEN;
/// Size of the nonce the private part is sealed with.
pub const NONCE_LEN: usize = 24;
