//! Forward error correction: Reed-Solomon codecs, groups, fixed and adaptive parity policies.
