//! A deterministic network simulator: virtual clock, links with seeded impairments.
