#![forbid(unsafe_code)]

use std::process::ExitCode;

// Every admission allocates a few dozen small strings and maps; mimalloc frees them for about a
// fifth of glibc's instructions (`examples/count_review.rs` under callgrind). Version 2 (the
// crate's `v2` feature): the crate asks for every block with its alignment, and where mimalloc 2
// serves an alignment up to 16 from the size's own class, mimalloc 3 over-allocates from a
// larger class whenever the class is not a power of two and its page has no free block, which
// the blocks a durable admission keeps make the common case (docs/performance.md, "mimalloc 2:
// every block from its own class").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    ip_webhook::cli::main()
}
