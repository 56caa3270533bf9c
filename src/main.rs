#![forbid(unsafe_code)]

use std::process::ExitCode;

// Every admission allocates a few dozen small strings and maps; mimalloc frees them for about a
// fifth of glibc's instructions (`examples/count_review.rs` under callgrind).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    ip_webhook::cli::main()
}
