//! One module per subcommand; each has its clap arguments and a `run` returning whether every
//! measurement was ok.

pub mod game;
pub mod gate;
pub mod matrix;
pub mod report;
pub mod rudp;
pub mod sessions;
pub mod tour;
pub mod udp;
pub mod udp_limits;

use std::path::PathBuf;

use clap::Args;

/// Options every subcommand understands.
#[derive(Debug, Clone, Default, Args)]
pub struct Global {
    /// Write the JSON result to exactly this path.
    #[arg(long, global = true, value_name = "PATH")]
    pub json: Option<PathBuf>,
    /// Root directory for result files: runs are written to `DIR/<host>-<yyyymmdd>/`, and
    /// `report` and `gate` read `DIR` instead of the source tree's `results/`.
    #[arg(long, global = true, value_name = "DIR")]
    pub results_dir: Option<PathBuf>,
    /// Archive the run: write it to the tracked `results/<host>-<yyyymmdd>/`, where `bench
    /// report` reads it, instead of the git-ignored `results/local/<host>-<yyyymmdd>/`.
    #[arg(long, global = true)]
    pub archive: bool,
}

impl Global {
    /// Where a result file of `stem` goes.
    pub fn path_for(&self, stem: &str, at: &crate::host::UtcTime) -> PathBuf {
        match &self.json {
            Some(p) => p.clone(),
            None => crate::output::result_path(self.results_dir.as_deref(), self.archive, stem, at),
        }
    }
}
