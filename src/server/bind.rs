//! Binding the HTTPS and admin listeners, before anything is written: a busy address is one
//! line naming it, and a failed start leaves no certificate behind.

use std::net::SocketAddr;

use tokio::net::TcpListener;

/// Both listeners, bound and not yet served.
pub(crate) struct Listeners {
    pub(super) https: TcpListener,
    pub(super) admin: TcpListener,
}

impl Listeners {
    /// The addresses bound (port 0 replaced by the port the kernel chose).
    pub(crate) fn addrs(&self) -> std::io::Result<(SocketAddr, SocketAddr)> {
        Ok((self.https.local_addr()?, self.admin.local_addr()?))
    }
}

/// A listener that could not be bound: which one, where, and why.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr} ({what}): {reason}")]
pub(crate) struct BindError {
    pub(crate) addr: SocketAddr,
    pub(crate) what: &'static str,
    pub(crate) reason: String,
}

async fn bind_one(addr: SocketAddr, what: &'static str) -> Result<TcpListener, BindError> {
    TcpListener::bind(addr).await.map_err(|error| BindError {
        addr,
        what,
        reason: match error.kind() {
            std::io::ErrorKind::AddrInUse => {
                "the address is in use (another process listens there; stop it or choose another address)".into()
            }
            _ => error.to_string(),
        },
    })
}

/// Bind the HTTPS listener at `listen` and the admin listener at `admin_listen`.
pub(crate) async fn bind(
    listen: SocketAddr,
    admin_listen: SocketAddr,
) -> Result<Listeners, BindError> {
    Ok(Listeners {
        https: bind_one(listen, "the HTTPS listener").await?,
        admin: bind_one(admin_listen, "the admin listener").await?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_busy_address_is_named() {
        let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = busy.local_addr().unwrap();
        let free: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let error = bind(free, addr).await.err().unwrap();
        assert_eq!(
            error.to_string(),
            format!(
                "cannot listen on {addr} (the admin listener): the address is in use (another process listens there; stop it or choose another address)"
            )
        );
        let error = bind(addr, free).await.err().unwrap();
        assert_eq!(error.what, "the HTTPS listener");
        let bound = bind(free, free).await.unwrap();
        let (https, admin) = bound.addrs().unwrap();
        assert_ne!(https.port(), 0);
        assert_ne!(https, admin);
    }
}
