//! The running server's control socket, so that `release` works while `serve` runs on an
//! embedded ledger. The journal is locked to the one process that writes it; a second writer
//! would also leave the server's held set (`ipam/held.rs`) believing the IP is still taken.
//! So `release` hands its request to the server, which frees the claim through its allocator
//! under the same rule as everywhere (`release.rs::release_from`).
//!
//! A Unix socket in a directory of the state dir that only its owner may enter (0700): whoever
//! can reach it can already write the ledger files. One JSON line in, one JSON line out.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use super::release::{Outcome, Request, release_from};
use ip_webhook_ipam::allocator::Allocator;
use ip_webhook_ledger::pod_lookup::{NoPodList, PodLookup};

/// The directory of the state dir that holds the socket.
pub(crate) const SOCKET_DIR: &str = "control";
/// The socket's file name in it.
pub(crate) const SOCKET_NAME: &str = "release.sock";
/// The longest request line read; a request is a few dozen bytes.
const MAX_REQUEST_BYTES: u64 = 4096;
/// How long a client may take to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a client waits for the server's answer (a release is one ledger write).
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);

/// What happened to a control request, as the server answers it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Reply {
    /// The IP is free again.
    pub(crate) released: bool,
    /// The request could not be carried out (bad request, ledger error), as opposed to a
    /// refusal by the rule.
    pub(crate) failed: bool,
    /// What happened, for people.
    pub(crate) message: String,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum ControlError {
    #[error("creating the control socket directory {path}: {source}")]
    Directory {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("binding the control socket {path}: {source}")]
    Bind {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("talking to the running server through {path}: {source}")]
    Talk {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the running server's answer through {path} is not understood: {detail}")]
    Answer { path: PathBuf, detail: String },
}

/// Where the control socket of the server on `state_dir` lives.
pub(crate) fn socket_path(state_dir: &Path) -> PathBuf {
    state_dir.join(SOCKET_DIR).join(SOCKET_NAME)
}

/// What the server says at startup and `status` says off-cluster: with no API server, nothing
/// can tell a claim whose pod was refused after admission from one whose pod runs.
pub(crate) fn unverifiable_claims_note(invocation: &str) -> String {
    format!(
        "no API server to ask: a claim whose pod was refused after admission (by another webhook, a quota, a name already taken) cannot be told from one whose pod runs, and stays held; if you know a pod is gone, free its IP with `{invocation} release IP --force` (works while the server runs)"
    )
}

/// The state dir's control directory, made (mode 0700) or found, never through a symbolic
/// link: a `control` that is a link, or not a directory, is refused, so that the server never
/// changes the mode of, or removes a socket in, a directory elsewhere. The directory is
/// looked at without following a link (`lstat`), then opened and checked to be the very one
/// looked at (device and inode), and its mode is set through that handle (`fchmod`).
fn control_dir(state_dir: &Path) -> Result<PathBuf, ControlError> {
    use std::os::unix::fs::MetadataExt;
    let dir = state_dir.join(SOCKET_DIR);
    let refused = |detail: &str| ControlError::Directory {
        path: dir.clone(),
        source: std::io::Error::other(detail.to_string()),
    };
    let directory = |source| ControlError::Directory {
        path: dir.clone(),
        source,
    };
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(directory(e)),
        _ => {}
    }
    let seen = std::fs::symlink_metadata(&dir).map_err(directory)?;
    if seen.file_type().is_symlink() {
        return Err(refused(
            "it is a symbolic link; refusing to follow it (remove it: the server makes the directory)",
        ));
    }
    if !seen.is_dir() {
        return Err(refused("it is not a directory"));
    }
    let opened = std::fs::File::open(&dir).map_err(directory)?;
    let meta = opened.metadata().map_err(directory)?;
    if (meta.dev(), meta.ino()) != (seen.dev(), seen.ino()) {
        return Err(refused("it was replaced while it was opened"));
    }
    opened
        .set_permissions(std::fs::Permissions::from_mode(0o700))
        .map_err(directory)?;
    Ok(dir)
}

/// Serve release requests for the server on `state_dir`. A socket left by a server that is
/// gone is replaced: the caller holds the ledger's lock, so no other server uses this dir.
pub(crate) fn listen(
    state_dir: &Path,
    allocator: Arc<Allocator>,
    pods: Option<Arc<dyn PodLookup>>,
) -> Result<tokio::task::JoinHandle<()>, ControlError> {
    let dir = control_dir(state_dir)?;
    let path = dir.join(SOCKET_NAME);
    match std::fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => return Err(ControlError::Bind { path, source }),
    }
    let listener = UnixListener::bind(&path).map_err(|source| ControlError::Bind {
        path: path.clone(),
        source,
    })?;
    let pods: Arc<dyn PodLookup> = pods.unwrap_or_else(|| {
        Arc::new(NoPodList(
            "the server has no API server to ask; off-cluster nothing can confirm the pod is gone"
                .into(),
        ))
    });
    Ok(tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let allocator = allocator.clone();
            let pods = pods.clone();
            tokio::spawn(async move {
                if let Err(error) = answer(stream, &allocator, pods.as_ref()).await {
                    tracing::debug!(%error, "control request not answered");
                }
            });
        }
    }))
}

async fn answer(
    stream: UnixStream,
    allocator: &Allocator,
    pods: &dyn PodLookup,
) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    let mut reader = BufReader::new(read.take(MAX_REQUEST_BYTES));
    let read = tokio::time::timeout(REQUEST_TIMEOUT, reader.read_line(&mut line)).await;
    let reply = match read {
        Err(_) => refusal(format!(
            "no request line within {}s",
            REQUEST_TIMEOUT.as_secs()
        )),
        Ok(Err(e)) => refusal(format!("reading the request: {e}")),
        Ok(Ok(_)) if !line.ends_with('\n') => refusal(format!(
            "the request is not one line of at most {MAX_REQUEST_BYTES} bytes"
        )),
        Ok(Ok(_)) => match serde_json::from_str::<Request>(&line) {
            Err(e) => refusal(format!("the request is not a release request: {e}")),
            Ok(request) => carry_out(allocator, pods, &request).await,
        },
    };
    let mut text = serde_json::to_string(&reply).expect("a reply serializes");
    text.push('\n');
    write.write_all(text.as_bytes()).await?;
    write.shutdown().await?;
    // Closing with unread input would reset the connection and lose the answer: read what a
    // client that sent too much still sends, for a moment and a bounded amount.
    let mut rest = reader.into_inner().into_inner().take(1 << 20);
    let _ = tokio::time::timeout(
        Duration::from_millis(200),
        tokio::io::copy(&mut rest, &mut tokio::io::sink()),
    )
    .await;
    Ok(())
}

async fn carry_out(allocator: &Allocator, pods: &dyn PodLookup, request: &Request) -> Reply {
    let outcome = release_from(allocator.claims(), pods, request, async |claim| {
        allocator.release_claim(claim).await
    })
    .await;
    match outcome {
        Ok(outcome) => {
            if let Outcome::Released { claim, forced } = &outcome {
                tracing::info!(
                    ip = %claim.ip,
                    pod = %claim.pod.display(),
                    forced,
                    "released by the operator"
                );
            }
            Reply {
                released: outcome.released(),
                failed: false,
                message: outcome.message(&request.ip),
            }
        }
        Err(error) => refusal(format!("releasing {}: {error}", request.ip)),
    }
}

fn refusal(message: String) -> Reply {
    Reply {
        released: false,
        failed: true,
        message,
    }
}

/// Ask the server running on `state_dir` to carry out `request`. `None` when no server listens
/// there (no socket, or one left by a server that is gone).
pub(crate) async fn ask(
    state_dir: &Path,
    request: &Request,
) -> Result<Option<Reply>, ControlError> {
    let path = socket_path(state_dir);
    let talk = |source| ControlError::Talk {
        path: path.clone(),
        source,
    };
    // a server never listens behind a link (`control_dir`): nothing to ask through one
    let dir = state_dir.join(SOCKET_DIR);
    if std::fs::symlink_metadata(&dir).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err(ControlError::Directory {
            path: dir,
            source: std::io::Error::other("it is a symbolic link; refusing to follow it"),
        });
    }
    let stream = match UnixStream::connect(&path).await {
        Ok(stream) => stream,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Ok(None);
        }
        Err(e) => return Err(talk(e)),
    };
    let (read, mut write) = stream.into_split();
    let mut text = serde_json::to_string(request).expect("a request serializes");
    text.push('\n');
    write.write_all(text.as_bytes()).await.map_err(talk)?;
    let mut line = String::new();
    match tokio::time::timeout(
        REPLY_TIMEOUT,
        BufReader::new(read.take(1 << 20)).read_line(&mut line),
    )
    .await
    {
        Err(_) => Err(talk(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no answer within {}s", REPLY_TIMEOUT.as_secs()),
        ))),
        Ok(Err(e)) => Err(talk(e)),
        Ok(Ok(_)) => serde_json::from_str(&line)
            .map(Some)
            .map_err(|e| ControlError::Answer {
                path: path.clone(),
                detail: format!("{e}: {:?}", line.trim_end()),
            }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::release::tests::bound;
    use ip_webhook_ledger::{Claim, Ledger, MemoryLedger};

    async fn serving(dir: &Path, claims: &[Claim]) -> (Arc<Allocator>, Arc<MemoryLedger>) {
        let ledger = Arc::new(MemoryLedger::new());
        for claim in claims {
            ledger.create(Arc::new(claim.clone())).await.unwrap();
        }
        let allocator = Arc::new(Allocator::new(ledger.clone()).await.unwrap());
        listen(dir, allocator.clone(), None).unwrap();
        (allocator, ledger)
    }

    fn request(ip: &str, force: bool, namespace: Option<&str>) -> Request {
        Request::one(ip.parse().unwrap(), force, namespace.map(str::to_string))
    }

    #[tokio::test]
    async fn the_server_frees_through_its_allocator_under_the_release_rule() {
        let dir = tempfile::tempdir().unwrap();
        let (allocator, ledger) = serving(dir.path(), &[bound("10.0.0.1", "default")]).await;
        let mode = std::fs::metadata(dir.path().join(SOCKET_DIR))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);

        // Off-cluster nothing can confirm the pod is gone: refused without --force.
        let unforced = ask(dir.path(), &request("10.0.0.1", false, None))
            .await
            .unwrap()
            .unwrap();
        assert!(!unforced.released && !unforced.failed, "{unforced:?}");
        assert!(
            unforced.message.contains("rerun with --force"),
            "{unforced:?}"
        );
        // The namespace guard holds through the socket too.
        let elsewhere = ask(dir.path(), &request("10.0.0.1", true, Some("prod")))
            .await
            .unwrap()
            .unwrap();
        assert!(!elsewhere.released, "{elsewhere:?}");
        assert!(
            elsewhere.message.contains("not in namespace prod"),
            "{elsewhere:?}"
        );
        assert!(allocator.holder(&"10.0.0.1".parse().unwrap()).is_some());

        let forced = ask(dir.path(), &request("10.0.0.1", true, Some("default")))
            .await
            .unwrap()
            .unwrap();
        assert!(forced.released, "{forced:?}");
        // Both the server's held set and its ledger let the IP go.
        assert!(allocator.holder(&"10.0.0.1".parse().unwrap()).is_none());
        assert!(ledger.load().await.unwrap().iter().all(|c| !c.is_held()));
        let again = ask(dir.path(), &request("10.0.0.1", true, None))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(again.message, "nothing to release: no claim holds 10.0.0.1");
    }

    /// A `control` that is a symbolic link is not followed: the directory it points to keeps
    /// its mode and its files, the server says why it has no socket, and `release` does not
    /// talk through it.
    #[tokio::test]
    async fn a_control_dir_that_is_a_link_is_refused_and_its_target_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        std::fs::set_permissions(elsewhere.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let theirs = elsewhere.path().join(SOCKET_NAME);
        std::fs::write(&theirs, b"not ours").unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), dir.path().join(SOCKET_DIR)).unwrap();
        let ledger = Arc::new(MemoryLedger::new());
        let allocator = Arc::new(Allocator::new(ledger).await.unwrap());
        let error = listen(dir.path(), allocator, None).unwrap_err().to_string();
        assert!(
            error.contains("symbolic link") && error.contains(SOCKET_DIR),
            "{error}"
        );
        let mode = std::fs::metadata(elsewhere.path())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755, "the link's target was chmodded");
        assert_eq!(std::fs::read(&theirs).unwrap(), b"not ours");
        let asked = ask(dir.path(), &request("10.0.0.1", true, None)).await;
        assert!(
            asked.is_err_and(|e| e.to_string().contains("symbolic link")),
            "release talked through the link"
        );
        // a plain file there is refused too; a directory of ours with a loose mode is tightened
        let file = tempfile::tempdir().unwrap();
        std::fs::write(file.path().join(SOCKET_DIR), b"").unwrap();
        assert!(control_dir(file.path()).is_err());
        let loose = tempfile::tempdir().unwrap();
        std::fs::create_dir(loose.path().join(SOCKET_DIR)).unwrap();
        std::fs::set_permissions(
            loose.path().join(SOCKET_DIR),
            std::fs::Permissions::from_mode(0o777),
        )
        .unwrap();
        control_dir(loose.path()).unwrap();
        let mode = std::fs::metadata(loose.path().join(SOCKET_DIR))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
    }

    #[tokio::test]
    async fn no_server_is_none_and_bad_requests_get_a_clear_answer() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            ask(dir.path(), &request("10.0.0.1", true, None))
                .await
                .unwrap(),
            None
        );
        // A socket a dead server left: nobody listens, so there is no server.
        std::fs::create_dir(dir.path().join(SOCKET_DIR)).unwrap();
        drop(std::os::unix::net::UnixListener::bind(socket_path(dir.path())).unwrap());
        assert_eq!(
            ask(dir.path(), &request("10.0.0.1", true, None))
                .await
                .unwrap(),
            None
        );

        // A new server replaces the stale socket.
        serving(dir.path(), &[]).await;
        let mut stream = UnixStream::connect(socket_path(dir.path())).await.unwrap();
        stream.write_all(b"{\"ip\":\"nope\"}\n").await.unwrap();
        let mut reply = String::new();
        stream.read_to_string(&mut reply).await.unwrap();
        let reply: Reply = serde_json::from_str(&reply).unwrap();
        assert!(reply.failed && !reply.released, "{reply:?}");
        assert!(
            reply
                .message
                .starts_with("the request is not a release request"),
            "{reply:?}"
        );

        // Endless input is cut at the bound, not read forever.
        let mut stream = UnixStream::connect(socket_path(dir.path())).await.unwrap();
        stream.write_all(&vec![b'x'; 8192]).await.unwrap();
        let mut reply = String::new();
        stream.read_to_string(&mut reply).await.unwrap();
        let reply: Reply = serde_json::from_str(&reply).unwrap();
        assert!(reply.message.contains("at most 4096 bytes"), "{reply:?}");
    }
}
