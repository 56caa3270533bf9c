//! Build script: the git commit that `ip_webhook_build_info{commit}` reports.
//!
//! `IP_WEBHOOK_GIT_COMMIT` wins when set (an image build without `.git`); else `git rev-parse`
//! in the source tree; else "unknown". It only reads the local repository: no network.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=IP_WEBHOOK_GIT_COMMIT");
    let commit = std::env::var("IP_WEBHOOK_GIT_COMMIT")
        .ok()
        .map(|c| c.trim().to_string())
        // It becomes a label value and a line of cargo's protocol: a plain word only.
        .filter(|c| {
            !c.is_empty()
                && c.len() <= 64
                && c.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-+".contains(&b))
        })
        .or_else(git_commit)
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=IP_WEBHOOK_GIT_COMMIT={commit}");
}

fn manifest_dir() -> PathBuf {
    PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_else(|| ".".into()))
}

fn git(args: &[&str]) -> Option<String> {
    let output = Command::new("git")
        .args(args)
        .current_dir(manifest_dir())
        .output()
        .ok()?;
    let text = String::from_utf8(output.stdout).ok()?.trim().to_string();
    (output.status.success() && !text.is_empty()).then_some(text)
}

/// The short commit of HEAD, and a rerun when HEAD or the branch it names moves.
fn git_commit() -> Option<String> {
    let commit = git(&["rev-parse", "--short=12", "HEAD"])?;
    if !commit.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut watched = vec!["HEAD".to_string(), "packed-refs".to_string()];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(branch);
    }
    for name in watched {
        if let Some(path) = git(&["rev-parse", "--git-path", &name]) {
            let path = manifest_dir().join(Path::new(&path));
            // A missing file would make Cargo rerun this script at every build.
            if path.exists() {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
    }
    Some(commit)
}
