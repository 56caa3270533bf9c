#![forbid(unsafe_code)]
//! IP address management: IP math and sets ([`ipset`], `overlap`), parsed lists kept for
//! reuse (`spec_cache`), pools ([`pools`]) and the allocator that picks and frees IPs over
//! the ledger ([`allocator`]).

pub mod allocator;
pub mod foreign;
pub mod held;
pub mod ipset;
pub mod messages;
pub mod overlap;
pub mod pools;
pub(crate) mod release;
pub(crate) mod request;
pub mod spec_cache;
pub mod usage;
