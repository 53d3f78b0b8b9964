//! What both tests share: the messages they exchange.

/// Messages each test echoes.
pub const MESSAGES: u32 = 10_000;

/// Messages in flight at most.
pub const WINDOW: u32 = 32;

/// Message `i`: its index, then bytes from a generator seeded by it; 4 to 2,503 bytes, so
/// that some span several datagrams (fragmented and reassembled).
pub fn payload(i: u32) -> Vec<u8> {
    let len = 4 + (i as usize * 7_919) % 2_500;
    let mut bytes = Vec::with_capacity(len);
    bytes.extend_from_slice(&i.to_le_bytes());
    let mut x = i.wrapping_mul(0x9e37_79b9) | 1;
    while bytes.len() < len {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        bytes.push(x as u8);
    }
    bytes
}

/// Where `got` first differs from message `i`, if it does.
pub fn mismatch(i: u32, got: &[u8]) -> Option<String> {
    let want = payload(i);
    if got == want.as_slice() {
        return None;
    }
    let at = got.iter().zip(&want).position(|(a, b)| a != b);
    Some(format!(
        "message {i}: {} bytes, expected {}; first difference at {at:?}",
        got.len(),
        want.len()
    ))
}
