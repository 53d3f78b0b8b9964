//! The checked-in header equals what cbindgen generates from the crate (with
//! `RICOCHET_BLESS_HEADER=1`, the test writes it instead).

use std::path::Path;

#[test]
fn the_checked_in_header_is_what_cbindgen_generates() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header")
        .write(&mut generated);
    let generated = String::from_utf8(generated).expect("UTF-8 header");
    let path = dir.join("include/ricochet.h");
    if std::env::var_os("RICOCHET_BLESS_HEADER").is_some() {
        std::fs::write(&path, &generated).expect("write include/ricochet.h");
        return;
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "include/ricochet.h is stale: regenerate it with \
         `RICOCHET_BLESS_HEADER=1 cargo test -p ricochet-ffi --test header`"
    );
}
