//! No function of the protocol core (`ricochet-proto`) longer than 120 lines, its unit tests
//! left out (issue 37): a function that grows past it does more than one step of its room's
//! work and is split into named steps. A function is measured from the line of its `fn` to
//! its closing brace; braces in comments, strings and character literals do not count.

mod common;

use common::rust_files;
use std::path::Path;

/// The source tree held to the limit, relative to the workspace root.
const TREE: &str = "engine/proto/src";

const LIMIT: usize = 120;

/// A file of unit tests only (`tests.rs`, or `x_tests.rs` beside `x.rs`).
fn is_test_file(path: &Path) -> bool {
    let name = path.file_stem().and_then(|n| n.to_str()).unwrap_or("");
    name == "tests" || name.ends_with("_tests")
}

/// `text` with comments, string and character literals blanked (newlines kept), so that the
/// braces left are the code's.
fn blank_literals(text: &str) -> Vec<u8> {
    let b = text.as_bytes();
    let mut out = b.to_vec();
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for c in &mut out[from..to.min(b.len())] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    };
    let mut i = 0;
    while i < b.len() {
        let rest = &b[i..];
        let ident_before = i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        let end = if rest.starts_with(b"//") {
            rest.iter()
                .position(|&c| c == b'\n')
                .map_or(b.len(), |n| i + n)
        } else if rest.starts_with(b"/*") {
            let (mut depth, mut j) = (1, i + 2);
            while j < b.len() && depth > 0 {
                if b[j..].starts_with(b"/*") {
                    depth += 1;
                    j += 2;
                } else if b[j..].starts_with(b"*/") {
                    depth -= 1;
                    j += 2;
                } else {
                    j += 1;
                }
            }
            j
        } else if !ident_before && (rest.starts_with(b"r\"") || rest.starts_with(b"r#")) {
            let hashes = rest[1..].iter().take_while(|&&c| c == b'#').count();
            if rest.get(1 + hashes) != Some(&b'"') {
                i += 1;
                continue;
            }
            let close: Vec<u8> = std::iter::once(b'"')
                .chain(std::iter::repeat_n(b'#', hashes))
                .collect();
            let body = i + 2 + hashes;
            (body..b.len())
                .find(|&j| b[j..].starts_with(&close))
                .map_or(b.len(), |j| j + close.len())
        } else if rest[0] == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            j + 1
        } else if rest[0] == b'\'' {
            // A character literal ('x', '\n', '\u{7f}'); anything else is a lifetime.
            let close = if rest.get(1) == Some(&b'\\') {
                rest[2..].iter().position(|&c| c == b'\'').map(|n| n + 2)
            } else {
                (rest.get(2) == Some(&b'\'')).then_some(2)
            };
            match close {
                Some(n) => i + n + 1,
                None => {
                    i += 1;
                    continue;
                }
            }
        } else {
            i += 1;
            continue;
        };
        blank(&mut out, i, end);
        i = end;
    }
    out
}

/// `(name, first line, lines)` of every function with a body in `text` (1-based lines).
fn functions(text: &str) -> Vec<(String, usize, usize)> {
    let code = blank_literals(text);
    let code = String::from_utf8_lossy(&code);
    let mut starts = vec![0];
    starts.extend(code.match_indices('\n').map(|(i, _)| i + 1));
    let line_of = |pos: usize| starts.partition_point(|&s| s <= pos);
    let mut found = Vec::new();
    for (at, _) in code.match_indices("fn ") {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let name: String = code[at + 3..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() {
            continue; // `fn(u8)`: a function pointer type
        }
        // The body opens at the first `{` outside brackets, unless a `;` comes first (a
        // declaration without a body; a `;` inside brackets is an array type's).
        let mut nesting = 0i32;
        let open = code[at..].char_indices().find_map(|(n, c)| {
            match c {
                '(' | '[' => nesting += 1,
                ')' | ']' => nesting -= 1,
                '{' | ';' if nesting == 0 => return Some(at + n),
                _ => {}
            }
            None
        });
        let Some(open) = open.filter(|&o| code.as_bytes()[o] == b'{') else {
            continue;
        };
        let mut depth = 0usize;
        let close = code[open..].char_indices().find_map(|(n, c)| {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                _ => {}
            }
            (depth == 0).then_some(open + n)
        });
        let Some(close) = close else { continue };
        let first = line_of(at);
        found.push((name, first, line_of(close) - first + 1));
    }
    found
}

#[test]
fn no_function_of_the_protocol_core_above_the_limit() {
    let ws = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    rust_files(&ws.join(TREE), &mut files);
    files.retain(|f| !is_test_file(f));
    assert!(files.len() > 50, "found only {} files", files.len());
    let (mut measured, mut long) = (0, Vec::new());
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        // A file's unit tests: from its first `#[cfg(test)]` at the start of a line on.
        let code: String = text
            .lines()
            .take_while(|l| !l.starts_with("#[cfg(test)]"))
            .map(|l| format!("{l}\n"))
            .collect();
        for (name, line, n) in functions(&code) {
            measured += 1;
            if n > LIMIT {
                let file = f.strip_prefix(&ws).unwrap_or(f).display().to_string();
                long.push(format!("{file}:{line} {name} ({n} lines)"));
            }
        }
    }
    assert!(measured > 500, "measured only {measured} functions");
    long.sort();
    assert!(
        long.is_empty(),
        "over {LIMIT} lines (split into named steps): {long:?}"
    );
}

/// The measure: from the `fn` line to the closing brace, braces in literals and comments
/// ignored, declarations without a body and function pointer types skipped.
#[test]
fn functions_are_measured_to_their_closing_brace() {
    let text = "trait T {\n    fn d(&self);\n}\nfn f(x: fn(u8), a: [u8; 2]) -> u8 {\n    let s = \"}\";\n    let c = '{';\n    // }\n    /* { */\n    let r = r#\"}\"#;\n    g(|| { 1 })\n}\nfn h<'a>(x: &'a u8) {}\n";
    assert_eq!(
        functions(text),
        vec![("f".to_string(), 4, 8), ("h".to_string(), 12, 1)]
    );
}
