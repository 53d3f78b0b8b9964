//! Byte layout of every Ricochet packet. Decoders return typed errors and never panic.
