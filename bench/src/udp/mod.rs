//! The UDP echo benchmark: message format, accounting, clients, servers and the run driver.

pub mod client;
pub mod message;
pub mod ricochet_server;
pub mod run;
pub mod server;
pub mod tracker;
