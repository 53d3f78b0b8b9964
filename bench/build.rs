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
    // Whether the tree this binary is built from differs from that commit (tracked files
    // only); empty when git cannot tell. Checked at build time: a result file must describe
    // the binary, not the tree it happens to run in.
    let dirty = Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map_or("", |o| {
            if o.stdout.iter().all(u8::is_ascii_whitespace) {
                "false"
            } else {
                "true"
            }
        });
    println!("cargo:rustc-env=BENCH_GIT_DIRTY={dirty}");
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
    // Rerun when any source of the workspace changes, so the dirty flag stays current (cargo
    // scans a directory's files for changes).
    let manifest = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
    let root = std::path::Path::new(&manifest)
        .parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or_default();
    for dir in [
        "engine",
        "platform",
        "bench/src",
        "Cargo.toml",
        "Cargo.lock",
    ] {
        let path = root.join(dir);
        if path.exists() {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
}
