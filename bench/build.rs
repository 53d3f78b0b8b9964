//! Capture build metadata (rustc version, git commit) for the result files.
use std::process::Command;

fn run(cmd: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(cmd).args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn main() {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = run(&rustc, &["-V"]).unwrap_or_default();
    println!("cargo:rustc-env=BENCH_RUSTC_VERSION={version}");
    let commit = run("git", &["rev-parse", "HEAD"]).unwrap_or_default();
    println!("cargo:rustc-env=BENCH_GIT_COMMIT={commit}");
    let target = std::env::var("TARGET").unwrap_or_default();
    println!("cargo:rustc-env=BENCH_TARGET={target}");
    let profile = std::env::var("PROFILE").unwrap_or_default();
    println!("cargo:rustc-env=BENCH_PROFILE={profile}");
    // Rebuild when HEAD moves so the commit stays current.
    if let Some(git_dir) = run("git", &["rev-parse", "--absolute-git-dir"]) {
        println!("cargo:rerun-if-changed={git_dir}/HEAD");
        let common = run(
            "git",
            &["rev-parse", "--path-format=absolute", "--git-common-dir"],
        )
        .unwrap_or(git_dir);
        if let Some(r) = run("git", &["symbolic-ref", "-q", "HEAD"]) {
            println!("cargo:rerun-if-changed={common}/{r}");
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
