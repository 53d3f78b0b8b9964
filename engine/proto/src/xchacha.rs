//! XChaCha20-Poly1305 (draft-irtf-cfrg-xchacha), the AEAD of connect tokens and sealed
//! accepts, from vetted crates: with the `aws-lc-rs` feature (which the `ricochet` runtime
//! turns on), the draft's construction over two vetted primitives — the subkey from
//! RustCrypto's `chacha20::hchacha`, then aws-lc-rs's assembly ChaCha20-Poly1305 (RFC 8439)
//! under the nonce of four zero bytes and the nonce's last eight; RustCrypto's
//! `XChaCha20Poly1305` otherwise. The assembly is the faster on these short inputs (PERFORMANCE.md
//! has the figures), though it allocates aws-lc's context per call, which a handshake can
//! afford. Both compute the same algorithm, byte for byte: tests check the draft's vector and
//! RustCrypto's output.

/// Key bytes.
pub(crate) const KEY_LEN: usize = 32;
/// Nonce bytes (192 bits: random nonces never collide in practice).
pub(crate) const NONCE_LEN: usize = 24;
/// Tag bytes.
pub(crate) const TAG_LEN: usize = 16;

/// `seal(key, nonce, aad, body)` encrypts `body` in place under `key` and `nonce`,
/// authenticating `aad` too, and returns the tag; `open(key, nonce, aad, body, tag)` decrypts
/// `body` in place if `tag` authenticates it and `aad`, and returns false otherwise (`body` is
/// then unspecified).
pub(crate) use imp::{open, seal};

#[cfg(feature = "aws-lc-rs")]
mod imp {
    use super::{KEY_LEN, NONCE_LEN, TAG_LEN};
    use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305};

    /// The draft's §2.3: the HChaCha20 subkey of the nonce's first 16 bytes, and the
    /// ChaCha20-Poly1305 nonce of four zero bytes and the nonce's last 8.
    fn subkey(key: &[u8; KEY_LEN], nonce: &[u8; NONCE_LEN]) -> (LessSafeKey, Nonce) {
        let (head, tail) = nonce.split_at(16);
        let sub = chacha20::hchacha::<chacha20::cipher::consts::U10>(key.into(), head.into());
        // ChaCha20-Poly1305 takes 32 bytes and gets HChaCha20's 32: only a failure to
        // allocate aws-lc's context is left, as fatal as any other allocation failure.
        let key = LessSafeKey::new(
            UnboundKey::new(&CHACHA20_POLY1305, &sub)
                .expect("aws-lc ChaCha20-Poly1305 context for a 32-byte key"),
        );
        let mut n = [0u8; 12];
        n[4..].copy_from_slice(tail);
        (key, Nonce::assume_unique_for_key(n))
    }

    #[must_use]
    pub(crate) fn seal(
        key: &[u8; KEY_LEN],
        nonce: &[u8; NONCE_LEN],
        aad: &[u8],
        body: &mut [u8],
    ) -> [u8; TAG_LEN] {
        let (key, nonce) = subkey(key, nonce);
        let mut out = [0u8; TAG_LEN];
        match key.seal_in_place_separate_tag(nonce, Aad::from(aad), body) {
            Ok(tag) => out.copy_from_slice(tag.as_ref()),
            // Only inputs beyond 256 GiB are refused; tokens and accepts are a few hundred bytes.
            Err(_) => unreachable!("a token or accept is far below the AEAD's input limit"),
        }
        out
    }

    #[must_use]
    pub(crate) fn open(
        key: &[u8; KEY_LEN],
        nonce: &[u8; NONCE_LEN],
        aad: &[u8],
        body: &mut [u8],
        tag: &[u8; TAG_LEN],
    ) -> bool {
        let (key, nonce) = subkey(key, nonce);
        key.open_in_place_separate_tag(nonce, Aad::from(aad), tag, body)
            .is_ok()
    }
}

#[cfg(not(feature = "aws-lc-rs"))]
mod imp {
    use super::{KEY_LEN, NONCE_LEN, TAG_LEN};
    use chacha20poly1305::aead::{AeadInPlace, KeyInit};
    use chacha20poly1305::{Tag, XChaCha20Poly1305, XNonce};

    #[must_use]
    pub(crate) fn seal(
        key: &[u8; KEY_LEN],
        nonce: &[u8; NONCE_LEN],
        aad: &[u8],
        body: &mut [u8],
    ) -> [u8; TAG_LEN] {
        match XChaCha20Poly1305::new(key.into()).encrypt_in_place_detached(
            XNonce::from_slice(nonce),
            aad,
            body,
        ) {
            Ok(tag) => tag.into(),
            // Only inputs beyond 256 GiB are refused; tokens and accepts are a few hundred bytes.
            Err(_) => unreachable!("a token or accept is far below the AEAD's input limit"),
        }
    }

    #[must_use]
    pub(crate) fn open(
        key: &[u8; KEY_LEN],
        nonce: &[u8; NONCE_LEN],
        aad: &[u8],
        body: &mut [u8],
        tag: &[u8; TAG_LEN],
    ) -> bool {
        XChaCha20Poly1305::new(key.into())
            .decrypt_in_place_detached(XNonce::from_slice(nonce), aad, body, Tag::from_slice(tag))
            .is_ok()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use chacha20poly1305::aead::{AeadInPlace, KeyInit};
    use chacha20poly1305::{XChaCha20Poly1305, XNonce};

    /// Ciphertext and tag equal to a reference implementation's (the lengths name the case).
    pub(crate) fn assert_sealed_alike(ours: (&[u8], &[u8]), reference: (&[u8], &[u8])) {
        let len = ours.0.len();
        assert_eq!(ours.0, reference.0, "ciphertext of {len} bytes");
        assert_eq!(ours.1, reference.1, "tag of {len} bytes");
    }

    /// The bytes a string of hex digits spells (test vectors).
    pub(crate) fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
            .collect()
    }

    /// The test vector of draft-irtf-cfrg-xchacha-03, appendix A.3.1.
    #[test]
    fn seals_and_opens_the_drafts_vector() {
        let key: [u8; KEY_LEN] = std::array::from_fn(|i| 0x80 + i as u8);
        let nonce: [u8; NONCE_LEN] = std::array::from_fn(|i| 0x40 + i as u8);
        let aad = hex("50515253c0c1c2c3c4c5c6c7");
        let plain = b"Ladies and Gentlemen of the class of '99: If I could offer you only one \
            tip for the future, sunscreen would be it.";
        let cipher = hex(
            "bd6d179d3e83d43b9576579493c0e939572a1700252bfaccbed2902c21396cbb731c7f1b0b4aa644\
             0bf3a82f4eda7e39ae64c6708c54c216cb96b72e1213b4522f8c9ba40db5d945b11b69b982c1bb9e\
             3f3fac2bc369488f76b2383565d3fff921f9664c97637da9768812f615c68b13b52e",
        );
        let tag = hex("c0875924c1c7987947deafd8780acf49");
        let mut body = plain.to_vec();
        assert_eq!(seal(&key, &nonce, &aad, &mut body).as_slice(), tag);
        assert_eq!(body, cipher);
        let tag: [u8; TAG_LEN] = tag.try_into().expect("16 bytes");
        assert!(open(&key, &nonce, &aad, &mut body, &tag));
        assert_eq!(body, plain);
    }

    /// The cipher in use (the aws-lc-rs construction in workspace builds) seals byte for byte
    /// like RustCrypto's `XChaCha20Poly1305`, opens what it sealed, and refuses any change:
    /// tokens and accepts made either way interoperate.
    #[test]
    fn matches_the_rustcrypto_reference() {
        let aad = b"bound in clear".as_slice();
        for (case, len) in [0usize, 1, 15, 16, 17, 24, 64, 65, 1024]
            .into_iter()
            .enumerate()
        {
            let key: [u8; KEY_LEN] = std::array::from_fn(|i| (i * 7 + case) as u8);
            let nonce: [u8; NONCE_LEN] = std::array::from_fn(|i| (i * 13 + 5 * case) as u8);
            let plain: Vec<u8> = (0..len).map(|i| (i * 31) as u8).collect();
            let mut ours = plain.clone();
            let tag = seal(&key, &nonce, aad, &mut ours);
            let mut reference = plain.clone();
            let reference_tag = XChaCha20Poly1305::new(&key.into())
                .encrypt_in_place_detached(XNonce::from_slice(&nonce), aad, &mut reference)
                .expect("a small input seals");
            assert_sealed_alike((&ours, &tag), (&reference, &reference_tag));
            let mut opened = reference.clone();
            assert!(open(&key, &nonce, aad, &mut opened, &tag));
            assert_eq!(opened, plain);
            // A flipped bit of the ciphertext, tag, nonce or associated data fails.
            if len > 0 {
                let mut bad = reference.clone();
                bad[len / 2] ^= 1;
                assert!(!open(&key, &nonce, aad, &mut bad, &tag));
            }
            let mut bad_tag = tag;
            bad_tag[0] ^= 0x80;
            assert!(!open(&key, &nonce, aad, &mut reference.clone(), &bad_tag));
            let mut bad_nonce = nonce;
            bad_nonce[23] ^= 1;
            assert!(!open(&key, &bad_nonce, aad, &mut reference.clone(), &tag));
            assert!(!open(&key, &nonce, b"other", &mut reference.clone(), &tag));
        }
    }
}
