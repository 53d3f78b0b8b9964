//! `bench`: Ricochet's benchmark binary.
fn main() {}
