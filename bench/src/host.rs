//! Host and build metadata, process resource usage, the command line and wall-clock dates.

use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// The machine a run was made on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostInfo {
    /// Short host name (`hostname -s`).
    pub hostname: String,
    /// Operating system (`linux`, `macos`).
    pub os: String,
    /// CPU architecture.
    pub arch: String,
    /// Kernel release (`uname -r`).
    pub kernel: String,
    /// CPU model name.
    pub cpu_model: String,
    /// Logical CPUs this process may use.
    pub cores: usize,
    /// 1, 5 and 15 minute load averages when the invocation started (other work on the machine
    /// skews wall-clock figures); `null` where unavailable.
    pub load_average: Option<[f64; 3]>,
}

/// The build that produced a result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BuildInfo {
    /// Crate version.
    pub version: String,
    /// `rustc -V` at build time (or at run time if the build could not tell).
    pub rustc: String,
    /// Cargo profile (`release`, `debug`).
    pub profile: String,
    /// Target triple.
    pub target: String,
    /// Git commit of the source tree (build time, else run time); empty if unknown.
    pub git_commit: String,
    /// Uncommitted changes to tracked files in the tree the binary was built from (else, if
    /// the build could not tell, in the tree it runs in); `null` if unknown.
    pub git_dirty: Option<bool>,
}

fn command_output(cmd: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(cmd).args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn read_trimmed(path: &str) -> Option<String> {
    let s = std::fs::read_to_string(path).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

/// Short host name, for result directory names.
pub fn short_hostname() -> String {
    let full = read_trimmed("/proc/sys/kernel/hostname")
        .or_else(|| command_output("hostname", &[]))
        .unwrap_or_else(|| "unknown".into());
    let short = full.split('.').next().unwrap_or("unknown");
    // Keep directory names portable.
    short
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn cpu_model() -> String {
    if let Ok(text) = std::fs::read_to_string("/proc/cpuinfo") {
        for line in text.lines() {
            if let Some((k, v)) = line.split_once(':') {
                if k.trim() == "model name" || k.trim() == "Model" {
                    return v.trim().to_string();
                }
            }
        }
    }
    command_output("sysctl", &["-n", "machdep.cpu.brand_string"])
        .unwrap_or_else(|| "unknown".into())
}

fn load_average() -> Option<[f64; 3]> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let mut it = text
        .split_whitespace()
        .map(|x| x.parse::<f64>().ok().filter(|v| v.is_finite()));
    Some([it.next()??, it.next()??, it.next()??])
}

impl HostInfo {
    /// Describe this machine.
    pub fn collect() -> HostInfo {
        HostInfo {
            hostname: short_hostname(),
            os: std::env::consts::OS.into(),
            arch: std::env::consts::ARCH.into(),
            kernel: read_trimmed("/proc/sys/kernel/osrelease")
                .or_else(|| command_output("uname", &["-r"]))
                .unwrap_or_else(|| "unknown".into()),
            cpu_model: cpu_model(),
            cores: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            load_average: load_average(),
        }
    }
}

impl BuildInfo {
    /// Describe this build.
    pub fn collect() -> BuildInfo {
        let rustc = match env!("BENCH_RUSTC_VERSION") {
            "" => command_output("rustc", &["-V"]).unwrap_or_else(|| "unknown".into()),
            v => v.to_string(),
        };
        let git_commit = match env!("BENCH_GIT_COMMIT") {
            "" => command_output("git", &["rev-parse", "HEAD"]).unwrap_or_default(),
            c => c.to_string(),
        };
        // The tree the binary was built from (see build.rs); the tree it runs in only when the
        // build could not tell.
        let git_dirty = match env!("BENCH_GIT_DIRTY") {
            "true" => Some(true),
            "false" => Some(false),
            _ => Command::new("git")
                .args(["status", "--porcelain", "--untracked-files=no"])
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|o| !o.stdout.iter().all(u8::is_ascii_whitespace)),
        };
        BuildInfo {
            version: env!("CARGO_PKG_VERSION").into(),
            rustc,
            profile: env!("BENCH_PROFILE").into(),
            target: env!("BENCH_TARGET").into(),
            git_commit,
            git_dirty,
        }
    }
}

/// The process's command line, shell-quoted so it can be pasted back.
pub fn command_line() -> String {
    std::env::args()
        .map(|a| shell_quote(&a))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Quote one argument for a POSIX shell when it needs it.
pub fn shell_quote(a: &str) -> String {
    let plain = !a.is_empty()
        && a.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,@+%".contains(c));
    if plain {
        a.to_string()
    } else {
        format!("'{}'", a.replace('\'', "'\\''"))
    }
}

/// A UTC calendar time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UtcTime {
    /// Seconds since the Unix epoch.
    pub unix_s: u64,
    /// Year.
    pub year: i64,
    /// Month, 1–12.
    pub month: u32,
    /// Day, 1–31.
    pub day: u32,
    /// Hour.
    pub hour: u32,
    /// Minute.
    pub minute: u32,
    /// Second.
    pub second: u32,
}

impl UtcTime {
    /// The current time.
    pub fn now() -> UtcTime {
        let d = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        UtcTime::from_unix(d.as_secs())
    }

    /// Convert seconds since the epoch (civil-from-days, proleptic Gregorian).
    pub fn from_unix(unix_s: u64) -> UtcTime {
        let days = (unix_s / 86_400) as i64;
        let secs = unix_s % 86_400;
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let year = yoe + era * 400 + i64::from(month <= 2);
        UtcTime {
            unix_s,
            year,
            month,
            day,
            hour: (secs / 3_600) as u32,
            minute: (secs / 60 % 60) as u32,
            second: (secs % 60) as u32,
        }
    }

    /// `yyyymmdd`.
    pub fn date_compact(&self) -> String {
        format!("{:04}{:02}{:02}", self.year, self.month, self.day)
    }

    /// `hhmmss`.
    pub fn time_compact(&self) -> String {
        format!("{:02}{:02}{:02}", self.hour, self.minute, self.second)
    }

    /// ISO 8601, `2026-11-30T11:44:01Z`.
    pub fn iso(&self) -> String {
        format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
            self.year, self.month, self.day, self.hour, self.minute, self.second
        )
    }
}

/// Process CPU time so far.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CpuTimes {
    /// User time, s.
    pub user_s: f64,
    /// System time, s.
    pub sys_s: f64,
}

impl CpuTimes {
    /// The process's CPU time (all threads) from `getrusage(RUSAGE_SELF)`.
    pub fn now() -> CpuTimes {
        // SAFETY: `getrusage` writes one `rusage` into the zeroed struct we own; RUSAGE_SELF is
        // always valid, so it cannot fail in a way that leaves the struct partly written.
        let ru = unsafe {
            let mut ru: libc::rusage = std::mem::zeroed();
            if libc::getrusage(libc::RUSAGE_SELF, &mut ru) != 0 {
                return CpuTimes::default();
            }
            ru
        };
        let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
        CpuTimes {
            user_s: tv(ru.ru_utime),
            sys_s: tv(ru.ru_stime),
        }
    }

    /// CPU seconds (user and system) used since `earlier`.
    pub fn seconds_since(&self, earlier: &CpuTimes) -> f64 {
        (self.user_s + self.sys_s) - (earlier.user_s + earlier.sys_s)
    }
}

/// The whole machine's CPU time so far (every CPU, every process: the first line of
/// `/proc/stat`), to tell how much of a run's window other processes used.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SystemCpu {
    /// Time the CPUs ran processes (user, nice, system), s.
    pub busy_s: f64,
    /// Time in interrupt and softirq context (packet delivery), charged to no process, s.
    pub irq_s: f64,
    /// Time the hypervisor ran something else while a virtual CPU wanted to run, s.
    pub steal_s: f64,
}

impl SystemCpu {
    /// `None` where `/proc/stat` is unavailable (not Linux).
    pub fn now() -> Option<SystemCpu> {
        let text = std::fs::read_to_string("/proc/stat").ok()?;
        let line = text.lines().find(|l| l.starts_with("cpu "))?;
        let f: Vec<f64> = line
            .split_whitespace()
            .skip(1)
            .map(|x| x.parse::<f64>().ok())
            .collect::<Option<_>>()?;
        // SAFETY: sysconf has no memory effects; a failure returns -1, handled below.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        if hz <= 0 || f.len() < 8 {
            return None;
        }
        let hz = hz as f64;
        // user nice system idle iowait irq softirq steal ...
        Some(SystemCpu {
            busy_s: (f[0] + f[1] + f[2]) / hz,
            irq_s: (f[5] + f[6]) / hz,
            steal_s: f[7] / hz,
        })
    }
}

/// Peak resident set size of this process (`VmHWM` in `/proc/self/status`), KiB.
pub fn peak_rss_kib() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = text.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The process's resident set size now (`VmRSS` of `/proc/self/status`), KiB.
pub fn rss_kib() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = text.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        let t = UtcTime::from_unix(0);
        assert_eq!(t.iso(), "1970-01-01T00:00:00Z");
        // 2026-11-30 11:44:01 UTC
        let t = UtcTime::from_unix(1_796_039_041);
        assert_eq!(t.iso(), "2026-11-30T11:44:01Z");
        assert_eq!(t.date_compact(), "20261130");
        assert_eq!(t.time_compact(), "114401");
        assert_eq!(
            UtcTime::from_unix(951_782_400).iso(),
            "2000-02-29T00:00:00Z"
        );
    }

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("--payload"), "--payload");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
        assert_eq!(shell_quote(""), "''");
    }
}
