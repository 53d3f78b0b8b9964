//! Print what this host supports and which backend `auto` would pick, and why.
//!
//! ```text
//! cargo run -p ricochet-platform --example probe
//! ```

use ricochet_platform::{bind, open, probe, BackendConfig, SocketConfig};

fn main() {
    let caps = probe();
    for (name, c) in [
        ("io_uring", &caps.io_uring),
        ("multishot recvmsg", &caps.multishot_recvmsg),
        ("buffer rings", &caps.buffer_rings),
        ("UDP GSO", &caps.gso),
        ("UDP GRO", &caps.gro),
    ] {
        println!(
            "{name:<18} {:<3} {}",
            if c.available { "yes" } else { "no" },
            c.detail
        );
    }
    let names: Vec<&str> = caps.backends().iter().map(|k| k.as_str()).collect();
    println!("backends           {}", names.join(", "));
    let addr = "127.0.0.1:0".parse().expect("literal address");
    match bind(&SocketConfig::new(addr)).and_then(|s| open(s, &BackendConfig::default())) {
        Ok(b) => println!("auto picks         {}: {}", b.kind(), b.selection_reason()),
        Err(e) => println!("auto fails         {e}"),
    }
}
