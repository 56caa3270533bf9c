//! Permission errors as an operator meets them: every command names the file or directory it
//! could not read or write, and the cause.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_ip-webhook");

/// Whether this process runs as root, which the permission bits do not stop.
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        == Some("0")
}

/// The binary run as a user whom permission bits stop. Root ignores them (CAP_DAC_OVERRIDE,
/// CAP_DAC_READ_SEARCH): as root it runs under util-linux's `setpriv` with those two
/// capabilities out of its bounding set, still uid 0 (so the binary's own path stays
/// reachable wherever the checkout is), and a root-owned file of mode 0000 then answers EACCES.
fn unprivileged(args: &[&str], cwd: &Path) -> (i32, String, String) {
    let mut command = if is_root() {
        let mut c = Command::new("setpriv");
        c.args(["--bounding-set=-dac_override,-dac_read_search", BIN]);
        c
    } else {
        Command::new(BIN)
    };
    let out = command
        .args(args)
        .current_dir(cwd)
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("HOME", cwd)
        .output()
        .unwrap_or_else(|e| {
            panic!("running setpriv (util-linux; scripts/install-test-deps.sh installs it): {e}")
        });
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

const REVIEW: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/pod-create-v1.json"
);

/// A state dir nobody may read is said to be unreadable, with its owner, mode and EACCES, by
/// every command that reads it, never taken for an absent or empty ledger; a file in the way
/// is ENOTDIR; a file of the ledger that cannot be created or read is named with the cause.
#[test]
fn permission_errors_name_the_path_and_the_cause() {
    let work = tempfile::tempdir().unwrap();
    let cwd = work.path();
    let state = cwd.join("state");
    let dir = state.to_str().unwrap();
    // a ledger with one claim
    let (code, _, stderr) = unprivileged(&["review", REVIEW, "--state-dir", dir], cwd);
    assert_eq!(code, 0, "{stderr}");

    chmod(&state, 0o000);
    let uid = std::fs::metadata(&state).unwrap().uid();
    let unreadable = format!(
        "Error: cannot read the state dir {dir} (owner uid {uid}, mode 0000): Permission denied (os error 13)\n"
    );
    for args in [
        &["status", "--state-dir", dir][..],
        &["explain", "-f", REVIEW, "--state-dir", dir],
        &["release", "10.0.0.10", "--force", "--state-dir", dir],
    ] {
        let (code, stdout, stderr) = unprivileged(args, cwd);
        assert_eq!((code, stdout.as_str()), (1, ""), "{args:?}: {stderr}");
        assert_eq!(stderr, unreadable, "{args:?}");
    }
    let (code, _, stderr) = unprivileged(&["ledger", "repair", "--state-dir", dir], cwd);
    assert_eq!(code, 1);
    assert_eq!(
        stderr,
        format!(
            "Error: ledger storage error: cannot list the state dir {dir}: Permission denied (os error 13)\n"
        )
    );

    // readable, but its journal is not: the journal is named
    chmod(&state, 0o700);
    let journal = std::fs::read_dir(&state)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("journal.")
        })
        .unwrap();
    chmod(&journal, 0o000);
    let (code, _, stderr) = unprivileged(&["status", "--state-dir", dir], cwd);
    assert_eq!(code, 1);
    assert_eq!(
        stderr,
        format!(
            "Error: ledger storage error: cannot read {}: Permission denied (os error 13)\n",
            journal.display()
        )
    );
    chmod(&journal, 0o600);

    // the lock file cannot be created: named, with the cause
    std::fs::remove_file(state.join("ledger.lock")).unwrap();
    chmod(&state, 0o500);
    let (code, _, stderr) = unprivileged(&["review", REVIEW, "--state-dir", dir], cwd);
    assert_eq!(code, 1);
    assert_eq!(
        stderr,
        format!(
            "Error: opening the embedded ledger in {dir} to record the review's claim (with --dry-run it is only read, also while `serve` runs): ledger storage error: cannot open the lock file {dir}/ledger.lock: Permission denied (os error 13)\n"
        )
    );
    // serve opens the ledger before anything else: the same file, the same cause
    let serve = |cwd: &Path| {
        unprivileged(
            &[
                "serve",
                "--state-dir",
                dir,
                "--listen",
                "127.0.0.1:0",
                "--admin-listen",
                "127.0.0.1:0",
            ],
            cwd,
        )
    };
    let (code, _, stderr) = serve(cwd);
    assert_eq!(code, 1);
    assert!(
        stderr.ends_with(&format!(
            "cannot open the lock file {dir}/ledger.lock: Permission denied (os error 13)\n"
        )),
        "{stderr}"
    );
    // the self-signed CA cannot be written (its temp file is not ours to write): named
    chmod(&state, 0o700);
    std::fs::write(state.join("ca.key.tmp"), "").unwrap();
    chmod(&state.join("ca.key.tmp"), 0o000);
    let (code, _, stderr) = serve(cwd);
    assert_eq!(code, 1);
    assert!(
        stderr.ends_with(&format!(
            "Error: cannot write {dir}/ca.key: Permission denied (os error 13)\n"
        )),
        "{stderr}"
    );
    // a CA that is there but unreadable is refused, not replaced (its caBundle is in use)
    std::fs::write(state.join("ca.crt"), "kept").unwrap();
    std::fs::write(state.join("ca.key"), "kept").unwrap();
    chmod(&state.join("ca.key"), 0o000);
    let (code, _, stderr) = serve(cwd);
    assert_eq!(code, 1);
    assert!(
        stderr.ends_with(&format!(
            "Error: cannot read {dir}/ca.key: Permission denied (os error 13)\n"
        )),
        "{stderr}"
    );
    assert_eq!(std::fs::read(state.join("ca.crt")).unwrap(), b"kept");

    // a path through a file: ENOTDIR, and a file given as the dir
    let through = format!("{REVIEW}/state");
    let (code, _, stderr) = unprivileged(&["status", "--state-dir", &through], cwd);
    assert_eq!(code, 1);
    assert_eq!(
        stderr,
        format!("Error: cannot read the state dir {through}: Not a directory (os error 20)\n")
    );
    let (code, _, stderr) = unprivileged(&["status", "--state-dir", REVIEW], cwd);
    assert_eq!(code, 1);
    assert_eq!(
        stderr,
        format!(
            "Error: the state dir {REVIEW} is not a directory (give the --state-dir of `ip-webhook serve`)\n"
        )
    );
    chmod(&state, 0o700);
}
