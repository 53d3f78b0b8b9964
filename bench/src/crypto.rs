//! `bench crypto`: what packet protection costs per packet, and the AEAD candidates side by side.
//!
//! Every figure is one in-place seal (encrypt + 16-byte tag) or one open (verify + decrypt) of
//! a packet body of the given size into another buffer, with an 18-byte header as associated
//! data and a nonce from a packet number, as the connection does it (a received datagram is
//! borrowed: a crate that only decrypts in place pays a copy first, counted here). Each is the median over `--iters` samples of a
//! batch lasting a few microseconds. Every open of a sealed packet is checked once before timing,
//! and so is the refusal of a packet with one bit flipped.
//!
//! By default it measures the protection `ricochet-proto` uses ([`ricochet_proto::PacketKey`]).
//! Built with `--features aead-candidates` it also measures the crates the choice was made
//! between: `aws-lc-rs` and `ring` (AES-128-GCM, AES-256-GCM, ChaCha20-Poly1305) and
//! RustCrypto's `aes-gcm` (AES-128-GCM, AES-256-GCM) and `chacha20poly1305`.
//!
//! Then the connect token's sealed part: what a backend pays to seal one
//! ([`PrivateToken::seal`]: encoding, nonce, XChaCha20-Poly1305) and a server to open one per
//! hello ([`PrivateToken::unseal`]: the AEAD, then decoding); with the candidates, RustCrypto's
//! `XChaCha20Poly1305` alone over the same bytes (the AEAD without the encoding around it).

use bench::commands::Global;
use ricochet_proto::token::{PrivateToken, TokenKey, PRIVATE_LEN};

use crate::fec::median_ns;
use anyhow::{bail, ensure, Context, Result};
use bench::host::{command_line, BuildInfo, HostInfo, UtcTime};
use serde::Serialize;

/// Options of `bench crypto`.
#[derive(clap::Args, Debug, Clone)]
pub struct CryptoArgs {
    /// Timed samples per figure; the median is reported.
    #[arg(long, default_value_t = 2000)]
    pub iters: usize,
    /// Packet body sizes in bytes (what is encrypted), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "64,1200")]
    pub sizes: Vec<usize>,
}

/// Associated data: a `Data` packet header (type, version, cid, packet number).
const AAD_LEN: usize = 18;
/// Tag bytes of every candidate.
const TAG_LEN: usize = 16;

/// One AEAD under test.
trait Candidate {
    /// Crate name.
    fn crate_name(&self) -> &'static str;
    /// Algorithm.
    fn algorithm(&self) -> &'static str;
    /// Seals `body` in place and writes the tag.
    fn seal(&self, pn: u64, aad: &[u8], body: &mut [u8], tag: &mut [u8; TAG_LEN]);
    /// Opens `ciphertext` into `out` (same length), as a connection opens a datagram it
    /// borrows; false when the tag does not verify. An AEAD that only decrypts in place
    /// copies first: that copy is part of its cost here.
    fn open(
        &self,
        pn: u64,
        aad: &[u8],
        ciphertext: &[u8],
        tag: &[u8; TAG_LEN],
        out: &mut [u8],
    ) -> bool;
}

/// The protection the connection uses.
struct Proto(ricochet_proto::PacketKey);

impl Candidate for Proto {
    fn crate_name(&self) -> &'static str {
        "ricochet-proto"
    }
    fn algorithm(&self) -> &'static str {
        ricochet_proto::PacketKey::ALGORITHM
    }
    fn seal(&self, pn: u64, aad: &[u8], body: &mut [u8], tag: &mut [u8; TAG_LEN]) {
        *tag = self.0.seal(pn, aad, body);
    }
    fn open(
        &self,
        pn: u64,
        aad: &[u8],
        ciphertext: &[u8],
        tag: &[u8; TAG_LEN],
        out: &mut [u8],
    ) -> bool {
        self.0.open_to(pn, aad, ciphertext, tag, out).is_ok()
    }
}

/// The 12-byte nonce of packet `pn`: four zero bytes, then the number big-endian.
#[cfg(feature = "aead-candidates")]
fn nonce(pn: u64) -> [u8; 12] {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&pn.to_be_bytes());
    n
}

#[cfg(feature = "aead-candidates")]
mod candidates {
    use super::{nonce, Candidate, TAG_LEN};

    pub struct Ring(pub ring::aead::LessSafeKey, pub &'static str);

    impl Ring {
        pub fn new(alg: &'static ring::aead::Algorithm, name: &'static str) -> Self {
            let key = ring::aead::UnboundKey::new(alg, &[7u8; 32][..alg.key_len()])
                .expect("key length matches the algorithm");
            Ring(ring::aead::LessSafeKey::new(key), name)
        }
    }

    impl Candidate for Ring {
        fn crate_name(&self) -> &'static str {
            "ring"
        }
        fn algorithm(&self) -> &'static str {
            self.1
        }
        fn seal(&self, pn: u64, aad: &[u8], body: &mut [u8], tag: &mut [u8; TAG_LEN]) {
            let t = self
                .0
                .seal_in_place_separate_tag(
                    ring::aead::Nonce::assume_unique_for_key(nonce(pn)),
                    ring::aead::Aad::from(aad),
                    body,
                )
                .expect("packet sizes are far below the limit");
            tag.copy_from_slice(t.as_ref());
        }
        fn open(
            &self,
            pn: u64,
            aad: &[u8],
            ciphertext: &[u8],
            tag: &[u8; TAG_LEN],
            out: &mut [u8],
        ) -> bool {
            out.copy_from_slice(ciphertext);
            let t = ring::aead::Tag::from(*tag);
            self.0
                .open_in_place_separate_tag(
                    ring::aead::Nonce::assume_unique_for_key(nonce(pn)),
                    ring::aead::Aad::from(aad),
                    t,
                    out,
                    0..,
                )
                .is_ok()
        }
    }

    pub struct AwsLc(pub aws_lc_rs::aead::LessSafeKey, pub &'static str);

    impl AwsLc {
        pub fn new(alg: &'static aws_lc_rs::aead::Algorithm, name: &'static str) -> Self {
            let key = aws_lc_rs::aead::UnboundKey::new(alg, &[7u8; 32][..alg.key_len()])
                .expect("key length matches the algorithm");
            AwsLc(aws_lc_rs::aead::LessSafeKey::new(key), name)
        }
    }

    impl Candidate for AwsLc {
        fn crate_name(&self) -> &'static str {
            "aws-lc-rs"
        }
        fn algorithm(&self) -> &'static str {
            self.1
        }
        fn seal(&self, pn: u64, aad: &[u8], body: &mut [u8], tag: &mut [u8; TAG_LEN]) {
            let t = self
                .0
                .seal_in_place_separate_tag(
                    aws_lc_rs::aead::Nonce::assume_unique_for_key(nonce(pn)),
                    aws_lc_rs::aead::Aad::from(aad),
                    body,
                )
                .expect("packet sizes are far below the limit");
            tag.copy_from_slice(t.as_ref());
        }
        fn open(
            &self,
            pn: u64,
            aad: &[u8],
            ciphertext: &[u8],
            tag: &[u8; TAG_LEN],
            out: &mut [u8],
        ) -> bool {
            self.0
                .open_separate_gather(
                    aws_lc_rs::aead::Nonce::assume_unique_for_key(nonce(pn)),
                    aws_lc_rs::aead::Aad::from(aad),
                    ciphertext,
                    tag,
                    out,
                )
                .is_ok()
        }
    }

    /// A RustCrypto AEAD (`aes-gcm` or `chacha20poly1305`).
    pub struct Rc<A>(pub A, pub &'static str, pub &'static str);

    impl<A: aes_gcm::aead::AeadInPlace> Candidate for Rc<A>
    where
        A: aes_gcm::aead::AeadCore<
            NonceSize = aes_gcm::aead::consts::U12,
            TagSize = aes_gcm::aead::consts::U16,
        >,
    {
        fn crate_name(&self) -> &'static str {
            self.1
        }
        fn algorithm(&self) -> &'static str {
            self.2
        }
        fn seal(&self, pn: u64, aad: &[u8], body: &mut [u8], tag: &mut [u8; TAG_LEN]) {
            let n = nonce(pn);
            let t = self
                .0
                .encrypt_in_place_detached((&n).into(), aad, body)
                .expect("packet sizes are far below the limit");
            tag.copy_from_slice(&t);
        }
        fn open(
            &self,
            pn: u64,
            aad: &[u8],
            ciphertext: &[u8],
            tag: &[u8; TAG_LEN],
            out: &mut [u8],
        ) -> bool {
            out.copy_from_slice(ciphertext);
            let n = nonce(pn);
            self.0
                .decrypt_in_place_detached((&n).into(), aad, out, tag.into())
                .is_ok()
        }
    }

    pub fn all() -> Vec<Box<dyn Candidate>> {
        use aes_gcm::KeyInit;
        vec![
            Box::new(AwsLc::new(&aws_lc_rs::aead::AES_128_GCM, "AES-128-GCM")),
            Box::new(AwsLc::new(&aws_lc_rs::aead::AES_256_GCM, "AES-256-GCM")),
            Box::new(AwsLc::new(
                &aws_lc_rs::aead::CHACHA20_POLY1305,
                "ChaCha20-Poly1305",
            )),
            Box::new(Ring::new(&ring::aead::AES_128_GCM, "AES-128-GCM")),
            Box::new(Ring::new(&ring::aead::AES_256_GCM, "AES-256-GCM")),
            Box::new(Ring::new(
                &ring::aead::CHACHA20_POLY1305,
                "ChaCha20-Poly1305",
            )),
            Box::new(Rc(
                aes_gcm::Aes128Gcm::new((&[7u8; 16]).into()),
                "aes-gcm",
                "AES-128-GCM",
            )),
            Box::new(Rc(
                aes_gcm::Aes256Gcm::new((&[7u8; 32]).into()),
                "aes-gcm",
                "AES-256-GCM",
            )),
            Box::new(Rc(
                chacha20poly1305::ChaCha20Poly1305::new((&[7u8; 32]).into()),
                "chacha20poly1305",
                "ChaCha20-Poly1305",
            )),
        ]
    }
}

fn candidates() -> Vec<Box<dyn Candidate>> {
    let proto: Box<dyn Candidate> = Box::new(Proto(ricochet_proto::PacketKey::new(&[7u8; 32])));
    #[cfg(feature = "aead-candidates")]
    return std::iter::once(proto).chain(candidates::all()).collect();
    #[cfg(not(feature = "aead-candidates"))]
    vec![proto]
}

/// One candidate's figures for one size.
#[derive(Serialize, Debug, Clone)]
struct Row {
    #[serde(rename = "crate")]
    crate_name: &'static str,
    algorithm: &'static str,
    body_bytes: usize,
    seal_ns: f64,
    open_ns: f64,
    /// Body bytes sealed per second, in GB/s (10^9).
    seal_gbps: f64,
    /// Body bytes opened per second, in GB/s (10^9).
    open_gbps: f64,
    /// A forged packet (one bit flipped) refused: the cost of a tag failure.
    reject_ns: f64,
}

/// One way of sealing and opening a connect token's private part ([`PRIVATE_LEN`] bytes,
/// 32 bytes of associated data).
#[derive(Serialize, Debug, Clone)]
struct TokenRow {
    #[serde(rename = "crate")]
    crate_name: &'static str,
    /// What is timed.
    operation: &'static str,
    body_bytes: usize,
    seal_ns: f64,
    open_ns: f64,
}

/// The connect token's sealed part through `ricochet-proto`'s API (and, with the candidates,
/// RustCrypto's cipher alone), each checked once: what was sealed opens to the same token,
/// and a flipped bit is refused.
fn token_rows(iters: usize) -> Result<Vec<TokenRow>> {
    use ricochet_proto::SessionKeys;
    let key = TokenKey::from_bytes([9; 32]);
    let private = PrivateToken {
        client_id: 7,
        server_addresses: vec!["127.0.0.1:7777".parse()?],
        keys: SessionKeys {
            client_to_server: [1; 32],
            server_to_client: [2; 32],
        },
        user_data: bytes::Bytes::from_static(b"player 7"),
    };
    let (protocol, expires) = (0x5e55, u64::MAX);
    let mut rng = rand::rng();
    let sealed = private.seal(&key, protocol, expires, &mut rng)?;
    ensure!(
        PrivateToken::unseal(&key, protocol, expires, &sealed)? == private,
        "a sealed token did not open to itself"
    );
    let mut forged = sealed.clone();
    forged.bytes[0] ^= 1;
    ensure!(
        PrivateToken::unseal(&key, protocol, expires, &forged).is_err(),
        "a token with a flipped bit opened"
    );
    let seal_ns = median_ns(iters, || {
        let _ = private.seal(&key, protocol, expires, &mut rng);
    });
    let open_ns = median_ns(iters, || {
        let _ = PrivateToken::unseal(&key, protocol, expires, &sealed);
    });
    #[allow(unused_mut)]
    let mut rows = vec![TokenRow {
        crate_name: "ricochet-proto",
        operation: "token seal / open (encode + AEAD)",
        body_bytes: PRIVATE_LEN,
        seal_ns,
        open_ns,
    }];
    #[cfg(feature = "aead-candidates")]
    {
        use chacha20poly1305::aead::{AeadInPlace, KeyInit};
        use chacha20poly1305::{XChaCha20Poly1305, XNonce};
        let (aad, nonce) = ([3u8; 32], XNonce::from([4u8; 24]));
        let cipher = || XChaCha20Poly1305::new(&[9u8; 32].into());
        let mut sealed_body = [5u8; PRIVATE_LEN];
        let tag = cipher()
            .encrypt_in_place_detached(&nonce, &aad, &mut sealed_body)
            .map_err(|_| anyhow::anyhow!("RustCrypto XChaCha20-Poly1305 seal"))?;
        let mut opened = sealed_body;
        ensure!(
            cipher()
                .decrypt_in_place_detached(&nonce, &aad, &mut opened, &tag)
                .is_ok()
                && opened == [5u8; PRIVATE_LEN],
            "RustCrypto XChaCha20-Poly1305 did not open what it sealed"
        );
        // Each pass works on a fresh copy of the body, as the token's seal and open do.
        let seal_ns = median_ns(iters, || {
            let mut b = [5u8; PRIVATE_LEN];
            let _ = cipher().encrypt_in_place_detached(&nonce, &aad, &mut b);
        });
        let open_ns = median_ns(iters, || {
            let mut b = sealed_body;
            let _ = cipher().decrypt_in_place_detached(&nonce, &aad, &mut b, &tag);
        });
        rows.push(TokenRow {
            crate_name: "chacha20poly1305",
            operation: "XChaCha20-Poly1305 seal / open (AEAD alone)",
            body_bytes: PRIVATE_LEN,
            seal_ns,
            open_ns,
        });
    }
    Ok(rows)
}

#[derive(Serialize)]
struct Report<'a> {
    kind: &'static str,
    created_unix_s: u64,
    created_utc: String,
    command: String,
    host: HostInfo,
    build: BuildInfo,
    iters: usize,
    aad_bytes: usize,
    results: &'a [Row],
    /// The connect token's sealed part.
    token: &'a [TokenRow],
}

fn measure(c: &dyn Candidate, size: usize, iters: usize) -> Result<Row> {
    let aad: Vec<u8> = (0..AAD_LEN as u8).collect();
    let plain: Vec<u8> = (0..size).map(|i| (i * 31 + 7) as u8).collect();
    let (name, alg) = (c.crate_name(), c.algorithm());
    // Correctness once: round trip, and a flipped bit refused.
    let mut body = plain.clone();
    let mut tag = [0u8; TAG_LEN];
    c.seal(42, &aad, &mut body, &mut tag);
    ensure!(
        size == 0 || body != plain,
        "{name} {alg}: seal left the body in clear"
    );
    let sealed = body.clone();
    let mut out = vec![0u8; size];
    ensure!(
        c.open(42, &aad, &sealed, &tag, &mut out),
        "{name} {alg}: open failed"
    );
    ensure!(out == plain, "{name} {alg}: open did not restore the body");
    let mut forged = sealed.clone();
    let mut bad = tag;
    if let Some(b) = forged.first_mut() {
        *b ^= 1;
    } else {
        bad[0] ^= 1;
    }
    ensure!(
        !c.open(42, &aad, &forged, &bad, &mut out),
        "{name} {alg}: a flipped bit was accepted"
    );
    ensure!(
        !c.open(43, &aad, &sealed, &tag, &mut out),
        "{name} {alg}: another packet number was accepted"
    );
    let mut pn = 0u64;
    let mut buf = plain.clone();
    let mut t = [0u8; TAG_LEN];
    let seal_ns = median_ns(iters, || {
        pn += 1;
        c.seal(pn, &aad, &mut buf, &mut t);
    });
    // Opening the same sealed packet again and again (the connection's replay window would
    // refuse it; the AEAD does not know).
    let open_ns = median_ns(iters, || {
        let _ = c.open(42, &aad, &sealed, &tag, &mut out);
    });
    let mut bad = tag;
    bad[TAG_LEN - 1] ^= 0x80;
    let reject_ns = median_ns(iters, || {
        let _ = c.open(42, &aad, &sealed, &bad, &mut out);
    });
    let gbps = |ns: f64| if ns > 0.0 { size as f64 / ns } else { 0.0 };
    Ok(Row {
        crate_name: name,
        algorithm: alg,
        body_bytes: size,
        seal_ns,
        open_ns,
        seal_gbps: gbps(seal_ns),
        open_gbps: gbps(open_ns),
        reject_ns,
    })
}

/// Runs `bench crypto`: prints the table and writes the JSON (`--json`, `--archive`, `--results-dir`).
pub fn run(args: &CryptoArgs, out: &Global) -> Result<()> {
    if cfg!(debug_assertions) {
        eprintln!("warning: debug build; run with --release for meaningful figures");
    }
    if args.sizes.is_empty() {
        bail!("no sizes to measure");
    }
    println!(
        "{:<18} {:<18} {:>7} {:>9} {:>9} {:>7} {:>7} {:>10}",
        "crate", "algorithm", "body B", "seal ns", "open ns", "seal GB/s", "open GB/s", "reject ns"
    );
    let mut rows = Vec::new();
    for &size in &args.sizes {
        for c in candidates() {
            let r = measure(c.as_ref(), size, args.iters)
                .with_context(|| format!("{} {} {size} B", c.crate_name(), c.algorithm()))?;
            println!(
                "{:<18} {:<18} {:>7} {:>9.1} {:>9.1} {:>9.2} {:>9.2} {:>10.1}",
                r.crate_name,
                r.algorithm,
                r.body_bytes,
                r.seal_ns,
                r.open_ns,
                r.seal_gbps,
                r.open_gbps,
                r.reject_ns
            );
            rows.push(r);
        }
    }
    println!();
    println!(
        "{:<18} {:<44} {:>7} {:>9} {:>9}",
        "crate", "connect token", "body B", "seal ns", "open ns"
    );
    let token = token_rows(args.iters).context("connect token")?;
    for r in &token {
        println!(
            "{:<18} {:<44} {:>7} {:>9.1} {:>9.1}",
            r.crate_name, r.operation, r.body_bytes, r.seal_ns, r.open_ns
        );
    }
    {
        let now = UtcTime::now();
        let path = &out.path_for("crypto", &now);
        let report = Report {
            kind: "crypto",
            created_unix_s: now.unix_s,
            created_utc: now.iso(),
            command: command_line(),
            host: HostInfo::collect(),
            build: BuildInfo::collect(),
            iters: args.iters,
            aad_bytes: AAD_LEN,
            results: &rows,
            token: &token,
        };
        bench::output::write_json(&report, path)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_candidate_round_trips_and_refuses_forgeries() {
        for c in candidates() {
            for size in [0, 1, 64, 1200] {
                let r = measure(c.as_ref(), size, 3).unwrap();
                assert!(r.seal_ns > 0.0, "{} {}", r.crate_name, r.algorithm);
            }
        }
    }

    #[test]
    fn token_rows_round_trip_and_time_every_way() {
        let rows = token_rows(3).unwrap();
        assert_eq!(
            rows.len(),
            if cfg!(feature = "aead-candidates") {
                2
            } else {
                1
            }
        );
        assert!(rows.iter().all(|r| r.seal_ns > 0.0 && r.open_ns > 0.0));
    }
}
