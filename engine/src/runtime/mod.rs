//! The thread-per-core runtime: workers, timer wheel, IO models and handler APIs.
