//! Unit tests of `protect` (kept beside it, in their own file).

use super::*;
use crate::xchacha::tests::{assert_sealed_alike, hex};

/// A NIST CAVS vector (`gcmEncryptExtIV128.rsp`, 128-bit text and associated data), for
/// whichever AES-128-GCM the build uses.
#[test]
fn aes_gcm_seals_and_opens_a_nist_vector() {
    let key: [u8; 16] = hex("c939cc13397c1d37de6ae0e1cb7c423c")
        .try_into()
        .expect("16 bytes");
    let nonce: [u8; NONCE_LEN] = hex("b3d8cc017cbb89b39e0f67e2")
        .try_into()
        .expect("12 bytes");
    let (plain, aad) = (
        hex("c3b3c41f113a31b73d9a5cd432103069"),
        hex("24825602bd12a984e0092d3e448eda5f"),
    );
    let mut body = plain.clone();
    let tag = Aes128Gcm::new(&key).seal(&nonce, &aad, &mut body);
    assert_eq!(body, hex("93fe7d9e9bfd10348a5606e5cafa7354"));
    assert_eq!(tag.to_vec(), hex("0032a1dc85f1c9786925a2e71d8272dd"));
    assert!(Aes128Gcm::new(&key).open(&nonce, &aad, &mut body, &tag));
    assert_eq!(body, plain);
}

/// The AES-128-GCM in use (aws-lc-rs in workspace builds) seals byte for byte like
/// RustCrypto's, and opens what RustCrypto sealed: peers built either way interoperate.
#[test]
fn aes_gcm_matches_the_rustcrypto_reference() {
    use aes_gcm::aead::AeadInPlace;
    use aes_gcm::KeyInit;
    let (key, nonce, aad) = ([7u8; 16], [9u8; NONCE_LEN], b"clear header".as_slice());
    for len in [0usize, 1, 15, 16, 17, 64, 1200] {
        let plain: Vec<u8> = (0..len).map(|i| (i * 31) as u8).collect();
        let mut ours = plain.clone();
        let tag = Aes128Gcm::new(&key).seal(&nonce, aad, &mut ours);
        let mut reference = plain.clone();
        let reference_tag = aes_gcm::Aes128Gcm::new(&key.into())
            .encrypt_in_place_detached(&nonce.into(), aad, &mut reference)
            .expect("a small input seals");
        assert_sealed_alike((&ours, &tag), (&reference, &reference_tag));
        assert!(Aes128Gcm::new(&key).open(&nonce, aad, &mut reference, &tag));
        assert_eq!(reference, plain);
    }
}

#[test]
fn seal_open_round_trip_and_every_forgery_fails() {
    let k = PacketKey::new(&[3; 32]);
    let mut buf = vec![0u8; 64 + TAG_LEN];
    for (i, b) in buf[..64].iter_mut().enumerate() {
        *b = i as u8;
    }
    let plain = buf[..64].to_vec();
    let n = k
        .seal_packet(NumberSpace::Data, 9, &mut buf, 18, 64)
        .unwrap();
    assert_eq!(n, 64 + TAG_LEN);
    assert_eq!(buf[..18], plain[..18], "the header stays in clear");
    assert_ne!(buf[18..64], plain[18..], "the body is encrypted");
    let sealed = buf.clone();
    let mut out = Vec::new();
    let m = k
        .open_packet(NumberSpace::Data, 9, &buf, 18, &mut out)
        .expect("opens");
    assert_eq!(out[..m], plain[..]);
    // Any flipped bit, header or body or tag, fails.
    for bit in 0..sealed.len() * 8 {
        let mut f = sealed.clone();
        f[bit / 8] ^= 1 << (bit % 8);
        assert_eq!(
            k.open_packet(NumberSpace::Data, 9, &f, 18, &mut out),
            Err(Unauthenticated),
            "bit {bit}"
        );
    }
    // Another number, the other space, another key, a truncation: all fail.
    let f = sealed.clone();
    assert!(k
        .open_packet(NumberSpace::Data, 10, &f, 18, &mut out)
        .is_err());
    let f = sealed.clone();
    assert!(k
        .open_packet(NumberSpace::Parity, 9, &f, 18, &mut out)
        .is_err());
    let f = sealed.clone();
    assert!(PacketKey::new(&[4; 32])
        .open_packet(NumberSpace::Data, 9, &f, 18, &mut out)
        .is_err());
    let f = sealed[..sealed.len() - 1].to_vec();
    assert!(k
        .open_packet(NumberSpace::Data, 9, &f, 18, &mut out)
        .is_err());
    let f = sealed[..10].to_vec();
    assert!(k
        .open_packet(NumberSpace::Data, 9, &f, 18, &mut out)
        .is_err());
    // No room for the tag: refused, not truncated.
    let mut small = plain.clone();
    assert_eq!(
        k.seal_packet(NumberSpace::Data, 1, &mut small, 18, 64),
        None
    );
}

#[test]
fn directions_use_different_keys() {
    let now = Instant::now();
    let keys = SessionKeys {
        client_to_server: [1; 32],
        server_to_client: [2; 32],
    };
    let (mut c, mut s) = (Protection::new(&keys, true), Protection::new(&keys, false));
    let mut buf = vec![5u8; 40 + TAG_LEN];
    let n = c.seal(now, NumberSpace::Data, 0, &mut buf, 18, 40).unwrap();
    let mut out = Vec::new();
    // A client packet reflected back at the client does not open with its receive key.
    assert_eq!(
        c.open(now, NumberSpace::Data, 0, &buf[..n], 18, &mut out),
        Err(DropCause::Unauthenticated)
    );
    assert_eq!(
        s.open(now, NumberSpace::Data, 0, &buf[..n], 18, &mut out),
        Ok(40)
    );
    // Once: the same packet again is a replay.
    assert_eq!(
        s.open(now, NumberSpace::Data, 0, &buf[..n], 18, &mut out),
        Err(DropCause::Replay)
    );
}

#[test]
fn keys_are_held_only_while_a_session_is_busy() {
    let keys = SessionKeys {
        client_to_server: [1; 32],
        server_to_client: [2; 32],
    };
    let (mut c, mut s) = (Protection::new(&keys, true), Protection::new(&keys, false));
    let start = Instant::now();
    let mut out = Vec::new();
    let mut number = 0;
    let mut exchange = |c: &mut Protection, s: &mut Protection, now: Instant| {
        let mut buf = vec![3u8; 30 + TAG_LEN];
        let n = c.seal(now, NumberSpace::Data, number, &mut buf, 18, 30);
        let opened = s.open(
            now,
            NumberSpace::Data,
            number,
            &buf[..n.unwrap_or(0)],
            18,
            &mut out,
        );
        number += 1;
        opened
    };
    // A keepalive a second, for a minute: every packet seals and opens with a key derived
    // for it, and none is held.
    for k in 0..60 {
        let now = start + Duration::from_secs(k);
        assert_eq!(exchange(&mut c, &mut s, now), Ok(30));
        assert!(!c.holds_keys() && !s.holds_keys(), "quiet at {k} s");
    }
    // Busy: the packet that makes HOLD_AFTER within the window derives a key to hold.
    let busy = start + Duration::from_secs(100);
    for k in 0..u64::from(HOLD_AFTER) {
        assert!(!c.holds_keys() && !s.holds_keys(), "{k} packets");
        let now = busy + Duration::from_millis(10 * k);
        assert_eq!(exchange(&mut c, &mut s, now), Ok(30));
    }
    assert!(c.holds_keys() && s.holds_keys());
    // Held keys interoperate with derived ones (the same derivation): the sender holds,
    // the receiver, released, derives.
    s.release_keys();
    assert!(!s.holds_keys());
    assert_eq!(
        exchange(&mut c, &mut s, busy + Duration::from_secs(5)),
        Ok(30)
    );
    assert!(c.holds_keys() && !s.holds_keys());
    c.release_keys();
    assert!(!c.holds_keys());
}

#[test]
fn key_generations_follow_the_packet_number() {
    let now = Instant::now();
    let keys = SessionKeys {
        client_to_server: [1; 32],
        server_to_client: [2; 32],
    };
    let (mut c, mut s) = (Protection::new(&keys, true), Protection::new(&keys, false));
    let g = KEY_GENERATION_PACKETS;
    let mut out = Vec::new();
    let sealed = |c: &mut Protection, number: u64| {
        let mut buf = vec![9u8; 30 + TAG_LEN];
        let n = c
            .seal(now, NumberSpace::Data, number, &mut buf, 18, 30)
            .unwrap();
        buf.truncate(n);
        buf
    };
    // Numbers of different generations are sealed with different keys.
    let a = sealed(&mut c, g - 1);
    let b = sealed(&mut c, g);
    assert!(PacketKey::derive(&[1; 32], NumberSpace::Data, 0)
        .open_packet(NumberSpace::Data, g, &b, 18, &mut out)
        .is_err());
    assert!(PacketKey::derive(&[1; 32], NumberSpace::Data, 1)
        .open_packet(NumberSpace::Data, g, &b, 18, &mut out)
        .is_ok());
    // Across the boundary, in either order, both open.
    assert_eq!(s.open(now, NumberSpace::Data, g, &b, 18, &mut out), Ok(30));
    assert_eq!(
        s.open(now, NumberSpace::Data, g - 1, &a, 18, &mut out),
        Ok(30)
    );
    // A number two generations ahead is refused unopened; one ahead is derived.
    let far = sealed(&mut c, 3 * g);
    assert_eq!(
        s.open(now, NumberSpace::Data, 3 * g, &far, 18, &mut out),
        Err(DropCause::Unauthenticated)
    );
    let next = sealed(&mut c, 2 * g + 5);
    assert_eq!(
        s.open(now, NumberSpace::Data, 2 * g + 5, &next, 18, &mut out),
        Ok(30)
    );
    assert_eq!(
        s.open(now, NumberSpace::Data, 3 * g, &far, 18, &mut out),
        Ok(30)
    );
    // The sender went back to an older generation (a retransmitted close, say): still
    // the right key.
    let back = sealed(&mut c, g + 1);
    assert!(PacketKey::derive(&[1; 32], NumberSpace::Data, 1)
        .open_packet(NumberSpace::Data, g + 1, &back, 18, &mut out)
        .is_ok());
}

#[test]
fn replay_window_accepts_each_number_once() {
    let mut w = ReplayWindow::new();
    assert_eq!(w.check(5), Ok(()));
    w.mark(5);
    assert_eq!(w.check(5), Err(DropCause::Replay));
    assert_eq!(w.check(4), Ok(()), "older but unseen, within the window");
    w.mark(4);
    assert_eq!(w.check(4), Err(DropCause::Replay));
    w.mark(5 + REPLAY_WINDOW - 1);
    assert_eq!(w.check(5), Err(DropCause::Replay), "still in the window");
    assert_eq!(w.check(6), Ok(()));
    assert_eq!(w.check(4), Err(DropCause::TooOld));
    // Sliding clears the bits the window moved over.
    w.mark(5 + REPLAY_WINDOW + 10);
    assert_eq!(w.check(5 + REPLAY_WINDOW + 9), Ok(()));
    assert_eq!(w.check(5 + REPLAY_WINDOW - 1), Err(DropCause::Replay));
    // A far jump empties the window; numbers far out stay valid u64 arithmetic.
    w.mark(u64::MAX);
    assert_eq!(w.check(u64::MAX), Err(DropCause::Replay));
    assert_eq!(w.check(u64::MAX - 1), Ok(()));
    assert_eq!(w.check(0), Err(DropCause::TooOld));
    assert_eq!(w.largest(), Some(u64::MAX));
}

#[test]
fn replay_window_matches_a_set_model() {
    // Against a plain set: random numbers near the largest, checked then marked.
    let mut w = ReplayWindow::new();
    let mut seen = std::collections::BTreeSet::new();
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut top = 0u64;
    for _ in 0..20_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let n = (top + 40).saturating_sub(x % 1500);
        let expect = if seen.last().is_some_and(|&l| l >= n + REPLAY_WINDOW) {
            Err(DropCause::TooOld)
        } else if seen.contains(&n) {
            Err(DropCause::Replay)
        } else {
            Ok(())
        };
        assert_eq!(w.check(n), expect, "n = {n}");
        if expect.is_ok() {
            w.mark(n);
            seen.insert(n);
            top = top.max(n);
        }
    }
}
