#![forbid(unsafe_code)]

use clap::Parser;

// Every admission allocates a few dozen small strings and maps; mimalloc frees them for about a
// fifth of glibc's instructions (`examples/count_review.rs` under callgrind).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    ip_webhook::cli::run(ip_webhook::cli::Cli::parse()).await
}
