//! The cargo-fuzz target bodies (`engine/fuzz/src/bodies.rs`) run over proptest inputs, so CI
//! exercises them on stable without libFuzzer.

#[path = "../../fuzz/src/bodies.rs"]
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

    #[test]
    fn fuzz_token_decode(data in proptest::collection::vec(any::<u8>(), 0..1200)) {
        bodies::token_decode(&data);
    }

    #[test]
    fn fuzz_token_handshake(data in proptest::collection::vec(any::<u8>(), 0..2048)) {
        bodies::token_handshake(&data);
    }
}

/// The token handshake body reaches what it guards: scripted, every client sends, gets the
/// challenge, echoes, gets its answer, twice over. The two valid tokens are accepted, once
/// each; the expired and the wrong-server ones never.
#[test]
fn token_handshake_body_admits_exactly_the_valid_tokens() {
    let mut script = Vec::new();
    for _ in 0..2 {
        for client in 0..4u8 {
            // send (hello, then echo), deliver the replies; twice
            script.extend([client << 2, 0, 2, 0, client << 2, 0, 2, 0]);
        }
    }
    assert_eq!(bodies::token_handshake(&script), 2);
    // A corrupted echo (arg odd: one bit flipped) admits nobody.
    let corrupt: Vec<u8> = [0u8, 0, 2, 0, 0, 0x41, 2, 0].to_vec();
    assert_eq!(bodies::token_handshake(&corrupt), 0);
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
