//! The README's code is real: its server and client blocks are, byte for byte, the bodies of
//! `examples/readme_server.rs` and `examples/readme_client.rs`, which CI builds (and clippy
//! checks). Edit the example, then paste it into the README (or the other way round).

use std::path::Path;

/// The README's ```` ```rust ```` blocks, in order.
fn readme_rust_blocks() -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    let text = std::fs::read_to_string(&path).expect("README.md at the repository root");
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        match &mut current {
            None if line.starts_with("```rust") => current = Some(String::new()),
            None => {}
            Some(_) if line == "```" => blocks.extend(current.take()),
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
        }
    }
    blocks
}

/// An example's code without its `//!` header and the blank line after it.
fn example_body(source: &str) -> String {
    let mut lines = source
        .lines()
        .skip_while(|l| l.starts_with("//!"))
        .peekable();
    if lines.peek() == Some(&"") {
        lines.next();
    }
    lines.map(|l| format!("{l}\n")).collect()
}

#[test]
fn readme_examples_are_the_example_files() {
    let blocks = readme_rust_blocks();
    let examples = [
        (
            "readme_server",
            include_str!("../examples/readme_server.rs"),
        ),
        (
            "readme_client",
            include_str!("../examples/readme_client.rs"),
        ),
    ];
    assert_eq!(
        blocks.len(),
        examples.len(),
        "README.md should have one ```rust block per example"
    );
    for (block, (name, source)) in blocks.iter().zip(examples) {
        assert_eq!(
            block,
            &example_body(source),
            "README.md's block differs from examples/{name}.rs"
        );
    }
}

/// The README promises a game server (the game profile, players admitted by connect token,
/// a graceful shutdown on Ctrl-C or SIGTERM) in at most 20 lines, and a client (a token minted
/// in place, the game profile, a game loop) in at most 15.
#[test]
fn readme_examples_stay_short() {
    let blocks = readme_rust_blocks();
    let lines: Vec<usize> = blocks.iter().map(|b| b.lines().count()).collect();
    assert_eq!(lines.len(), 2, "a server block and a client block");
    assert!(
        lines[0] <= 20 && lines[1] <= 15,
        "lines per block (server at most 20, client at most 15): {lines:?}"
    );
}
