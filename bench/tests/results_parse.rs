//! Every committed result file this crate owns parses with the current schema, so a schema
//! change cannot silently orphan the archive (bump `schema_version` and convert instead).

use std::path::Path;

use bench::schema::ResultFile;

#[test]
fn committed_results_parse() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../results");
    let Ok(dirs) = std::fs::read_dir(&root) else {
        return; // no archive in this checkout
    };
    let mut checked = 0;
    for dir in dirs.flatten() {
        let Ok(files) = std::fs::read_dir(dir.path()) else {
            continue;
        };
        for f in files.flatten() {
            let name = f.file_name().to_string_lossy().into_owned();
            let ours = (name.starts_with("udp-")
                || name.starts_with("tour-")
                || name.starts_with("rudp-")
                || name.starts_with("sessions-")
                || name.starts_with("game-"))
                && name.ends_with(".json");
            if !ours {
                continue;
            }
            let text = std::fs::read_to_string(f.path()).unwrap();
            let file = ResultFile::from_json(&text)
                .unwrap_or_else(|e| panic!("{}: {e:#}", f.path().display()));
            // RUDP files written before `rss` existed read too (it is optional).
            assert!(
                !file.udp_runs.is_empty()
                    || !file.rudp_cases.is_empty()
                    || !file.sessions_runs.is_empty()
                    || !file.game_runs.is_empty(),
                "{}",
                f.path().display()
            );
            assert!(!file.command_line.is_empty());
            checked += 1;
        }
    }
    eprintln!("{checked} result files parsed");
}
