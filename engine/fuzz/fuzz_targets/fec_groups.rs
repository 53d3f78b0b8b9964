#![no_main]
// FEC sender and receiver driven by arbitrary operations and malformed bodies.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ricochet::fec::fuzz::sender_receiver_ops(data);
});
