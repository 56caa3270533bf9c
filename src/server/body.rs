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

/// Read the body, taking from the budget what the declared length did not reserve; never more
/// than [`MAX_BODY_BYTES`]. `keep_frame`: a body in one frame may be kept as that frame
/// ([`Gathered`]; HTTP/1 only).
pub(super) async fn read_body<'a>(
    mut body: Incoming,
    declared: Option<usize>,
    keep_frame: bool,
    budget: &'a Semaphore,
    held: &mut Held<'a>,
) -> Result<Bytes, BodyError> {
    let mut gathered = match keep_frame {
        true => Gathered::default(),
        false => Gathered::Joined(bytes::BytesMut::with_capacity(declared.unwrap_or(0))),
    };
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(BodyError::Read)?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        let total = gathered.len() + data.len();
        if total > MAX_BODY_BYTES {
            return Err(BodyError::TooLarge(body));
        }
        if total > held.bytes && !held.take(budget, total - held.bytes) {
            return Err(BodyError::Busy(body));
        }
        gathered.push(data, declared.unwrap_or(0).max(total));
    }
    Ok(gathered.into_bytes())
}

/// The smallest body kept as the frame it came in ([`Gathered`]).
const KEPT_FRAME_MIN: usize = H1_MAX_BUF / 16;

/// A body's bytes as its frames arrive. Over HTTP/1, a body that comes in one frame of at least
/// [`KEPT_FRAME_MIN`] bytes (the usual review, read whole) is kept as that frame, a view of the
/// connection's read buffer, with no copy: a copy put each body in a block of its own, one more
/// 6 KB block written per request and cold again by the time a durable admission's commit has
/// come back. The view holds the connection's read buffer (at most [`H1_MAX_BUF`], which the
/// connection keeps anyway, one request at a time) until the decision drops the body; a
/// smaller body is copied, so that it never holds a buffer more than 16 times its size. Over
/// HTTP/2 every body is copied: a frame there is a view of a chunk of the connection's read
/// buffer, and many streams' bodies kept as views could hold many such chunks beyond what the
/// in-flight budget counts. Frames after the first are joined with it in a buffer of their own.
enum Gathered {
    Frame(Bytes),
    Joined(bytes::BytesMut),
}

impl Default for Gathered {
    fn default() -> Gathered {
        Gathered::Frame(Bytes::new())
    }
}

impl Gathered {
    fn len(&self) -> usize {
        match self {
            Gathered::Frame(frame) => frame.len(),
            Gathered::Joined(joined) => joined.len(),
        }
    }

    /// Add `data`; `room` is the capacity a joined buffer starts with.
    fn push(&mut self, data: Bytes, room: usize) {
        if data.is_empty() {
            return; // an HTTP/2 client may end the stream with an empty DATA frame
        }
        match self {
            Gathered::Frame(first) if first.is_empty() && data.len() >= KEPT_FRAME_MIN => {
                *first = data
            }
            Gathered::Frame(first) => {
                let mut joined = bytes::BytesMut::with_capacity(room);
                joined.extend_from_slice(first);
                joined.extend_from_slice(&data);
                *self = Gathered::Joined(joined);
            }
            Gathered::Joined(joined) => joined.extend_from_slice(&data),
        }
    }

    fn into_bytes(self) -> Bytes {
        match self {
            Gathered::Frame(frame) => frame,
            Gathered::Joined(joined) => joined.freeze(),
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_frame_is_kept_as_it_came_and_frames_are_joined_in_order() {
        let review = Bytes::from(vec![b' '; KEPT_FRAME_MIN]);
        let mut one = Gathered::default();
        one.push(review.clone(), 0);
        one.push(Bytes::new(), 0);
        let kept = one.into_bytes();
        assert_eq!(kept, review);
        assert_eq!(
            kept.as_ptr(),
            review.as_ptr(),
            "a body in one frame is not copied"
        );

        let small = Bytes::from_static(b"{\"kind\":\"AdmissionReview\"}");
        let mut copied = Gathered::default();
        copied.push(small.clone(), 0);
        let copied = copied.into_bytes();
        assert_eq!(copied, small);
        assert_ne!(
            copied.as_ptr(),
            small.as_ptr(),
            "a small body does not hold the buffer it was read into"
        );

        let mut several = Gathered::default();
        for (i, part) in ["{\"a\":", "1", "", ",\"b\":2}"].into_iter().enumerate() {
            several.push(Bytes::from_static(part.as_bytes()), 4);
            assert_eq!(several.len(), [5, 6, 6, 13][i]);
        }
        assert_eq!(
            several.into_bytes(),
            Bytes::from_static(b"{\"a\":1,\"b\":2}")
        );
        assert!(Gathered::default().into_bytes().is_empty());
    }
}
