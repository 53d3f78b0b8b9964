//! The verdict of one check, as every suite of the gate reports it (a leaf: the suites and the
//! gate's report both read it).

use serde::{Deserialize, Serialize};

/// Verdict of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// Within tolerance.
    Pass,
    /// A regression (or a correctness failure).
    Fail,
    /// Measured, no baseline to compare with.
    New,
    /// Not run here, with the reason in the note.
    Skipped,
}

impl Status {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Fail => "FAIL",
            Status::New => "new",
            Status::Skipped => "skipped",
        }
    }
}

/// One row of the verdict table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Verdict {
    /// `sim/<profile>`, `ratio` or `cpu`.
    pub group: String,
    /// Metric name.
    pub metric: String,
    /// Baseline value, if any.
    pub baseline: Option<f64>,
    /// Measured value, if any.
    pub measured: Option<f64>,
    /// The rule applied, in words.
    pub rule: String,
    /// The verdict.
    pub status: Status,
    /// Why, when it needs saying.
    pub note: String,
}
