//! The load generator's own process: `bench game` and `bench sessions` run each case's players
//! in a child of the bench (the hidden `scale-load` sub-command), which starts the case's
//! server process in turn. So the server, the load generator and the bench that collects the
//! results are three processes: the load generator's CPU ([`crate::schema::LoadStats`]) is its
//! own, and nothing the bench keeps between cases (earlier results, the table) shares its
//! memory or threads.
//!
//! The parent writes one JSON [`LoadJob`] line on the child's standard input; the child runs
//! it and prints one JSON answer line (its progress and errors go to standard error).

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::schema::{GameConfig, GameRun, SessionsConfig, SessionsRun};

/// The hidden sub-command of the load generator's process.
pub const LOAD_SUBCOMMAND: &str = "scale-load";

/// One case for the load generator.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub enum LoadJob {
    /// A `bench game` case.
    Game(GameConfig),
    /// A `bench sessions` case.
    Sessions(SessionsConfig),
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
enum LoadAnswer {
    Game(Box<GameRun>),
    Sessions(Box<SessionsRun>),
    Failed(String),
}

/// The load generator process's main: read one job, run it, print the result.
pub fn serve_process(input: impl BufRead, mut output: impl Write) -> Result<()> {
    let line = input.lines().next().context("no job on standard input")??;
    let job: LoadJob = serde_json::from_str(&line).context("the load job")?;
    let answer = match job {
        LoadJob::Game(cfg) => super::game::run(&cfg).map(|r| LoadAnswer::Game(Box::new(r))),
        LoadJob::Sessions(cfg) => {
            super::sessions::run(&cfg).map(|r| LoadAnswer::Sessions(Box::new(r)))
        }
    }
    .unwrap_or_else(|e| LoadAnswer::Failed(crate::error_chain(e.as_ref())));
    writeln!(output, "{}", serde_json::to_string(&answer)?)?;
    output.flush()?;
    Ok(())
}

/// Runs `job` in a load-generator process of this executable and waits for its answer.
fn run_job(job: &LoadJob) -> Result<LoadAnswer> {
    let exe = std::env::current_exe().context("locating the bench executable")?;
    let mut child = Command::new(exe)
        .arg(LOAD_SUBCOMMAND)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting the load generator's process")?;
    let mut stdin = child.stdin.take().context("load generator stdin")?;
    writeln!(stdin, "{}", serde_json::to_string(job)?)?;
    stdin.flush()?;
    drop(stdin);
    let mut line = String::new();
    let read =
        BufReader::new(child.stdout.take().context("load generator stdout")?).read_line(&mut line);
    let status = child
        .wait()
        .context("waiting for the load generator's process")?;
    if read? == 0 {
        bail!("the load generator's process ended without answering ({status})");
    }
    let answer: LoadAnswer = serde_json::from_str(&line).context("the load generator's answer")?;
    if !status.success() {
        bail!("the load generator's process exited with {status}");
    }
    Ok(answer)
}

/// A `bench game` case, its players in a process of their own.
pub fn run_game(cfg: &GameConfig) -> Result<GameRun> {
    match run_job(&LoadJob::Game(cfg.clone()))? {
        LoadAnswer::Game(r) => Ok(*r),
        LoadAnswer::Failed(e) => bail!("{e}"),
        LoadAnswer::Sessions(_) => bail!("the load generator answered another job"),
    }
}

/// A `bench sessions` case, its clients in a process of their own.
pub fn run_sessions(cfg: &SessionsConfig) -> Result<SessionsRun> {
    match run_job(&LoadJob::Sessions(cfg.clone()))? {
        LoadAnswer::Sessions(r) => Ok(*r),
        LoadAnswer::Failed(e) => bail!("{e}"),
        LoadAnswer::Game(_) => bail!("the load generator answered another job"),
    }
}
