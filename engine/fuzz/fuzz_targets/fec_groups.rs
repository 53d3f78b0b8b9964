#![no_main]
// FEC senders and receivers (block code and sliding-window code) driven by arbitrary
// operations and malformed data, parity and repair bodies. The first byte picks the scheme.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    match data.split_first() {
        Some((s, rest)) if s & 1 == 1 => {
            ricochet_proto::fec::fuzz::sliding_ops(std::time::Instant::now(), rest)
        }
        _ => ricochet_proto::fec::fuzz::sender_receiver_ops(std::time::Instant::now(), data),
    }
});
