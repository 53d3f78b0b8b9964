//! The UDP echo benchmark: message format, accounting, clients, servers and the run driver.

pub mod client;
pub mod message;
#[cfg(target_os = "linux")]
pub mod mmsg;
pub mod ricochet_server;
pub mod run;
pub mod server;
pub mod tracker;
