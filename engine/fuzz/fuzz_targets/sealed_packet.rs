#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ricochet_fuzz::bodies::sealed_packet(data);
});
