//! The cargo-fuzz target bodies (`engine/fuzz/src/bodies.rs`) run over proptest inputs, so CI
//! exercises them on stable without libFuzzer.

#[path = "../fuzz/src/bodies.rs"]
mod bodies;

use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn fuzz_decode_packet(data in proptest::collection::vec(any::<u8>(), 0..1500)) {
        bodies::decode_packet(&data);
    }

    #[test]
    fn fuzz_endpoint_handshake(data in proptest::collection::vec(any::<u8>(), 0..4096)) {
        bodies::endpoint_handshake(&data);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn fuzz_connection(data in proptest::collection::vec(any::<u8>(), 0..4096)) {
        bodies::connection(&data);
    }

    #[test]
    fn fuzz_sealed_packet(data in proptest::collection::vec(any::<u8>(), 0..4096)) {
        bodies::sealed_packet(&data);
    }
}
