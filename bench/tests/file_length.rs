//! No source file of the protocol core or the runtime above 1,000 lines, its unit tests left
//! out (issue 37): a file that grows past it holds more than one room and is split by concern.
//! A file's unit tests are the lines from its first `#[cfg(test)]` at the start of a line on.

mod common;

use common::rust_files;
use std::path::Path;

/// The source trees held to the limit, relative to the workspace root.
const TREES: &[&str] = &["engine/src", "engine/proto/src"];

const LIMIT: usize = 1_000;

/// Lines before the file's unit tests.
fn code_lines(text: &str) -> usize {
    text.lines()
        .take_while(|l| !l.starts_with("#[cfg(test)]"))
        .count()
}

#[test]
fn no_source_file_above_the_limit_without_its_tests() {
    let ws = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for tree in TREES {
        rust_files(&ws.join(tree), &mut files);
    }
    assert!(files.len() > 50, "found only {} files", files.len());
    let mut long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let n = code_lines(&std::fs::read_to_string(f).unwrap());
            (n > LIMIT)
                .then(|| format!("{} ({n} lines)", f.strip_prefix(&ws).unwrap_or(f).display()))
        })
        .collect();
    long.sort();
    assert!(
        long.is_empty(),
        "over {LIMIT} lines without their tests (split by concern): {long:?}"
    );
}

/// The count stops at the tests and counts everything before them.
#[test]
fn tests_are_left_out_of_the_count() {
    let text = "use x;\n\nfn f() {}\n#[cfg(test)]\nmod tests {\n    fn t() {}\n}\n";
    assert_eq!(code_lines(text), 3);
    assert_eq!(code_lines("a\nb\n"), 2);
    // An indented `#[cfg(test)]` (an item inside a module) does not end the count.
    assert_eq!(code_lines("a\n    #[cfg(test)]\n    fn g() {}\nb\n"), 4);
}
