//! Loopback ports for servers the tests start as child processes (etcd, the fake API server).

use std::net::TcpListener;
use std::sync::atomic::{AtomicU16, Ordering};

/// Ports below the kernel's ephemeral range (32768–60999 by default): binding `127.0.0.1:0` and
/// handing the port to a child leaves a window in which another test's outgoing connection can
/// take it as its local port, and an etcd member restarted on its own port meets the same race
/// ("bind: address already in use").
const FIRST: u16 = 20_000;
const SPAN: u16 = 12_000;

/// A loopback port nothing listens on now, never handed out before by this test process. The
/// starting point depends on the process id, so two test binaries rarely walk the same ports.
pub fn listen_port() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let base = (std::process::id() % u32::from(SPAN)) as u16;
    for _ in 0..SPAN {
        let step = NEXT.fetch_add(1, Ordering::Relaxed) % SPAN;
        let port = FIRST + (base + step) % SPAN;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {FIRST}..{}", FIRST + SPAN)
}
