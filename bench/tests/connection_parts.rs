//! `Connection` holds typed parts, at most 20 fields (issue 37): a new piece of connection
//! state goes into the part of the room that owns it (`engine/proto/src/connection/state.rs`
//! and the rooms beside it), not beside the parts.

use std::path::Path;

const LIMIT: usize = 20;

/// The names of the fields of `struct {name} { .. }` in `text` (a braced struct whose fields
/// each start a line, as rustfmt writes them).
fn fields(text: &str, name: &str) -> Vec<String> {
    let head = format!("pub struct {name} {{");
    let Some(start) = text.find(&head) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for line in text[start + head.len()..].lines() {
        let line = line.trim();
        if line.starts_with('}') {
            break;
        }
        if line.starts_with("//") || line.starts_with("#[") {
            continue;
        }
        // `pub(super) name: Type,` or `name: Type,`
        let decl = line.strip_prefix("pub").map_or(line, |rest| {
            rest.trim_start_matches(|c: char| c != ' ').trim_start()
        });
        if let Some((field, _)) = decl.split_once(':') {
            if !field.is_empty() && field.chars().all(|c| c.is_alphanumeric() || c == '_') {
                out.push(field.to_string());
            }
        }
    }
    out
}

#[test]
fn the_connection_holds_at_most_twenty_fields() {
    let ws = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let path = ws.join("engine/proto/src/connection/state.rs");
    let text = std::fs::read_to_string(&path).unwrap();
    let f = fields(&text, "Connection");
    assert!(
        f.len() >= 10,
        "found only {f:?}: is `Connection` still defined there?"
    );
    assert!(
        f.len() <= LIMIT,
        "{} fields, at most {LIMIT}: {f:?}",
        f.len()
    );
}

#[test]
fn fields_are_counted_past_comments_and_attributes() {
    let text = "pub struct Connection {\n    pub(super) cfg: Arc<Config>,\n    /// A doc: with a colon.\n    #[allow(x)]\n    side: Side,\n    pub events: VecDeque<Event>,\n}\nstruct Other {\n    x: u8,\n}\n";
    assert_eq!(fields(text, "Connection"), ["cfg", "side", "events"]);
}
