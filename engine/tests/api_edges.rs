//! The public API's rough edges found by writing a load generator against it (issue 37): each
//! test pins the behaviour the fix gives.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use ricochet::runtime::{Handler, Server, ServerConfig, ServerContext, SessionId};

/// Records each tick's index and lateness; tick 3 blocks the worker for `BLOCK`.
struct LateTicks(Arc<Mutex<Vec<(u64, Duration)>>>);

const PERIOD: Duration = Duration::from_millis(10);
const BLOCK: Duration = Duration::from_millis(50);

impl Handler for LateTicks {
    fn on_message(&mut self, _: &mut ServerContext<'_>, _: SessionId, _: u8, _: Bytes) {}
    fn on_tick(&mut self, ctx: &mut ServerContext<'_>) {
        let index = ctx.tick_index().expect("a tick has an index");
        let late = ctx.tick_lateness().expect("a tick has a lateness");
        self.0.lock().unwrap().push((index, late));
        if index == 3 {
            std::thread::sleep(BLOCK);
        }
    }
}

#[test]
fn a_handler_reads_how_late_its_tick_is() {
    let ticks = Arc::new(Mutex::new(Vec::new()));
    let t2 = ticks.clone();
    let mut cfg = ServerConfig::new(SocketAddr::from(([127, 0, 0, 1], 0)))
        .insecure()
        .tick(PERIOD);
    cfg.udp.io_threads = 1;
    let srv = Server::start(cfg, move |_| LateTicks(t2.clone())).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !ticks.lock().unwrap().iter().any(|&(i, _)| i > 4) {
        assert!(std::time::Instant::now() < deadline, "ticks did not run");
        std::thread::sleep(PERIOD);
    }
    srv.shutdown().unwrap();
    let ticks = ticks.lock().unwrap();
    // Tick 3 started at or after its due time and held the worker for `BLOCK`: tick 4 (due
    // one period after tick 3) started at least `BLOCK - PERIOD` late.
    let &(_, late4) = ticks.iter().find(|&&(i, _)| i == 4).expect("tick 4 ran");
    assert!(
        late4 >= BLOCK - PERIOD,
        "tick 4 was {late4:?} late: {ticks:?}"
    );
}
