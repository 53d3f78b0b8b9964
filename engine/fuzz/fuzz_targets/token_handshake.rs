#![no_main]
// A token-admitting server fed real, mutated and raw handshakes.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = ricochet_fuzz::bodies::token_handshake(data);
});
