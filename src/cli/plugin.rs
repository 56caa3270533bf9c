//! `ip-webhook plugin install`: puts the running binary on kubectl's plugin path as
//! `kubectl-ipw`, so `kubectl ipw …` runs it (kubectl runs any executable `kubectl-NAME` found
//! on PATH as `kubectl NAME`).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::{Args, Subcommand};

use super::{PLUGIN_FILE, emit};

/// `ip-webhook plugin …`.
#[derive(Debug, Subcommand)]
pub(crate) enum PluginCommand {
    /// Install this binary as the kubectl plugin `kubectl ipw` (a symlink `kubectl-ipw`).
    ///
    /// By default the link goes next to this binary (after `cargo install`, ~/.cargo/bin,
    /// which is on PATH); kubectl finds it there. Installing again is harmless; another file of
    /// that name is left alone unless --force.
    Install(InstallArgs),
}

#[derive(Debug, Clone, Args)]
pub(crate) struct InstallArgs {
    /// The directory for kubectl-ipw (it must be on PATH for kubectl to find it); default:
    /// the directory of this binary.
    #[arg(long, value_name = "DIR")]
    pub(crate) dir: Option<PathBuf>,
    /// Copy the binary instead of linking to it (for a directory on another filesystem, or a
    /// binary that will be removed).
    #[arg(long)]
    pub(crate) copy: bool,
    /// Replace a kubectl-ipw that is not this binary.
    #[arg(long)]
    pub(crate) force: bool,
}

pub(crate) fn run(command: PluginCommand) -> anyhow::Result<()> {
    match command {
        PluginCommand::Install(args) => {
            let binary = std::env::current_exe()
                .and_then(|exe| exe.canonicalize())
                .context("finding this program's own file")?;
            let line = install(&binary, &args)?;
            emit(&line)
        }
    }
}

/// Installs `binary` as `kubectl-ipw` in the chosen directory; returns what was done, as the
/// lines to print.
fn install(binary: &Path, args: &InstallArgs) -> anyhow::Result<String> {
    let dir = match &args.dir {
        Some(dir) => dir.clone(),
        None => binary
            .parent()
            .context("this program's file has no directory")?
            .to_path_buf(),
    };
    if !dir.is_dir() {
        bail!(
            "{} is not a directory: create it or give another --dir",
            dir.display()
        );
    }
    let target = dir.join(PLUGIN_FILE);
    let already = if args.copy {
        same_contents(&target, binary)
    } else {
        std::fs::read_link(&target).is_ok_and(|to| to == binary)
    };
    let mut line = if already {
        format!("{} is already {}\n", target.display(), binary.display())
    } else {
        if std::fs::symlink_metadata(&target).is_ok() {
            if !args.force {
                bail!(
                    "{} exists and is not {}: remove it, or give --force to replace it",
                    target.display(),
                    binary.display()
                );
            }
            std::fs::remove_file(&target)
                .with_context(|| format!("removing {}", target.display()))?;
        }
        let written = if args.copy {
            std::fs::copy(binary, &target).map(|_| ())
        } else {
            std::os::unix::fs::symlink(binary, &target)
        };
        written.with_context(|| {
            format!(
                "writing {} (a directory you may write to, e.g. --dir ~/.local/bin, or sudo)",
                target.display()
            )
        })?;
        let how = if args.copy { "a copy of" } else { "a link to" };
        format!(
            "installed {} ({how} {})\n",
            target.display(),
            binary.display()
        )
    };
    if on_path(&dir) {
        line.push_str("kubectl ipw --help runs it\n");
    } else {
        line.push_str(&format!(
            "{} is not on PATH: add it (export PATH=\"{}:$PATH\") so kubectl finds kubectl-ipw\n",
            dir.display(),
            dir.display()
        ));
    }
    Ok(line)
}

fn same_contents(a: &Path, b: &Path) -> bool {
    match (std::fs::read(a), std::fs::read(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// Whether `dir` is one of $PATH's directories (compared as canonical paths).
fn on_path(dir: &Path) -> bool {
    let wanted = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|p| p.canonicalize().is_ok_and(|p| p == wanted))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(dir: &Path, copy: bool, force: bool) -> InstallArgs {
        InstallArgs {
            dir: Some(dir.to_path_buf()),
            copy,
            force,
        }
    }

    fn binary(dir: &Path) -> PathBuf {
        let binary = dir.join("ip-webhook");
        std::fs::write(&binary, b"binary").unwrap();
        binary
    }

    #[test]
    fn links_then_says_it_is_already_there() {
        let from = tempfile::tempdir().unwrap();
        let to = tempfile::tempdir().unwrap();
        let binary = binary(from.path());
        let first = install(&binary, &args(to.path(), false, false)).unwrap();
        assert!(first.starts_with("installed "), "{first}");
        assert_eq!(
            std::fs::read_link(to.path().join(PLUGIN_FILE)).unwrap(),
            binary
        );
        let again = install(&binary, &args(to.path(), false, false)).unwrap();
        assert!(again.contains("is already"), "{again}");
        // not on this test's PATH: the message says how to add it
        assert!(again.contains("is not on PATH"), "{again}");
    }

    #[test]
    fn another_file_is_kept_unless_forced() {
        let from = tempfile::tempdir().unwrap();
        let to = tempfile::tempdir().unwrap();
        let binary = binary(from.path());
        let target = to.path().join(PLUGIN_FILE);
        std::fs::write(&target, b"someone else's").unwrap();
        let refused = install(&binary, &args(to.path(), false, false)).unwrap_err();
        let message = format!("{refused:#}");
        assert!(message.contains(&target.display().to_string()) && message.contains("--force"));
        assert_eq!(std::fs::read(&target).unwrap(), b"someone else's");
        install(&binary, &args(to.path(), true, true)).unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"binary");
        assert!(std::fs::symlink_metadata(&target).unwrap().is_file());
        let again = install(&binary, &args(to.path(), true, false)).unwrap();
        assert!(again.contains("is already"), "{again}");
    }

    #[test]
    fn a_missing_directory_is_named() {
        let from = tempfile::tempdir().unwrap();
        let binary = binary(from.path());
        let missing = from.path().join("no-such-dir");
        let error = install(&binary, &args(&missing, false, false)).unwrap_err();
        assert!(format!("{error:#}").contains(&missing.display().to_string()));
    }
}
