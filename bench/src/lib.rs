//! `bench`: Ricochet's benchmark, as a library the binary and the tests share.
//!
//! - [`udp`]: the closed-loop UDP echo (message format, accounting, clients, servers, runs).
//! - [`relay`]: the impairment relay (the simulator's impairment model on real sockets).
//! - [`rudp`]: the RUDP complete-message echo over the relay (or direct).
//! - [`lanes`]: players behind a bottleneck (`bench lanes`), in their own process.
//! - [`scale`]: many sessions on one server (`bench sessions`) and the game tick (`bench game`),
//!   the server in a child process.
//! - [`schema`]: the versioned JSON result schema; [`host`]: host/build metadata and process
//!   usage; [`kernel`]: kernel counters; [`output`]: result paths and text tables.
//! - [`stats`]: the median, finite floats and latency summaries every part shares (a leaf).
//! - [`alloc`]: the counting allocator the binary installs (heap per session, exact);
//! - [`gate`]: the CI regression gate; [`report`]: `PERFORMANCE.md` from `results/`.
//! - [`commands`]: one module per subcommand.

pub mod alloc;
pub mod commands;
pub mod gate;
pub mod host;
pub mod kernel;
pub mod lanes;
pub mod large_messages;
pub mod output;
pub mod relay;
pub mod report;
pub mod rudp;
pub mod scale;
pub mod schema;
pub mod stats;
pub mod udp;

/// An error and its causes as one line, `a: b: c`, leaving out a cause whose text the line
/// already holds (the crates' errors print their source in their own message too, so `{:#}`
/// would repeat it).
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cause = c.source();
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_error_chain_names_each_cause_once() {
        let io = std::io::Error::from_raw_os_error(24);
        let platform = ricochet_platform::Error::io("socket", io);
        // The platform error prints its source, and anyhow's context adds a third level.
        let e = anyhow::Error::new(platform).context("client 3 of the set");
        let line = super::error_chain(e.as_ref());
        assert_eq!(line.matches("os error 24").count(), 1, "{line}");
        assert!(line.starts_with("client 3 of the set: socket: "), "{line}");
    }
}
