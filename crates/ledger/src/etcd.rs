//! The etcd ledger: one key per IP under a prefix (`/ip-webhook/10.0.0.10`), its value the
//! claim as JSON.
//!
//! A claim is taken with a transaction that writes only if the key does not exist
//! (`create_revision == 0`), or, when the key holds a released claim, only if it is unchanged
//! since it was read (`mod_revision == seen`). A release rewrites the claim as released under
//! the same compare. etcd answers a transaction after a quorum has made it durable, so several
//! webhook replicas can share one cluster without a leader.
//!
//! Calls that fail in transit (a member restarting, a leader election) are retried until
//! `--etcd-timeout` has passed. A retried create may find the claim it made itself on the
//! first attempt: the same pod and request count as created, so retries are idempotent.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, KeyValue, Txn, TxnOp, TxnOpResponse,
};

use tonic::Code as tonic_code;

use super::claim::{CreateRule, create_rule, release_of, step_of};
use super::{Claim, CreateOutcome, EtcdOptions, Ledger, LedgerError, ObservedChange, unix_now};

/// How many compare failures one create or release tolerates (other replicas writing the same
/// key between our read and our write) before reporting contention.
const MAX_COMPARE_ATTEMPTS: usize = 32;

pub struct EtcdLedger {
    client: Client,
    prefix: String,
    timeout: Duration,
    resync_period: Duration,
    /// Set by `close`; the watch loop waits on it too.
    closed: tokio::sync::watch::Sender<bool>,
    /// The etcd revision `load` read at: a watch starts just after it.
    loaded_revision: AtomicI64,
    /// The newest revision this process wrote or read per key; older watch events are stale.
    seen: Mutex<HashMap<String, i64>>,
}

fn storage(context: &str, error: impl std::fmt::Display) -> LedgerError {
    LedgerError::Storage(format!("etcd {context}: {error}"))
}

/// An etcd client error in plain words: for a failed connection the last of its causes
/// (`Connection refused (os error 111)`), for a status from etcd its message; never the
/// `Debug` dump of tonic's transport error, which tonic's `Display` of a status appends.
fn plain(error: &etcd_client::Error) -> String {
    use etcd_client::Error;
    let last_cause = |error: &(dyn std::error::Error + 'static)| {
        let mut last = error;
        while let Some(next) = last.source() {
            last = next;
        }
        last.to_string()
    };
    match error {
        Error::TransportError(error) => last_cause(error),
        Error::IoError(error) => error.to_string(),
        Error::GRpcStatus(status) => match std::error::Error::source(status) {
            Some(source) => last_cause(source),
            None if status.message().is_empty() => status.code().description().to_string(),
            None => status.message().to_string(),
        },
        other => other.to_string(),
    }
}

/// Errors worth a retry: the request may not have reached a quorum.
fn is_transient(error: &etcd_client::Error) -> bool {
    use etcd_client::Error;
    match error {
        Error::TransportError(_) | Error::IoError(_) => true,
        Error::GRpcStatus(status) => matches!(
            status.code(),
            tonic_code::Unavailable
                | tonic_code::DeadlineExceeded
                | tonic_code::Unknown
                | tonic_code::Aborted
                | tonic_code::Internal
                | tonic_code::Cancelled
        ),
        _ => false,
    }
}

/// The claim stored at `key` under `prefix`; `Corrupt` (naming the key, what it stands for
/// and what the record says) when the value is not a claim or is a claim on another IP.
pub(crate) fn decode_record(prefix: &str, key: &[u8], value: &[u8]) -> Result<Claim, LedgerError> {
    let key = String::from_utf8_lossy(key).into_owned();
    let named = key.strip_prefix(prefix).unwrap_or(&key).to_string();
    let claim: Claim = serde_json::from_slice(value).map_err(|e| LedgerError::Corrupt {
        ip: named.clone(),
        reason: format!("etcd key {key} does not hold a claim: {e}"),
    })?;
    if named.parse::<std::net::IpAddr>().ok() != Some(claim.ip) {
        return Err(LedgerError::Corrupt {
            ip: named,
            reason: format!(
                "etcd key {key} holds a claim on {}, not on the IP its key names",
                claim.ip
            ),
        });
    }
    Ok(claim)
}

/// `--etcd-prefix` with exactly one leading and one trailing `/` (`ip-webhook`,
/// `/ip-webhook/` and `//ip-webhook//` are one key space); an empty prefix is `/`.
pub(crate) fn normalize_prefix(prefix: &str) -> String {
    let inner = prefix.trim_matches('/');
    if inner.is_empty() {
        "/".to_string()
    } else {
        format!("/{inner}/")
    }
}

fn read_file(path: &PathBuf, what: &str) -> Result<Vec<u8>, LedgerError> {
    std::fs::read(path).map_err(|e| {
        LedgerError::Storage(format!("cannot read etcd {what} {}: {e}", path.display()))
    })
}

impl EtcdLedger {
    /// Connect, and check the cluster answers within the timeout.
    pub async fn connect(options: &EtcdOptions) -> Result<EtcdLedger, LedgerError> {
        if options.endpoints.is_empty() {
            return Err(LedgerError::Storage(
                "--etcd-endpoints names no endpoint".into(),
            ));
        }
        let mut connect = ConnectOptions::new()
            .with_timeout(options.timeout)
            .with_connect_timeout(options.timeout)
            .with_keep_alive(Duration::from_secs(10), options.timeout)
            .with_require_leader(true);
        if options.ca_file.is_some() || options.cert_file.is_some() {
            let mut tls = etcd_client::TlsOptions::new();
            if let Some(ca) = &options.ca_file {
                tls = tls.ca_certificate(etcd_client::Certificate::from_pem(read_file(
                    ca, "CA file",
                )?));
            }
            match (&options.cert_file, &options.key_file) {
                (Some(cert), Some(key)) => {
                    tls = tls.identity(etcd_client::Identity::from_pem(
                        read_file(cert, "client certificate")?,
                        read_file(key, "client key")?,
                    ));
                }
                (None, None) => {}
                _ => {
                    return Err(LedgerError::Storage(
                        "--etcd-cert-file and --etcd-key-file go together".into(),
                    ));
                }
            }
            connect = connect.with_tls(tls);
        }
        let client = Client::connect(&options.endpoints, Some(connect))
            .await
            .map_err(|e| storage(&format!("connect to {:?}", options.endpoints), plain(&e)))?;
        let prefix = normalize_prefix(&options.prefix);
        let ledger = EtcdLedger {
            client,
            prefix,
            timeout: options.timeout,
            resync_period: options.resync_period,
            closed: tokio::sync::watch::Sender::new(false),
            loaded_revision: AtomicI64::new(0),
            seen: Mutex::new(HashMap::new()),
        };
        // fail at start, with the endpoints in the message, rather than at the first admission
        ledger
            .retrying("status", |mut client| async move { client.status().await })
            .await
            .map_err(|e| match e {
                LedgerError::Storage(why) => {
                    LedgerError::Storage(format!("{why} (endpoints {:?})", options.endpoints))
                }
                other => other,
            })?;
        Ok(ledger)
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn key(&self, claim: &Claim) -> String {
        format!("{}{}", self.prefix, claim.ip)
    }

    fn note_seen(&self, key: &str, revision: i64) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let entry = seen.entry(key.to_string()).or_insert(revision);
        *entry = (*entry).max(revision);
    }

    /// Run `call` with a fresh client handle, retrying transient failures until the timeout.
    async fn retrying<T, F, Fut>(&self, what: &str, call: F) -> Result<T, LedgerError>
    where
        F: Fn(Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        if *self.closed.borrow() {
            return Err(LedgerError::Closed);
        }
        let deadline = tokio::time::Instant::now() + self.timeout;
        let mut pause = Duration::from_millis(20);
        loop {
            match call(self.client.clone()).await {
                Ok(value) => return Ok(value),
                Err(error) if is_transient(&error) && tokio::time::Instant::now() < deadline => {
                    tracing::debug!(%error, what, "etcd call failed; retrying");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
                Err(error) => return Err(storage(what, plain(&error))),
            }
        }
    }

    /// Write `value` at `key` if the key is as last seen: absent (`None`) or at `mod_revision`.
    /// On a compare failure, returns the key's current record.
    async fn write_if(
        &self,
        key: &str,
        expected: Option<i64>,
        value: &[u8],
    ) -> Result<Result<i64, Option<KeyValue>>, LedgerError> {
        let compare = match expected {
            None => Compare::create_revision(key, CompareOp::Equal, 0),
            Some(revision) => Compare::mod_revision(key, CompareOp::Equal, revision),
        };
        let txn = Txn::new()
            .when([compare])
            .and_then([TxnOp::put(key, value, None)])
            .or_else([TxnOp::get(key, None)]);
        let response = self
            .retrying("transaction", |mut client| {
                let txn = txn.clone();
                async move { client.txn(txn).await }
            })
            .await?;
        if response.succeeded() {
            let revision = response.header().map(|h| h.revision()).unwrap_or(0);
            return Ok(Ok(revision));
        }
        let current = response.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Get(get) => get.kvs().first().cloned(),
            _ => None,
        });
        Ok(Err(current))
    }

    /// Replace the record at `key` by `change(record)` (`None`: leave it, answer `false`),
    /// compared on its revision and retried while it moves under us. `written(record)` says
    /// whether a record is our own earlier attempt, whose answer was lost.
    async fn update(
        &self,
        key: &str,
        change: impl Fn(&Claim) -> Option<Claim>,
    ) -> Result<bool, LedgerError> {
        let mut record = self.read(key).await?;
        // what the last write whose answer may have been lost wrote: found there, it was written
        let mut attempted: Option<Claim> = None;
        for _ in 0..MAX_COMPARE_ATTEMPTS {
            let Some(kv) = record else {
                return Ok(false);
            };
            let held = match self.decode(&kv) {
                Ok(held) => held,
                Err(error) => {
                    super::skip_corrupt(&error, "not changing an etcd record that cannot be read");
                    return Ok(false);
                }
            };
            if attempted.as_ref() == Some(&held) {
                return Ok(true);
            }
            let Some(next) = change(&held) else {
                return Ok(false);
            };
            let value = serde_json::to_vec(&next).map_err(|e| storage("encode", e))?;
            attempted = Some(next);
            match self.write_if(key, Some(kv.mod_revision()), &value).await? {
                Ok(revision) => {
                    self.note_seen(key, revision);
                    return Ok(true);
                }
                Err(now) => record = now,
            }
        }
        Err(LedgerError::Storage(format!(
            "etcd key {key} changed under {MAX_COMPARE_ATTEMPTS} attempts in a row"
        )))
    }

    /// The claim a key holds. A value that is not a claim, or a claim on another IP than its
    /// key names (a hand edit), is corrupt; the error names the key and both values.
    fn decode(&self, kv: &KeyValue) -> Result<Claim, LedgerError> {
        decode_record(&self.prefix, kv.key(), kv.value())
    }

    /// `AlreadyHeld` by a stand-in for the unreadable record on `key`: the IP is not taken.
    fn held_by_unreadable(&self, claim: &Claim, key: &str, error: &LedgerError) -> CreateOutcome {
        super::skip_corrupt(
            error,
            "an unreadable etcd record holds this IP; not taking it",
        );
        CreateOutcome::AlreadyHeld(Box::new(super::unreadable_holder(
            claim.ip,
            &format!("etcd key {key}"),
        )))
    }

    async fn read(&self, key: &str) -> Result<Option<KeyValue>, LedgerError> {
        let response = self
            .retrying("get", |mut client| {
                let key = key.to_string();
                async move { client.get(key, None).await }
            })
            .await?;
        Ok(response.kvs().first().cloned())
    }

    /// Follow every change under the prefix after what `load` read, and hand changes made by
    /// other processes to `apply` (in etcd's order). Runs until the ledger is closed.
    ///
    /// The index is repaired whole, by `reload` with every record under the prefix (read at
    /// one revision; the watch resumes just after it), whenever events may have been missed:
    /// the watch lost history to compaction, or its stream broke and was reconnected; and
    /// every `resync_period` regardless. Each reload is logged and counted
    /// (`ip_webhook_ledger_index_resyncs_total`).
    pub async fn watch(
        &self,
        apply: impl Fn(ObservedChange) + Send,
        reload: impl Fn(Vec<Claim>) + Send,
    ) {
        let mut next = self.loaded_revision.load(Ordering::Acquire) + 1;
        let mut closed = self.closed.subscribe();
        let mut resync_at = tokio::time::Instant::now() + self.resync_period;
        let mut why_reload: Option<&'static str> = None;
        while !*closed.borrow_and_update() {
            if let Some(why) = why_reload.take() {
                let Some(revision) = self.reload_index(why, &reload, &mut closed).await else {
                    return;
                };
                next = revision + 1;
                resync_at = tokio::time::Instant::now() + self.resync_period;
            }
            let options = etcd_client::WatchOptions::new()
                .with_prefix()
                .with_prev_key()
                .with_start_revision(next);
            let stream = match self
                .client
                .clone()
                .watch(self.prefix.clone(), Some(options))
                .await
            {
                Ok(stream) => stream,
                Err(error) => {
                    tracing::warn!(%error, "etcd watch failed to start; retrying");
                    why_reload = Some("reconnect");
                    if pause(&mut closed, Duration::from_millis(500)).await {
                        return;
                    }
                    continue;
                }
            };
            match self
                .follow(stream, &mut next, resync_at, &apply, &mut closed)
                .await
            {
                Some(why) => why_reload = Some(why),
                None => return,
            }
        }
    }

    /// Read the whole prefix into the index again (`why` says what made it stale), retrying
    /// until it works; the revision it read at, or `None` once the ledger is closed.
    async fn reload_index(
        &self,
        why: &'static str,
        reload: &impl Fn(Vec<Claim>),
        closed: &mut tokio::sync::watch::Receiver<bool>,
    ) -> Option<i64> {
        loop {
            match self.load().await {
                Ok(claims) => {
                    let count = claims.len();
                    reload(claims);
                    super::index_resyncs().inc();
                    let revision = self.loaded_revision.load(Ordering::Acquire);
                    tracing::info!(
                        reason = why,
                        records = count,
                        revision,
                        "reloaded the etcd index"
                    );
                    return Some(revision);
                }
                Err(LedgerError::Closed) => return None,
                Err(error) => {
                    tracing::warn!(%error, reason = why, "reloading the etcd index failed; retrying");
                    if pause(closed, Duration::from_millis(500)).await {
                        return None;
                    }
                }
            }
        }
    }

    /// Apply a watch stream's events until it must be replaced: the reason to reload the
    /// index then (`reconnect`, `compaction`, `period`), or `None` once the ledger is closed.
    async fn follow(
        &self,
        mut stream: etcd_client::WatchStream,
        next: &mut i64,
        resync_at: tokio::time::Instant,
        apply: &impl Fn(ObservedChange),
        closed: &mut tokio::sync::watch::Receiver<bool>,
    ) -> Option<&'static str> {
        loop {
            let message = tokio::select! {
                _ = closed.wait_for(|closed| *closed) => return None,
                _ = tokio::time::sleep_until(resync_at) => return Some("period"),
                message = stream.message() => message,
            };
            let message = match message {
                Ok(Some(message)) => message,
                Ok(None) => return Some("reconnect"),
                Err(error) => {
                    tracing::warn!(%error, "etcd watch broke; reconnecting");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    return Some("reconnect");
                }
            };
            if message.compact_revision() > 0 && message.compact_revision() >= *next {
                // history the watch had not seen was compacted away: events are lost, so
                // the whole prefix is read again
                tracing::warn!(
                    from = *next,
                    to = message.compact_revision(),
                    "etcd compacted revisions the watch had not seen; reloading the index"
                );
                return Some("compaction");
            }
            if message.canceled() {
                return Some("reconnect");
            }
            for event in message.events() {
                if let Some(change) = self.observed(event, next) {
                    apply(change);
                }
            }
        }
    }

    /// What one watch event changes in the index: nothing for an event at or below the
    /// revision already applied for its key (a restarted watch repeats them), nor for a record
    /// that cannot be read.
    fn observed(&self, event: &etcd_client::Event, next: &mut i64) -> Option<ObservedChange> {
        use etcd_client::EventType;
        let kv = event.kv()?;
        *next = (*next).max(kv.mod_revision() + 1);
        let key = String::from_utf8_lossy(kv.key()).into_owned();
        let fresh = {
            let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
            let last = seen.entry(key).or_insert(0);
            let fresh = kv.mod_revision() > *last;
            *last = (*last).max(kv.mod_revision());
            fresh
        };
        if !fresh {
            return None;
        }
        match event.event_type() {
            EventType::Put => match self.decode(kv) {
                Ok(claim) if claim.locks_ip() => Some(ObservedChange::Held(claim)),
                Ok(claim) => Some(ObservedChange::Released(claim)),
                Err(error) => {
                    super::skip_corrupt(&error, "ignoring an etcd record that cannot be read");
                    None
                }
            },
            EventType::Delete => match event.prev_kv().map(|kv| self.decode(kv)) {
                Some(Ok(claim)) => Some(ObservedChange::Released(claim)),
                _ => None,
            },
        }
    }
}

/// Sleep `period` unless the ledger closes first; whether it closed.
async fn pause(closed: &mut tokio::sync::watch::Receiver<bool>, period: Duration) -> bool {
    tokio::select! {
        _ = closed.wait_for(|closed| *closed) => true,
        _ = tokio::time::sleep(period) => false,
    }
}

#[async_trait]
impl Ledger for EtcdLedger {
    fn kind(&self) -> &'static str {
        "etcd"
    }

    async fn load(&self) -> Result<Vec<Claim>, LedgerError> {
        let prefix = self.prefix.clone();
        let response = self
            .retrying("list", |mut client| {
                let prefix = prefix.clone();
                async move {
                    client
                        .get(prefix, Some(GetOptions::new().with_prefix()))
                        .await
                }
            })
            .await?;
        if let Some(header) = response.header() {
            self.loaded_revision
                .store(header.revision(), Ordering::Release);
        }
        let mut claims = Vec::with_capacity(response.kvs().len());
        for kv in response.kvs() {
            self.note_seen(&String::from_utf8_lossy(kv.key()), kv.mod_revision());
            match self.decode(kv) {
                Ok(claim) => claims.push(claim),
                Err(error) => {
                    super::skip_corrupt(&error, "skipping an etcd record that cannot be read")
                }
            }
        }
        Ok(claims)
    }

    async fn create(&self, claim: Arc<Claim>) -> Result<CreateOutcome, LedgerError> {
        let claim = &*claim;
        let key = self.key(claim);
        let value = serde_json::to_vec(claim).map_err(|e| storage("encode", e))?;
        let mut expected = None;
        for _ in 0..MAX_COMPARE_ATTEMPTS {
            match self.write_if(&key, expected, &value).await? {
                Ok(revision) => {
                    self.note_seen(&key, revision);
                    return Ok(CreateOutcome::Created);
                }
                Err(None) => expected = None,
                Err(Some(kv)) => {
                    self.note_seen(&key, kv.mod_revision());
                    let current = match self.decode(&kv) {
                        Ok(current) => current,
                        Err(error) => return Ok(self.held_by_unreadable(claim, &key, &error)),
                    };
                    match create_rule(Some(&current), claim) {
                        CreateRule::Write => {
                            expected = Some(kv.mod_revision());
                            continue;
                        }
                        CreateRule::Existing => {
                            return Ok(CreateOutcome::for_existing(current, claim));
                        }
                        CreateRule::Held => {
                            return Ok(CreateOutcome::AlreadyHeld(Box::new(current)));
                        }
                    }
                }
            }
        }
        Err(LedgerError::Storage(format!(
            "etcd key {key} changed under {MAX_COMPARE_ATTEMPTS} attempts in a row"
        )))
    }

    async fn release(&self, claim: &Claim) -> Result<bool, LedgerError> {
        let now = unix_now();
        self.update(&self.key(claim), |held| release_of(held, claim, now))
            .await
    }

    async fn transition(&self, current: &Claim, next: &Claim) -> Result<bool, LedgerError> {
        self.update(&self.key(next), |held| step_of(held, current, next))
            .await
    }

    async fn get(&self, ip: std::net::IpAddr) -> Result<Option<Claim>, LedgerError> {
        let key = format!("{}{ip}", self.prefix);
        let Some(kv) = self.read(&key).await? else {
            return Ok(None);
        };
        Ok(Some(self.decode(&kv).unwrap_or_else(|error| {
            super::skip_corrupt(&error, "an unreadable etcd record holds this IP");
            super::unreadable_holder(ip, &format!("etcd key {key}"))
        })))
    }

    fn shared(&self) -> bool {
        true
    }

    async fn ping(&self) -> Result<(), LedgerError> {
        self.retrying("status", |mut client| async move { client.status().await })
            .await
            .map(|_| ())
    }

    async fn close(&self) {
        // every acknowledged write is already durable in etcd; only refuse new calls
        self.closed.send_replace(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_get_one_leading_and_one_trailing_slash() {
        for (given, want) in [
            ("/ip-webhook/", "/ip-webhook/"),
            ("ip-webhook/", "/ip-webhook/"),
            ("ip-webhook", "/ip-webhook/"),
            ("//ip-webhook//", "/ip-webhook/"),
            ("/a/b", "/a/b/"),
            ("", "/"),
            ("///", "/"),
        ] {
            assert_eq!(normalize_prefix(given), want, "{given:?}");
        }
    }

    #[test]
    fn a_record_on_another_ip_than_its_key_is_corrupt_and_named() {
        let claim = crate::unreadable_holder("10.0.0.9".parse().unwrap(), "x");
        let value = serde_json::to_vec(&claim).unwrap();
        let error = decode_record("/p/", b"/p/10.0.0.1", &value)
            .unwrap_err()
            .to_string();
        assert_eq!(
            error,
            "ledger record for 10.0.0.1 is corrupt: etcd key /p/10.0.0.1 holds a claim on 10.0.0.9, not on the IP its key names"
        );
        assert!(decode_record("/p/", b"/p/10.0.0.9", &value).is_ok());
        let error = decode_record("/p/", b"/p/10.0.0.1", b"{")
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with(
                "ledger record for 10.0.0.1 is corrupt: etcd key /p/10.0.0.1 does not hold a claim"
            ),
            "{error}"
        );
    }
}
