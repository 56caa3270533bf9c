#![forbid(unsafe_code)]

use std::process::ExitCode;

// Every admission allocates a few dozen small strings and maps; mimalloc frees them for about a
// fifth of glibc's instructions (`examples/count_review.rs` under callgrind).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Errors end as one `Error: …` line with their causes (never a backtrace, whatever
/// RUST_BACKTRACE says) and the exit status of [`ip_webhook::cli::exit_code`].
#[tokio::main]
async fn main() -> ExitCode {
    match ip_webhook::cli::run(ip_webhook::cli::parse_env()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("Error: {}", ip_webhook::cli::error_line(&error));
            ExitCode::from(ip_webhook::cli::exit_code(&error))
        }
    }
}
