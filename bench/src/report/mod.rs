//! `bench report`: `PERFORMANCE.md` sections and SVG charts from the JSON under `results/`.
//!
//! The report is a pure function of the files it reads: inputs are read in sorted path order,
//! numbers are printed with fixed precision, and nothing records when the report ran, so running
//! it twice on the same `results/` gives identical bytes (a test checks the committed files).
//!
//! Two pages hold generated sections between `<!-- BEGIN generated:NAME -->` and
//! `<!-- END generated:NAME -->`: `PERFORMANCE.md`, the front page ([`FRONT_SECTION`]: how fast,
//! against what, from the newest side-by-side results), and `docs/perf/archive.md` (every other
//! section). Everything outside the markers is hand-written and kept. A section missing from
//! its page is appended at the end with its markers.
//!
//! `results/local/` is not read: that is where runs go unless `--archive` is given, so that
//! trying the benchmark does not change the report.
//!
//! Inputs it understands (by their own kind field): `tour` / `udp` / `udp-limits` / `rudp` /
//! `rudp-matrix` (the bench result schema), `platform-blast` (the platform crate's blast example), `fec-codecs` (`bench fec`), `ops` (`bench ops`), `lanes` (`bench lanes`), `large-messages` (`bench large-messages`), and the
//! gate baseline (`results/baseline/gate-*.json`: the simulated echo). A measurement
//! that failed or is incomplete is refused: left out of every table and chart and listed, with
//! the reason, in the `refused` section. Files of an unknown kind are listed there too.

mod charts;
mod ctx;
mod headline;
mod lanes;
mod large_messages;
mod ops;
mod reference;
mod rudp;
mod scale;
mod sections;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::gate::Baseline;
use crate::output::LOCAL_DIR;
use crate::schema::ResultFile;

pub use charts::Chart;
/// Renders every section and chart. `chart_dir` is the charts' path as seen from
/// `PERFORMANCE.md` (for the image links).
pub use sections::render_all as render;

/// One input file, parsed by kind.
// A report reads a few dozen files: the variants' size difference costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Input {
    /// A bench result file (`tour`, `udp`, `udp-limits`, `rudp`, `rudp-matrix`).
    Bench(ResultFile),
    /// The platform blast example's JSON.
    Blast(Value),
    /// `bench fec` codec timings.
    Fec(Value),
    /// `bench crypto` packet protection timings.
    Crypto(Value),
    /// `bench ffi`: the Rust, C and C# clients side by side.
    Ffi(Value),
    /// `bench ops`: metrics, scrape and conditioner costs.
    Ops(Value),
    /// `bench lanes`: players behind a bottleneck, the arms side by side.
    Lanes(Value),
    /// `bench large-messages`: large unreliable messages through loss, per FEC policy.
    LargeMessages(Value),
    /// The gate baseline (simulated echo metrics).
    Gate(Baseline),
}

/// Everything read from `results/`, in sorted path order.
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    /// (path relative to the results root, parsed file).
    pub files: Vec<(String, Input)>,
    /// (path, reason) of files or measurements not used.
    pub refused: Vec<(String, String)>,
}

fn collect_json(dir: &Path, skip: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    entries.sort();
    for p in entries {
        if p == skip {
            continue;
        } else if p.is_dir() {
            collect_json(&p, skip, out)?;
        } else if p.extension().is_some_and(|e| e == "json") {
            out.push(p);
        }
    }
    Ok(())
}

/// Parses one file's text; `Err` says why it is refused.
pub fn classify(text: &str) -> Result<Input, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    if v.get("schema_version").is_some() && v.get("udp_runs").is_some() {
        return ResultFile::from_json(text)
            .map(Input::Bench)
            .map_err(|e| format!("bench result schema: {e:#}"));
    }
    if v.get("kind").and_then(Value::as_str) == Some("gate-baseline") {
        return serde_json::from_value(v)
            .map(Input::Gate)
            .map_err(|e| format!("gate baseline schema: {e}"));
    }
    if v.get("kind").and_then(Value::as_str) == Some("gate") {
        return Err("a gate run's output (not a measurement to publish)".into());
    }
    if v.get("benchmark").and_then(Value::as_str) == Some("platform-blast") {
        return if v.get("rows").and_then(Value::as_array).is_some() {
            Ok(Input::Blast(v))
        } else {
            Err("platform-blast without rows".into())
        };
    }
    if v.get("bench").and_then(Value::as_str) == Some("fec")
        || v.get("kind").and_then(Value::as_str) == Some("fec-codecs")
    {
        return if v.get("results").and_then(Value::as_array).is_some() {
            Ok(Input::Fec(v))
        } else {
            Err("fec without results".into())
        };
    }
    if v.get("kind").and_then(Value::as_str) == Some("crypto") {
        return if v.get("results").and_then(Value::as_array).is_some() {
            Ok(Input::Crypto(v))
        } else {
            Err("crypto without results".into())
        };
    }
    if v.get("kind").and_then(Value::as_str) == Some("ffi") {
        return if v.get("kinds").and_then(Value::as_array).is_some() {
            Ok(Input::Ffi(v))
        } else {
            Err("ffi without kinds".into())
        };
    }
    if v.get("kind").and_then(Value::as_str) == Some("ops") {
        return if v.get("shape").is_some() {
            Ok(Input::Ops(v))
        } else {
            Err("ops without its echo shape".into())
        };
    }
    if v.get("kind").and_then(Value::as_str) == Some("lanes") {
        return if v.get("scenarios").and_then(Value::as_array).is_some() {
            Ok(Input::Lanes(v))
        } else {
            Err("lanes without scenarios".into())
        };
    }
    if v.get("kind").and_then(Value::as_str) == Some("large-messages") {
        return if v.get("runs").and_then(Value::as_array).is_some() {
            Ok(Input::LargeMessages(v))
        } else {
            Err("large-messages without runs".into())
        };
    }
    let kind = v
        .get("kind")
        .or_else(|| v.get("benchmark"))
        .or_else(|| v.get("bench"))
        .and_then(Value::as_str)
        .unwrap_or("unknown");
    Err(format!(
        "kind {kind:?}: this version of `bench report` has no renderer for it"
    ))
}

impl Inputs {
    /// Reads every `*.json` under `root`, recursively, in sorted order, except under
    /// `root/`[`LOCAL_DIR`] (runs that were not archived).
    pub fn load(root: &Path) -> Result<Inputs> {
        if !root.is_dir() {
            bail!("results directory {} does not exist", root.display());
        }
        let mut paths = Vec::new();
        collect_json(root, &root.join(LOCAL_DIR), &mut paths)?;
        let mut inputs = Inputs::default();
        for p in paths {
            let rel = p
                .strip_prefix(root)
                .unwrap_or(&p)
                .to_string_lossy()
                .replace('\\', "/");
            let rel = format!("results/{rel}");
            let text =
                std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
            match classify(&text) {
                Ok(i) => inputs.files.push((rel, i)),
                Err(why) => inputs.refused.push((rel, why)),
            }
        }
        Ok(inputs)
    }
}

/// The section of the front page (`PERFORMANCE.md`); every other section goes to the archive.
pub const FRONT_SECTION: &str = "headline";

/// The generated output: markdown sections by name and charts by file name.
#[derive(Debug, Clone, Default)]
pub struct Rendered {
    /// Section name → markdown (without markers).
    pub sections: BTreeMap<String, String>,
    /// Section names in document order.
    pub order: Vec<String>,
    /// Chart file name → SVG text.
    pub charts: BTreeMap<String, String>,
}

impl Rendered {
    /// The sections whose name `keep` accepts, in order (no charts).
    pub fn sections_where(&self, keep: impl Fn(&str) -> bool) -> Rendered {
        let order: Vec<String> = self.order.iter().filter(|n| keep(n)).cloned().collect();
        Rendered {
            sections: order
                .iter()
                .map(|n| (n.clone(), self.sections[n].clone()))
                .collect(),
            order,
            charts: BTreeMap::new(),
        }
    }
}

/// Replaces the generated sections of `doc`, keeping everything else; appends missing ones.
pub fn splice(doc: &str, rendered: &Rendered) -> Result<String> {
    let mut out = doc.to_string();
    for name in &rendered.order {
        let body = &rendered.sections[name];
        let begin = format!("<!-- BEGIN generated:{name} -->");
        let end = format!("<!-- END generated:{name} -->");
        let block = format!("{begin}\n{}{end}", ensure_newline(body));
        match (out.find(&begin), out.find(&end)) {
            (Some(b), Some(e)) if e > b => {
                out.replace_range(b..e + end.len(), &block);
            }
            (None, None) => {
                if !out.ends_with('\n') {
                    out.push('\n');
                }
                out.push('\n');
                out.push_str(&block);
                out.push('\n');
            }
            _ => {
                bail!("PERFORMANCE.md: markers of section {name:?} are unbalanced or out of order")
            }
        }
    }
    Ok(out)
}

fn ensure_newline(s: &str) -> String {
    if s.ends_with('\n') {
        s.to_string()
    } else {
        format!("{s}\n")
    }
}

/// A markdown table (numbers are expected pre-formatted).
pub fn md_table(header: &[&str], align_right_from: usize, rows: &[Vec<String>]) -> String {
    let mut s = String::new();
    s.push_str("| ");
    s.push_str(&header.join(" | "));
    s.push_str(" |\n|");
    for i in 0..header.len() {
        s.push_str(if i >= align_right_from {
            " ---: |"
        } else {
            " --- |"
        });
    }
    s.push('\n');
    for r in rows {
        s.push_str("| ");
        let cells: Vec<String> = r.iter().map(|c| c.replace('|', "\\|")).collect();
        s.push_str(&cells.join(" | "));
        s.push_str(" |\n");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rendered(name: &str, body: &str) -> Rendered {
        Rendered {
            sections: BTreeMap::from([(name.to_string(), body.to_string())]),
            order: vec![name.to_string()],
            charts: BTreeMap::new(),
        }
    }

    #[test]
    fn splice_replaces_between_markers_and_keeps_prose() {
        let doc = "# T\nprose before\n<!-- BEGIN generated:a -->\nold\n<!-- END generated:a -->\nprose after\n";
        let out = splice(doc, &rendered("a", "new")).unwrap();
        assert_eq!(
            out,
            "# T\nprose before\n<!-- BEGIN generated:a -->\nnew\n<!-- END generated:a -->\nprose after\n"
        );
        // Idempotent.
        assert_eq!(splice(&out, &rendered("a", "new")).unwrap(), out);
    }

    #[test]
    fn splice_appends_missing_and_refuses_unbalanced() {
        let out = splice("# T\n", &rendered("b", "x\n")).unwrap();
        assert_eq!(
            out,
            "# T\n\n<!-- BEGIN generated:b -->\nx\n<!-- END generated:b -->\n"
        );
        assert!(splice("<!-- BEGIN generated:b -->\n", &rendered("b", "x")).is_err());
    }

    #[test]
    fn unknown_and_gate_outputs_are_refused_with_a_reason() {
        assert!(classify("{\"kind\": \"mystery\"}")
            .unwrap_err()
            .contains("no renderer"));
        assert!(classify("{\"kind\": \"gate\"}").is_err());
        assert!(classify("not json").unwrap_err().contains("not JSON"));
        assert!(classify("{\"benchmark\": \"platform-blast\"}").is_err());
    }

    #[test]
    fn md_table_escapes_pipes() {
        let t = md_table(&["a", "b"], 1, &[vec!["x|y".into(), "1".into()]]);
        assert_eq!(t, "| a | b |\n| --- | ---: |\n| x\\|y | 1 |\n");
    }
}
