//! Connection slots: `--max-connections` in all, of which at most `--max-handshakes` may be
//! still in their TLS handshake.
//!
//! A connection that has not finished its handshake has proved nothing (with
//! `--client-ca-file`, a finished one has shown the API server's certificate), and one that
//! never sends a ClientHello costs its sender nothing. So a handshaking connection never keeps
//! a slot from a newcomer: when the handshake budget or the whole pool is full, the oldest
//! handshaking connection that has sent no byte yet (else the oldest handshaking one) is closed
//! and its slot handed to the newcomer. Only when every slot is held by a connection past its
//! handshake is a newcomer refused. A legitimate handshake (a few milliseconds) is closed only
//! if `--max-handshakes` newer connections arrive while it runs and none of them is silent.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::ReadBuf;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};

use super::watched::Watched;

/// A connection admitted to a slot.
pub(super) enum Admission {
    /// In a slot that was free.
    Admitted(HandshakeSlot),
    /// In the slot of a handshaking connection that was closed to make room.
    Evicted(HandshakeSlot),
    /// Every slot is held by a connection past its handshake.
    Refused,
}

/// Every slot, and the handshaking connections holding some of them.
pub(super) struct Slots {
    /// One permit per connection, handshaking or not (`--max-connections`).
    pub(super) total: Arc<Semaphore>,
    max_handshakes: usize,
    handshaking: Mutex<Handshaking>,
}

#[derive(Default)]
struct Handshaking {
    next_id: u64,
    /// By arrival: the oldest first.
    open: BTreeMap<u64, Entry>,
}

struct Entry {
    permit: OwnedSemaphorePermit,
    /// Dropping it tells the connection to close.
    close: oneshot::Sender<()>,
    /// Whether the peer has sent a byte.
    heard: Arc<AtomicBool>,
}

impl Handshaking {
    /// Close the handshaking connection that has waited longest, a silent one first; its
    /// permit is returned for the newcomer.
    fn evict(&mut self) -> Option<OwnedSemaphorePermit> {
        let id = self
            .open
            .iter()
            .find(|(_, entry)| !entry.heard.load(Ordering::Relaxed))
            .or_else(|| self.open.iter().next())
            .map(|(id, _)| *id)?;
        let entry = self.open.remove(&id)?;
        drop(entry.close);
        Some(entry.permit)
    }
}

impl Slots {
    pub(super) fn new(max_connections: usize, max_handshakes: usize) -> Arc<Slots> {
        let max_connections = max_connections.clamp(1, Semaphore::MAX_PERMITS);
        Arc::new(Slots {
            total: Arc::new(Semaphore::new(max_connections)),
            max_handshakes: max_handshakes.clamp(1, max_connections),
            handshaking: Mutex::new(Handshaking::default()),
        })
    }

    /// A slot for a connection just accepted, whose reads set `heard`.
    pub(super) fn admit(self: &Arc<Self>, heard: Arc<AtomicBool>) -> Admission {
        let mut handshaking = self.lock();
        let (permit, evicted) = if handshaking.open.len() >= self.max_handshakes {
            match handshaking.evict() {
                Some(permit) => (permit, true),
                None => return Admission::Refused,
            }
        } else {
            match self.total.clone().try_acquire_owned() {
                Ok(permit) => (permit, false),
                Err(_) => match handshaking.evict() {
                    Some(permit) => (permit, true),
                    None => return Admission::Refused,
                },
            }
        };
        let id = handshaking.next_id;
        handshaking.next_id += 1;
        let (close, closed) = oneshot::channel();
        handshaking.open.insert(
            id,
            Entry {
                permit,
                close,
                heard,
            },
        );
        let slot = HandshakeSlot {
            slots: self.clone(),
            id,
            closed: Some(closed),
        };
        if evicted {
            Admission::Evicted(slot)
        } else {
            Admission::Admitted(slot)
        }
    }

    /// Connections in their handshake now.
    #[cfg(test)]
    fn handshaking(&self) -> usize {
        self.lock().open.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Handshaking> {
        // every change is one map operation, so a poisoned lock is still consistent
        self.handshaking.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A handshaking connection's claim on its slot; dropped, it gives the slot back.
pub(super) struct HandshakeSlot {
    slots: Arc<Slots>,
    id: u64,
    closed: Option<oneshot::Receiver<()>>,
}

impl HandshakeSlot {
    /// Resolves when the connection was closed to make room for a newer one.
    pub(super) async fn closed(&mut self) {
        match self.closed.as_mut() {
            // the sender is dropped, never used: an error is the signal
            Some(closed) => {
                let _ = closed.await;
            }
            None => std::future::pending().await,
        }
    }

    /// The handshake is done: the connection keeps its slot as an established one, unless it
    /// was closed to make room in the meantime (`None`).
    pub(super) fn established(self) -> Option<OwnedSemaphorePermit> {
        self.slots.lock().open.remove(&self.id).map(|e| e.permit)
    }
}

impl Drop for HandshakeSlot {
    fn drop(&mut self) {
        self.slots.lock().open.remove(&self.id);
    }
}

/// Whether bytes from the peer are already waiting on `tcp` (a ClientHello sent with the
/// connection), looked at without reading or waiting.
pub(super) fn has_sent(tcp: &tokio::net::TcpStream) -> bool {
    let mut byte = [0u8; 1];
    let mut buf = ReadBuf::new(&mut byte);
    let mut cx = Context::from_waker(std::task::Waker::noop());
    matches!(tcp.poll_peek(&mut cx, &mut buf), Poll::Ready(Ok(n)) if n > 0)
}

/// A TCP stream that notes its peer's first byte (a ClientHello under way) in its flag.
pub(super) type Noticing<S> = Watched<S, Arc<AtomicBool>>;

/// How long a new connection may take to send its first byte before it is weighed for a
/// handshake slot as a silent one.
pub(super) const FIRST_BYTE_WAIT: Duration = Duration::from_millis(10);

/// A handshake slot for `tcp`, weighed by whether it has sent a byte; `None` when every slot
/// is held past its handshake (closed at once). The flag says a silent connection was pushed
/// out to make room.
pub(super) fn admit(
    slots: &Arc<Slots>,
    tcp: tokio::net::TcpStream,
    webhook: &crate::decisions::Webhook,
) -> Option<(Noticing<tokio::net::TcpStream>, HandshakeSlot, bool)> {
    let refused = |reason| {
        webhook
            .metrics
            .load_refusals
            .get_or_create(&crate::metrics::ReasonLabels { reason })
            .inc();
    };
    let heard = Arc::new(AtomicBool::new(has_sent(&tcp)));
    let (slot, crowded) = match slots.admit(heard.clone()) {
        Admission::Admitted(slot) => (slot, false),
        Admission::Evicted(slot) => {
            refused("handshake_evicted");
            (slot, true)
        }
        Admission::Refused => {
            // closed at once: nothing of it is buffered, and the kernel's queue stays short
            refused("max_connections");
            return None;
        }
    };
    let _ = tcp.set_nodelay(true);
    Some((
        Watched {
            inner: tcp,
            watch: heard,
        },
        slot,
        crowded,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn heard(value: bool) -> Arc<AtomicBool> {
        Arc::new(AtomicBool::new(value))
    }

    fn slot(admission: Admission) -> (HandshakeSlot, bool) {
        match admission {
            Admission::Admitted(slot) => (slot, false),
            Admission::Evicted(slot) => (slot, true),
            Admission::Refused => panic!("refused"),
        }
    }

    #[tokio::test]
    async fn handshakes_never_keep_a_slot_from_a_newcomer() {
        let slots = Slots::new(4, 2);
        let (mut silent, evicted) = slot(slots.admit(heard(false)));
        assert!(!evicted);
        let (talking, _) = slot(slots.admit(heard(true)));
        // the handshake budget is full: the silent one goes, though it is not the only one
        let (third, evicted) = slot(slots.admit(heard(true)));
        assert!(evicted);
        silent.closed().await;
        assert_eq!(slots.handshaking(), 2);
        // established connections keep their slots
        let a = talking.established().expect("not evicted");
        let b = third.established().expect("not evicted");
        assert_eq!(slots.handshaking(), 0);
        let (c, _) = slot(slots.admit(heard(true)));
        let c = c.established().unwrap();
        let (d, evicted) = slot(slots.admit(heard(false)));
        assert!(!evicted);
        // all four slots taken, one by a handshake: a newcomer takes that one
        let (e, evicted) = slot(slots.admit(heard(false)));
        assert!(evicted);
        assert!(d.established().is_none(), "d was closed for e");
        let e = e.established().unwrap();
        // every slot past its handshake: refused
        assert!(matches!(slots.admit(heard(false)), Admission::Refused));
        drop((a, b, c));
        assert_eq!(slots.total.available_permits(), 3);
        drop(e);
        assert_eq!(slots.total.available_permits(), 4);
        drop(silent);
    }

    #[tokio::test]
    async fn a_failed_handshake_gives_its_slot_back() {
        let slots = Slots::new(1, 1);
        let (first, _) = slot(slots.admit(heard(false)));
        assert_eq!(slots.total.available_permits(), 0);
        drop(first);
        assert_eq!(slots.total.available_permits(), 1);
        assert_eq!(slots.handshaking(), 0);
    }
}
