//! Shared by the integration tests: build the C examples against the library under test, run
//! programs with a time limit, hex, an echo server in Rust.
#![allow(dead_code)]

pub mod vectors;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use ricochet::{Bytes, Handler, ServerContext, SessionId};

/// The key and protocol id the token tests use.
pub const KEY: [u8; 32] = [0x5a; 32];
/// The game's protocol id in these tests.
pub const PROTOCOL_ID: u64 = 0x7269_636f;

/// The folder holding `libricochet_ffi.so` of this test build (cargo leaves it beside the
/// test binaries, in `deps/`).
pub fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("deps folder").to_path_buf();
    for dir in [deps.clone(), deps.parent().unwrap_or(&deps).to_path_buf()] {
        if dir.join("libricochet_ffi.so").exists() || dir.join("libricochet_ffi.dylib").exists() {
            return dir;
        }
    }
    panic!(
        "libricochet_ffi (.so or .dylib) not found beside {}",
        exe.display()
    );
}

pub fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Compile `examples/c/<name>.c` with gcc (or `<name>.cpp` with g++, C++17) (`-Wall -Wextra -Werror`, AddressSanitizer and
/// UndefinedBehaviorSanitizer unless `RICOCHET_C_NO_SANITIZE` is set), linked to the shared
/// library; the executable's path.
pub fn build_c(name: &str) -> PathBuf {
    let out_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ffi-c");
    std::fs::create_dir_all(&out_dir).expect("tmp dir");
    let exe = out_dir.join(name);
    let lib = lib_dir();
    let cpp = crate_dir().join(format!("examples/c/{name}.cpp"));
    let (source, compiler, std) = if cpp.exists() {
        (
            cpp,
            std::env::var("CXX").unwrap_or_else(|_| "g++".into()),
            "-std=c++17",
        )
    } else {
        let c = crate_dir().join(format!("examples/c/{name}.c"));
        (
            c,
            std::env::var("CC").unwrap_or_else(|_| "gcc".into()),
            "-std=c11",
        )
    };
    let mut cmd = Command::new(compiler);
    cmd.args([std, "-O1", "-g", "-Wall", "-Wextra", "-Werror"]);
    if std::env::var_os("RICOCHET_C_NO_SANITIZE").is_none() {
        cmd.args([
            "-fsanitize=address,undefined",
            "-fno-sanitize-recover=all",
            "-fno-omit-frame-pointer",
        ]);
    }
    cmd.arg("-I")
        .arg(crate_dir().join("include"))
        .arg(source)
        .arg("-o")
        .arg(&exe)
        .arg("-L")
        .arg(&lib)
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .args(["-lricochet_ffi", "-lpthread"]);
    let out = cmd.output().expect("run gcc");
    assert!(
        out.status.success(),
        "gcc failed for {name}:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// The sanitizers' settings for a C program: any finding fails the run.
pub fn sanitizer_env(cmd: &mut Command) -> &mut Command {
    cmd.env(
        "ASAN_OPTIONS",
        "detect_leaks=1:abort_on_error=0:exitcode=86",
    )
    .env(
        "UBSAN_OPTIONS",
        "print_stacktrace=1:halt_on_error=1:exitcode=87",
    )
    .env(
        "LSAN_OPTIONS",
        format!(
            "suppressions={}",
            crate_dir().join("examples/c/lsan.supp").display()
        ),
    )
}

/// Wait for `child` at most `limit`; killed (and the test failed) past it.
pub fn wait_output(mut child: Child, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().expect("try_wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "the program ran past {limit:?}\nstdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Run `cmd` to completion within `limit`, feeding it `stdin`.
pub fn run(cmd: &mut Command, stdin: &[u8], limit: Duration) -> Output {
    use std::io::Write;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin)
        .expect("write stdin");
    wait_output(child, limit)
}

/// Read the child's stdout up to the first newline.
pub fn first_line(child: &mut Child) -> String {
    let out = child.stdout.as_mut().expect("stdout");
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while out.read(&mut b).expect("read stdout") == 1 && b[0] != b'\n' {
        line.push(b[0]);
    }
    String::from_utf8(line).expect("UTF-8")
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

/// The echo messages the C examples send: sequence and client index, then a pattern.
pub fn message(len: usize, seq: u64, client: u32) -> Vec<u8> {
    let mut b: Vec<u8> = (0..len)
        .map(|i| (seq.wrapping_mul(31) as usize + i * 7 + client as usize) as u8)
        .collect();
    if len >= 12 {
        b[..8].copy_from_slice(&seq.to_le_bytes());
        b[8..12].copy_from_slice(&client.to_le_bytes());
    }
    b
}

/// A Rust echo handler that counts what it echoed.
pub struct Echo(pub std::sync::Arc<std::sync::atomic::AtomicU64>);

impl Handler for Echo {
    fn on_message(&mut self, ctx: &mut ServerContext<'_>, s: SessionId, channel: u8, data: Bytes) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let _ = ctx.send(s, channel, data);
    }
}

/// Build the C# binding and its test program with `mcs` (once per test binary); `None` when
/// Mono is not installed and `RICOCHET_REQUIRE_MONO` is not set (then the C# tests say they
/// were skipped; CI sets it after installing Mono).
pub fn build_csharp() -> Option<PathBuf> {
    use std::sync::OnceLock;
    static EXE: OnceLock<Option<PathBuf>> = OnceLock::new();
    EXE.get_or_init(|| {
        let have = |tool: &str| {
            Command::new(tool)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        };
        if !have("mcs") || !have("mono") {
            assert!(
                std::env::var_os("RICOCHET_REQUIRE_MONO").is_none(),
                "RICOCHET_REQUIRE_MONO is set but mcs or mono is missing \
                 (apt-get install -y mono-mcs mono-runtime)"
            );
            eprintln!("skipped: mcs and mono are not installed");
            return None;
        }
        let out_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ffi-cs");
        std::fs::create_dir_all(&out_dir).expect("tmp dir");
        let exe = out_dir.join("EchoClient.exe");
        let cs = crate_dir().join("bindings/csharp");
        // C# 7.3 (`fixed` over a span): mcs calls it experimental; Unity's compiler has it.
        let out = Command::new("mcs")
            .args([
                "-langversion:experimental",
                "-unsafe",
                "-optimize+",
                "-warnaserror+",
            ])
            .arg(format!("-out:{}", exe.display()))
            .arg(cs.join("Native.cs"))
            .arg(cs.join("Ricochet.cs"))
            .arg(cs.join("tests/EchoClient.cs"))
            .output()
            .expect("run mcs");
        assert!(
            out.status.success(),
            "mcs failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Some(exe)
    })
    .clone()
}

/// `mono <exe>` with the library under test on the native search path.
pub fn mono(exe: &Path) -> Command {
    let mut cmd = Command::new("mono");
    cmd.arg(exe).env("LD_LIBRARY_PATH", lib_dir());
    cmd
}
