//! `bench report`: regenerate `PERFORMANCE.md`'s generated sections and `docs/perf/*.svg` from
//! the JSON under `results/` (see [`crate::report`]).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;

use super::Global;
use crate::report::{render, splice, Inputs, FRONT_SECTION};

/// Flags of `bench report`.
#[derive(Debug, Clone, Args)]
pub struct ReportArgs {
    /// Repository root holding `PERFORMANCE.md`, `results/` and `docs/perf/` (default: the
    /// source tree this binary was built from).
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
    /// Change nothing; exit 1 when a file would change (for CI).
    #[arg(long)]
    pub check: bool,
}

/// Where the charts go, relative to the repository root (and to `PERFORMANCE.md`).
pub const CHART_DIR: &str = "docs/perf";

/// The archive page (every table, the environment, the refused files), beside the charts.
pub const ARCHIVE: &str = "docs/perf/archive.md";

/// The archive page's start when it does not exist yet.
const ARCHIVE_HEAD: &str = "# Ricochet performance: the archive\n\nEvery result under `results/`, \
rendered by `cargo run --release -p bench -- report`; the front page is `PERFORMANCE.md`.\n";

/// Every file the report writes, with its new content: `PERFORMANCE.md` first, then the
/// archive page, then the charts in name order. `results` defaults to `<root>/results`.
pub fn plan(root: &Path, results: Option<&Path>) -> Result<Vec<(PathBuf, String)>> {
    let results = results
        .map(Path::to_path_buf)
        .unwrap_or_else(|| root.join("results"));
    let inputs = Inputs::load(&results)?;
    let rendered = render(&inputs, CHART_DIR)?;
    let doc_path = root.join("PERFORMANCE.md");
    let doc = std::fs::read_to_string(&doc_path)
        .with_context(|| format!("reading {}", doc_path.display()))?;
    let front = rendered.sections_where(|n| n == FRONT_SECTION);
    let archive = rendered.sections_where(|n| n != FRONT_SECTION);
    let archive_path = root.join(ARCHIVE);
    let archive_doc =
        std::fs::read_to_string(&archive_path).unwrap_or_else(|_| ARCHIVE_HEAD.to_string());
    let mut out = vec![
        (doc_path, splice(&doc, &front)?),
        (archive_path, splice(&archive_doc, &archive)?),
    ];
    for (file, svg) in &rendered.charts {
        out.push((root.join(CHART_DIR).join(file), svg.clone()));
    }
    Ok(out)
}

/// `bench report`.
pub fn run(args: &ReportArgs, global: &Global) -> Result<bool> {
    let root = args
        .root
        .clone()
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join(".."));
    let files = plan(&root, global.results_dir.as_deref())?;
    let mut changed = Vec::new();
    for (path, content) in &files {
        let old = std::fs::read_to_string(path).ok();
        if old.as_deref() == Some(content.as_str()) {
            continue;
        }
        changed.push(path.clone());
        if !args.check {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
            }
            std::fs::write(path, content).with_context(|| format!("writing {}", path.display()))?;
        }
    }
    for p in &changed {
        println!(
            "{} {}",
            if args.check { "would change" } else { "wrote" },
            p.display()
        );
    }
    if changed.is_empty() {
        println!("report: {} files up to date", files.len());
    }
    Ok(!args.check || changed.is_empty())
}
