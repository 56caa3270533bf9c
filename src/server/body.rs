//! Request bodies within the in-flight byte budget: reading one whole (never past
//! [`super::MAX_BODY_BYTES`]) and dropping the rest of one answered early.

use super::*;

/// Bytes of the in-flight budget held by one request.
#[derive(Default)]
pub(super) struct Held<'a> {
    permits: Option<SemaphorePermit<'a>>,
    pub(super) bytes: usize,
}

impl<'a> Held<'a> {
    /// Take `bytes` more of the budget, or nothing (false) when it is spent.
    pub(super) fn take(&mut self, budget: &'a Semaphore, bytes: usize) -> bool {
        if bytes == 0 {
            return true;
        }
        let Ok(wanted) = u32::try_from(bytes) else {
            return false;
        };
        match budget.try_acquire_many(wanted) {
            Ok(permit) => {
                match &mut self.permits {
                    Some(held) => held.merge(permit),
                    None => self.permits = Some(permit),
                }
                self.bytes += bytes;
                true
            }
            Err(_) => false,
        }
    }
}

pub(super) enum BodyError {
    TooLarge(Incoming),
    Busy(Incoming),
    Read(hyper::Error),
}

/// Read the body into one buffer, taking from the budget what the declared length did not
/// reserve; never more than [`MAX_BODY_BYTES`].
pub(super) async fn read_body<'a>(
    mut body: Incoming,
    declared: Option<usize>,
    budget: &'a Semaphore,
    held: &mut Held<'a>,
) -> Result<Bytes, BodyError> {
    let mut buffer = bytes::BytesMut::with_capacity(declared.unwrap_or(0));
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(BodyError::Read)?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        let total = buffer.len() + data.len();
        if total > MAX_BODY_BYTES {
            return Err(BodyError::TooLarge(body));
        }
        if total > held.bytes && !held.take(budget, total - held.bytes) {
            return Err(BodyError::Busy(body));
        }
        buffer.extend_from_slice(&data);
    }
    Ok(buffer.freeze())
}

/// Read and drop the rest of a body answered early (at most twice the body limit, within
/// `within`), so an HTTP/2 stream ends cleanly instead of being reset.
pub(super) async fn discard(mut body: Incoming, within: Duration) {
    let _ = tokio::time::timeout(within, async {
        let mut seen = 0usize;
        while let Some(Ok(frame)) = body.frame().await {
            seen += frame.data_ref().map_or(0, Bytes::len);
            if seen > 2 * MAX_BODY_BYTES {
                break;
            }
        }
    })
    .await;
}
