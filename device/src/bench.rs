//! Benchmarks (filled in below).
