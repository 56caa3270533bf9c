//! IP address management: IP math and sets ([`ipset`], `overlap`), parsed lists kept for
//! reuse (`spec_cache`), pools ([`pools`]) and the allocator that picks and frees IPs over
//! the ledger ([`allocator`]).

pub mod allocator;
pub mod foreign;
pub(crate) mod held;
pub mod ipset;
pub mod messages;
pub(crate) mod overlap;
pub mod pools;
pub(crate) mod release;
pub(crate) mod request;
pub(crate) mod spec_cache;
pub mod usage;
