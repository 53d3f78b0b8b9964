//! `ricochet-top` in a real terminal (tmux): it shows a running server's workers and sessions,
//! sorts, selects and quits. Ignored by default: needs tmux (`ci/ops.sh` runs it).

use std::process::Command;
use std::time::{Duration, Instant};

use ricochet::runtime::{Handler, Server, ServerConfig, ServerContext, SessionId};
use ricochet::{Bytes, Client, ClientConfig};

struct Echo;
impl Handler for Echo {
    fn on_message(&mut self, ctx: &mut ServerContext<'_>, s: SessionId, channel: u8, data: Bytes) {
        let _ = ctx.send(s, channel, data);
    }
}

fn tmux(args: &[&str]) -> String {
    let out = Command::new("tmux").args(args).output().expect("tmux runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Kills the tmux session this test made (by its name) when dropped.
struct TmuxSession(String);
impl Drop for TmuxSession {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["kill-session", "-t", &self.0])
            .output();
    }
}

/// Capture the pane until `want` appears (bounded), keeping the clients talking.
fn wait_for(session: &str, clients: &mut [Client], want: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        for c in clients.iter_mut() {
            let _ = c.send(0, &b"ping"[..]);
            let _ = c.update();
        }
        let screen = tmux(&["capture-pane", "-p", "-t", session]);
        if screen.contains(want) {
            return screen;
        }
        assert!(Instant::now() < deadline, "{want:?} not shown:\n{screen}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
#[ignore = "needs tmux (ci/ops.sh installs it)"]
fn top_shows_workers_and_sessions_sorts_and_quits() {
    let cfg = ServerConfig::new("127.0.0.1:0".parse().unwrap())
        .insecure()
        .workers(2)
        .metrics("127.0.0.1:0".parse().unwrap());
    let srv = Server::start(cfg, |_| Echo).unwrap();
    let metrics = srv.metrics_addr().unwrap();
    let mut clients: Vec<Client> = (0..4)
        .map(|_| Client::connect_insecure_blocking(srv.local_addr(), ClientConfig::new()).unwrap())
        .collect();
    let name = format!("ricochet-top-{}", std::process::id());
    let bin = env!("CARGO_BIN_EXE_ricochet-top");
    let status = Command::new("tmux")
        .args(["new-session", "-d", "-s", &name, "-x", "140", "-y", "40"])
        .arg(format!("{bin} {metrics}; sleep 30"))
        .status()
        .expect("tmux");
    assert!(status.success());
    let _guard = TmuxSession(name.clone());

    let screen = wait_for(&name, &mut clients, "worker 1");
    assert!(screen.contains("worker 0"), "{screen}");
    assert!(screen.contains("sort: rtt"), "{screen}");
    wait_for(&name, &mut clients, "sessions 4");
    // Each session is listed with its address (the workers list them once a second).
    let addrs: Vec<String> = clients
        .iter()
        .map(|c| format!("127.0.0.1:{}", c.local_addr().port()))
        .collect();
    let mut screen = String::new();
    for a in &addrs {
        screen = wait_for(&name, &mut clients, a);
    }
    let listed = addrs.iter().filter(|a| screen.contains(a.as_str())).count();
    assert_eq!(listed, 4, "{screen}");
    assert!(
        screen.contains("RTT of 0/") || screen.contains("RTT of 1/"),
        "{screen}"
    );

    tmux(&["send-keys", "-t", &name, "l"]);
    wait_for(&name, &mut clients, "sort: loss");
    tmux(&["send-keys", "-t", &name, "Down"]);
    tmux(&["send-keys", "-t", &name, "r"]);
    wait_for(&name, &mut clients, "sort: rtt");

    // Quit: the program ends and the shell's `sleep` follows (the screen is restored).
    tmux(&["send-keys", "-t", &name, "q"]);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let cmd = tmux(&[
            "display-message",
            "-p",
            "-t",
            &name,
            "#{pane_current_command}",
        ]);
        if cmd.trim() == "sleep" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "ricochet-top did not quit: {cmd}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    println!("ricochet-top: showed 2 workers and 4 sessions, sorted by loss and RTT, quit on q");
    drop(clients);
    srv.shutdown().unwrap();
}
