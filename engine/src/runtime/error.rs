//! The runtime's error type.

/// Errors starting, running or stopping the runtime.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// A configuration value is invalid.
    #[error("invalid runtime configuration: {0}")]
    Config(String),
    /// The [`ServerConfig`](crate::ServerConfig) builder was given a contradiction (such as
    /// `.profile(..)` after `.session(..)`, which would discard the session changes); the
    /// message says which and what to do instead.
    #[error("{0}")]
    Conflict(&'static str),
    /// Socket or backend setup or I/O failed.
    #[error(transparent)]
    Platform(#[from] ricochet_platform::Error),
    /// A worker thread could not be spawned.
    #[error("spawning worker {worker}: {source}")]
    Spawn {
        /// Worker index.
        worker: usize,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A worker stopped with an error.
    #[error("worker {worker} failed: {source}")]
    Worker {
        /// Worker index.
        worker: usize,
        /// What went wrong.
        #[source]
        source: ricochet_platform::Error,
    },
    /// Installing the SIGINT / SIGTERM handlers of [`Server::serve_until_signal`] failed.
    ///
    /// [`Server::serve_until_signal`]: super::Server::serve_until_signal
    #[error("installing the signal handlers: {0}")]
    Signal(#[source] std::io::Error),
    /// A worker's handler panicked.
    #[error("worker {worker} panicked: {message}")]
    WorkerPanicked {
        /// Worker index.
        worker: usize,
        /// The panic message, where it was a string.
        message: String,
    },
}
