//! Built without the `conditioner` feature (`cargo test -p ricochet --no-default-features
//! --test ops_conditioner_compiled_out`): the settings types stay, and every way of turning a
//! conditioner on fails with an error that names the feature, while a server and a client
//! without one run as usual.
#![cfg(not(feature = "conditioner"))]

use std::time::Duration;

use ricochet::runtime::{Handler, Server, ServerConfig, ServerContext, SessionId};
use ricochet::{Bytes, Client, ClientConfig, ClientError, Impairment, LinkConditioner};

struct Quiet;
impl Handler for Quiet {
    fn on_message(&mut self, _: &mut ServerContext<'_>, _: SessionId, _: u8, _: Bytes) {}
}

fn lag() -> LinkConditioner {
    LinkConditioner::symmetric(Impairment::new().delay(Duration::from_millis(50)))
}

fn config() -> ServerConfig {
    ServerConfig::new("127.0.0.1:0".parse().unwrap())
        .insecure()
        .workers(1)
}

fn names_the_feature(e: &dyn std::fmt::Display) -> bool {
    e.to_string().contains("`conditioner` feature")
}

#[test]
fn a_server_configured_with_a_conditioner_does_not_start() {
    match Server::start(config().conditioner(lag()), |_| Quiet) {
        Err(e) => assert!(names_the_feature(&e), "{e}"),
        Ok(_) => panic!("the server started with a conditioner compiled out"),
    }
}

#[test]
fn a_running_server_and_client_refuse_one_and_keep_working() {
    let srv = Server::start(config(), |_| Quiet).unwrap();
    let e = srv.set_conditioner(Some(lag())).unwrap_err();
    assert!(names_the_feature(&e), "{e}");
    // Turning it off is always allowed: there is nothing to turn off.
    srv.set_conditioner(None).unwrap();

    let cfg = ClientConfig::new().connect_timeout(Duration::from_secs(10));
    let mut c = Client::connect_insecure_blocking(srv.local_addr(), cfg).unwrap();
    let e = c.set_conditioner(Some(lag())).unwrap_err();
    assert!(names_the_feature(&e), "{e}");
    c.send(0, &b"still here"[..]).unwrap();
    assert!(srv.is_running());

    let with = ClientConfig::new().conditioner(lag());
    match Client::connect_insecure_blocking(srv.local_addr(), with) {
        Err(e @ ClientError::Conditioner(_)) => assert!(names_the_feature(&e), "{e}"),
        Err(e) => panic!("another error: {e}"),
        Ok(_) => panic!("a client connected with a conditioner compiled out"),
    }
}
