//! The writer thread and its inbox: requests join a batch ([`Inbox`]), the writer applies the
//! claim rules to the whole batch, commits it to the journal with one write and one
//! `fdatasync`, and only then answers every request of it.

use std::net::IpAddr;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::oneshot;

use super::counters::{CommitCounters, Stage};
use super::journal::Journal;
use crate::claim::{CreateRule, create_rule, release_of, step_of};
use crate::{Claim, CreateOutcome, LedgerError, unix_now};

/// The answer to one request, and when the writer took and answered its batch.
pub(super) type Answer<T> = oneshot::Sender<(Result<T, LedgerError>, Times)>;

/// When the writer took a request's batch and when it sent the answers: with the request's
/// own clock, its `queue`, `commit` and `wakeup` stages.
#[derive(Clone, Copy)]
pub(super) struct Times {
    pub(super) taken: Instant,
    pub(super) answered: Instant,
}

/// A ledger answer or a journal step slower than this is logged (WARN) with its stages: on a
/// local disk it is a stall, and the line says whether the queue, the commit (and in it the
/// write or the `fdatasync`) or the wake-up of the request's thread took the time.
pub(super) const SLOW: std::time::Duration = std::time::Duration::from_millis(20);

pub(super) enum Request {
    Create(Arc<Claim>, Answer<CreateOutcome>),
    Release(Box<Claim>, Answer<bool>),
    /// `(current, next)`: a phase change.
    Transition(Box<(Claim, Claim)>, Answer<bool>),
}

pub(super) enum Msg {
    Op(Request),
    Load(oneshot::Sender<Result<Vec<Arc<Claim>>, LedgerError>>),
    /// Whether the store takes commits (and a retry of what stopped it).
    Ping(oneshot::Sender<Result<(), LedgerError>>),
}

impl Request {
    /// Answer with `error`, unapplied.
    pub(super) fn refuse(self, error: LedgerError, times: Times) {
        match self {
            Request::Create(_, tx) => drop(tx.send((Err(error), times))),
            Request::Release(_, tx) | Request::Transition(_, tx) => {
                drop(tx.send((Err(error), times)))
            }
        }
    }
}

/// Where requests wait for the writer: one batch at a time.
pub(super) struct Inbox {
    state: Mutex<InboxState>,
    /// The writer waits here for a sealed batch (or the close).
    ready: Condvar,
}

struct InboxState {
    /// The batch being formed, in arrival order, with when each request arrived.
    batch: Vec<(Msg, Instant)>,
    /// The batch's first request has let the runtime run what it had ready: the writer may
    /// take it. Requests still join a sealed batch until the writer takes it.
    sealed: bool,
    /// The writer is waiting on `ready` (only then does sealing wake it).
    idle: bool,
    /// No more requests: the writer commits what it holds and ends.
    closed: bool,
}

impl Inbox {
    pub(super) fn new() -> Inbox {
        Inbox {
            state: Mutex::new(InboxState {
                batch: Vec::with_capacity(64),
                sealed: false,
                idle: false,
                closed: false,
            }),
            ready: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, InboxState> {
        // the state stays consistent across a panic (plain fields, set in one step)
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queue `msg`; returns whether it opened the batch (then the caller must seal it) and when
    /// it was queued.
    pub(super) fn push(&self, msg: Msg) -> Result<(bool, Instant), LedgerError> {
        let mut state = self.lock();
        if state.closed {
            return Err(LedgerError::Closed);
        }
        let opened = state.batch.is_empty();
        let queued = Instant::now();
        state.batch.push((msg, queued));
        Ok((opened, queued))
    }

    /// The batch is complete: let the writer take it (waking it if it waits).
    pub(super) fn seal(&self) {
        let mut state = self.lock();
        if state.batch.is_empty() || state.sealed {
            return;
        }
        state.sealed = true;
        let wake = state.idle;
        drop(state);
        if wake {
            self.ready.notify_one();
        }
    }

    pub(super) fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_one();
    }

    /// Wait for a sealed batch and swap it for `spare` (an empty vector whose allocation is
    /// reused). Returns `false` once the inbox is closed and empty.
    pub(super) fn take(&self, spare: &mut Vec<(Msg, Instant)>) -> bool {
        let mut state = self.lock();
        while !state.sealed && !state.closed {
            state.idle = true;
            state = self.ready.wait(state).unwrap_or_else(|p| p.into_inner());
            state.idle = false;
        }
        state.sealed = false;
        std::mem::swap(&mut state.batch, spare);
        !(spare.is_empty() && state.closed)
    }
}

/// Seals the batch its request opened, also when that request is dropped before it could.
pub(super) struct Seal<'a>(pub(super) &'a Inbox);

impl Drop for Seal<'_> {
    fn drop(&mut self) {
        self.0.seal();
    }
}

/// Run the calling thread (the writer) as `SCHED_BATCH`: the same share of the CPU, but its
/// wake-up, when a batch is sealed or its `fdatasync` returns, does not preempt the thread
/// that runs requests on the same core. Those requests are filling the next batch; preempted,
/// they would pay two context switches per commit and make batches half the size. With a core to itself the writer runs at once either way. Any thread may choose this
/// policy, so it needs no privilege; the thread's niceness is set to 0.
#[cfg(target_os = "linux")]
pub fn writer_batch_policy() -> Result<(), LedgerError> {
    use thread_priority::unix::{
        NormalThreadSchedulePolicy, ThreadSchedulePolicy, set_thread_priority_and_policy,
        thread_native_id,
    };
    // The crate maps 0..=99 onto niceness 19..=-20; 47 is 0 (a unit test checks).
    let nice_zero = thread_priority::ThreadPriority::Crossplatform(
        47u8.try_into().map_err(LedgerError::SchedulingPolicy)?,
    );
    set_thread_priority_and_policy(
        thread_native_id(),
        nice_zero,
        ThreadSchedulePolicy::Normal(NormalThreadSchedulePolicy::Batch),
    )
    .map_err(|error| LedgerError::SchedulingPolicy(format!("{error:?}")))
}

#[cfg(not(target_os = "linux"))]
pub fn writer_batch_policy() -> Result<(), LedgerError> {
    Err(LedgerError::SchedulingPolicy(
        "SCHED_BATCH is Linux's".into(),
    ))
}

pub(super) fn writer_loop(mut journal: Box<Journal>, inbox: &Inbox, counters: CommitCounters) {
    let mut taken = Vec::with_capacity(64);
    let mut requests = Vec::with_capacity(64);
    journal.grow_ahead();
    while inbox.take(&mut taken) {
        let started = Instant::now();
        counters.batch_size.observe(taken.len() as f64);
        for (msg, queued) in taken.drain(..) {
            counters.stage(Stage::Queue, started.duration_since(queued).as_secs_f64());
            match msg {
                Msg::Op(request) => requests.push(request),
                Msg::Load(reply) => {
                    // the writes queued before it are committed first: a load sees them
                    if !requests.is_empty() {
                        commit_batch(&mut journal, &mut requests, &counters, Instant::now());
                    }
                    drop(reply.send(Ok(journal.load())));
                }
                Msg::Ping(reply) => {
                    if !requests.is_empty() {
                        commit_batch(&mut journal, &mut requests, &counters, Instant::now());
                    }
                    drop(reply.send(journal.ping()));
                }
            }
        }
        if !requests.is_empty() {
            commit_batch(&mut journal, &mut requests, &counters, started);
        }
        // the batch has its answers: room for the next ones is made now, not in their commit
        journal.grow_ahead();
    }
    journal.close();
}

pub(super) enum Reply {
    Create(Answer<CreateOutcome>, CreateOutcome),
    Changed(Answer<bool>, bool),
}

/// Where the claim rules read and write during one batch.
pub(super) trait Records {
    fn read(&mut self, ip: IpAddr) -> Result<Option<Arc<Claim>>, LedgerError>;
    fn write(&mut self, claim: Arc<Claim>) -> Result<(), LedgerError>;
}

/// Apply the claim rules to every request of the batch; returns the answers and the count of
/// writes.
pub(super) fn apply(
    records: &mut impl Records,
    batch: &mut Vec<Request>,
    replies: &mut Vec<Reply>,
) -> Result<u64, LedgerError> {
    let mut writes = 0u64;
    // on an error the requests not reached are dropped with the drain: their waiters see
    // their answer channel close
    for request in batch.drain(..) {
        match request {
            Request::Create(claim, reply) => {
                let existing = records.read(claim.ip)?;
                let outcome = match create_rule(existing.as_deref(), &claim) {
                    CreateRule::Write => {
                        records.write(claim)?;
                        writes += 1;
                        CreateOutcome::Created
                    }
                    CreateRule::Existing => CreateOutcome::for_existing(
                        Arc::unwrap_or_clone(existing.expect("a rule about an existing record")),
                        &claim,
                    ),
                    CreateRule::Held => CreateOutcome::AlreadyHeld(Box::new(Arc::unwrap_or_clone(
                        existing.expect("a rule about an existing record"),
                    ))),
                };
                replies.push(Reply::Create(reply, outcome));
            }
            Request::Release(claim, reply) => {
                let next = records
                    .read(claim.ip)?
                    .and_then(|held| release_of(&held, &claim, unix_now()));
                let changed = next.is_some();
                if let Some(next) = next {
                    records.write(Arc::new(next))?;
                    writes += 1;
                }
                replies.push(Reply::Changed(reply, changed));
            }
            Request::Transition(pair, reply) => {
                let (current, next) = *pair;
                let written = records
                    .read(next.ip)?
                    .and_then(|record| step_of(&record, &current, &next));
                let changed = written.is_some();
                if let Some(written) = written {
                    records.write(Arc::new(written))?;
                    writes += 1;
                }
                replies.push(Reply::Changed(reply, changed));
            }
        }
    }
    Ok(writes)
}

fn commit_batch(
    journal: &mut Journal,
    batch: &mut Vec<Request>,
    counters: &CommitCounters,
    started: Instant,
) {
    let mut replies = Vec::with_capacity(batch.len());
    let result = journal.commit(batch, &mut replies);
    match result {
        Ok(writes) => {
            if writes > 0 {
                counters.commits.inc();
                counters.writes.inc_by(writes);
                let seconds = started.elapsed().as_secs_f64();
                counters.commit_seconds.observe(seconds);
                counters.stage(Stage::Commit, seconds);
            }
            let times = Times {
                taken: started,
                answered: Instant::now(),
            };
            if times.answered.duration_since(started) >= SLOW {
                tracing::warn!(
                    batch = replies.len(),
                    writes,
                    commit_us = times.answered.duration_since(started).as_micros() as u64,
                    "slow ledger commit"
                );
            }
            for reply in replies {
                match reply {
                    Reply::Create(tx, outcome) => drop(tx.send((Ok(outcome), times))),
                    Reply::Changed(tx, changed) => drop(tx.send((Ok(changed), times))),
                }
            }
            // after the answers: the mark is no part of any admission's wait
            journal.mark_acknowledged();
        }
        Err(error) => {
            // Nothing of this batch is durable: every waiter hears the error; requests not
            // yet reached in the batch were dropped, and their waiters see the channel close.
            let message = error.to_string();
            let again = |error: &LedgerError| match error {
                LedgerError::DiskFull { dir, error } => LedgerError::DiskFull {
                    dir: dir.clone(),
                    error: error.clone(),
                },
                _ => LedgerError::Storage(message.clone()),
            };
            if matches!(error, LedgerError::DiskFull { .. }) {
                // said once by the journal (WARN), and on /readyz
                tracing::debug!(%message, "ledger commit refused");
            } else {
                tracing::error!(%message, "ledger commit failed");
            }
            let times = Times {
                taken: started,
                answered: Instant::now(),
            };
            for reply in replies {
                match reply {
                    Reply::Create(tx, _) => drop(tx.send((Err(again(&error)), times))),
                    Reply::Changed(tx, _) => drop(tx.send((Err(again(&error)), times))),
                }
            }
            // refused before the claim rules ran: every request of the batch hears it too
            for request in batch.drain(..) {
                request.refuse(again(&error), times);
            }
        }
    }
}
