#![no_main]
// The connect-token decoders (serialized token, private part) and the open of a sealed part.
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ricochet_fuzz::bodies::token_decode(data);
});
