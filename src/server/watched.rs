//! A stream whose reads are reported to a [`ReadWatch`]; everything else passes through. The
//! TCP stream notes its peer's first byte with it ([`super::slots`]), the TLS stream counts
//! the bytes read.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What a [`Watched`] stream tells of its reads.
pub(super) trait ReadWatch {
    /// A read brought `count` bytes (never 0).
    fn read(&self, count: usize);
}

impl<W: ReadWatch + ?Sized> ReadWatch for Arc<W> {
    fn read(&self, count: usize) {
        (**self).read(count);
    }
}

/// A flag raised by the first byte read.
impl ReadWatch for AtomicBool {
    fn read(&self, _count: usize) {
        if !self.load(Ordering::Relaxed) {
            self.store(true, Ordering::Relaxed);
        }
    }
}

/// `inner`, telling `watch` of every read that brought bytes.
pub(super) struct Watched<S, W> {
    pub(super) inner: S,
    pub(super) watch: W,
}

impl<S: AsyncRead + Unpin, W: ReadWatch + Unpin> AsyncRead for Watched<S, W> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        let read = buf.filled().len().saturating_sub(before);
        if read > 0 {
            self.watch.read(read);
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin, W: Unpin> AsyncWrite for Watched<S, W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
