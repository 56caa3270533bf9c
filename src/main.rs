#![forbid(unsafe_code)]

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    ip_webhook::cli::run(ip_webhook::cli::Cli::parse()).await
}
