//! Logging: `tracing` to stderr, as text or JSON, at the level `RUST_LOG` names (default info).
//!
//! Every admission decision logs a line, so lines cost little: the text format is written
//! directly ([`Text`]), and lines are buffered and written by a flusher thread every 50 ms, or
//! as soon as 1 MiB waits, instead of one write(2) each from the request thread. Warnings and
//! errors go out at once (after what is buffered, so the order holds), and dropping the
//! `LogGuard` writes what is left.

use std::fmt::Debug;
use std::io::Write;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::{FormatEvent, FormatFields, Writer};
use tracing_subscriber::fmt::{FmtContext, MakeWriter};
use tracing_subscriber::registry::LookupSpan;

const FLUSH_EVERY: Duration = Duration::from_millis(50);
/// Large enough that a busy server's flushes follow [`FLUSH_EVERY`], not the buffer's size:
/// each flush wakes the flusher on a core the request threads share, and at 25,000 grants a
/// second 64 KiB filled every 9 ms, 110 flushes a second instead of 20, for about 2 % more
/// CPU per durable admission (docs/performance.md, "Log flushes by the clock").
const FLUSH_AT_BYTES: usize = 1024 * 1024;

/// Whether `init` chose JSON: then the process writes nothing but JSON lines, so what it would
/// print as plain text at startup (the serving line) goes out as a log event instead.
static JSON: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// True when the logs are JSON (`--log-format json`).
pub(crate) fn json() -> bool {
    JSON.load(std::sync::atomic::Ordering::Relaxed)
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

/// Library log lines that only repeat, at a louder level, what ip-webhook reports itself: each
/// target with the level it is kept to.
///
/// - rustls's per-connection SNI warning: a client that connects by IP address (a kubelet
///   probe, `curl https://10.0.0.5:8443`) sends the IP as SNI, which rustls ignores with a WARN
///   on every handshake (rustls `src/msgs/handshake.rs`, "Illegal SNI extension: ignoring IP
///   address presented as hostname").
/// - kube-client's ERROR for every failed request (kube-client `src/client/builder.rs`,
///   "failed with error …"): the caller gets the same error and says what it was doing, so an
///   unreachable API server printed a stray ERROR line before the command's own `Error:`.
const QUIETED: [(&str, &str); 2] = [
    ("rustls::msgs::handshake", "error"),
    ("kube_client::client::builder", "off"),
];

/// The filter `text` with the lines of [`QUIETED`] kept to their level. Shown at debug and
/// finer, or when `text` names the library (its crate) itself.
pub(crate) fn with_quiet_libraries(text: &str) -> String {
    if text.trim().eq_ignore_ascii_case("off") {
        // a directive for a library would turn its lines back on
        return text.to_string();
    }
    let verbose = text.split(',').any(|directive| {
        let level = directive.rsplit('=').next().unwrap_or("").trim();
        matches!(level.to_ascii_lowercase().as_str(), "debug" | "trace")
    });
    let mut filter = text.to_string();
    for (target, level) in QUIETED {
        let library = target.split("::").next().unwrap_or(target);
        if !verbose && !text.contains(library) {
            filter.push_str(&format!(",{target}={level}"));
        }
    }
    filter
}

/// Install the global subscriber. Keep the guard until the process ends. `level`, when given,
/// replaces `RUST_LOG` (the commands other than `serve`: nothing unless `-v`).
pub(crate) fn init(format: LogFormat, level: Option<&str>) -> LogGuard {
    JSON.store(
        matches!(format, LogFormat::Json),
        std::sync::atomic::Ordering::Relaxed,
    );
    let (writer, guard) = buffered(Box::new(std::io::stderr()));
    let text = match level {
        Some(level) => level.to_string(),
        None => std::env::var(tracing_subscriber::EnvFilter::DEFAULT_ENV)
            .ok()
            .filter(|v| !v.trim().is_empty())
            .unwrap_or_else(|| "info".into()),
    };
    let filter = tracing_subscriber::EnvFilter::try_new(with_quiet_libraries(&text))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    let _ = match format {
        // Fields at the top level, as zap-based peers write them (`{"level":…,"message":…}`).
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Text => builder.event_format(Text).try_init(),
    };
    guard
}

/// The text format: `2026-11-30T00:52:05.418119Z  INFO ip_webhook::decisions::dispatch:
/// admission decision uid="…" latency_us=41 …`, the shape of tracing-subscriber's default
/// without colours or span context (ip-webhook opens no spans).
///
/// Every grant logs a line at INFO, so a line is built with plain `String` pushes into a
/// buffer of the thread (not a `dyn fmt::Write` call per piece) and handed to the subscriber's
/// writer in one piece; the date and time to the second are formatted once a second.
pub struct Text;

/// What each thread keeps between its lines: the line being built, and the text of the last
/// second a line was stamped with.
struct LineBuffer {
    line: String,
    second: i64,
    /// `second` as `2026-11-30T00:52:05`; empty when no second is cached.
    second_text: String,
}

thread_local! {
    static LINE: std::cell::RefCell<LineBuffer> = const {
        std::cell::RefCell::new(LineBuffer {
            line: String::new(),
            second: 0,
            second_text: String::new(),
        })
    };
}

impl<S, N> FormatEvent<S, N> for Text
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        LINE.with(|buffer| match buffer.try_borrow_mut() {
            Ok(mut buffer) => {
                let LineBuffer {
                    line,
                    second,
                    second_text,
                } = &mut *buffer;
                line.clear();
                push_line(line, (second, second_text), event);
                writer.write_str(line)
            }
            // a field's `Debug` that logs: the inner line gets a buffer of its own
            Err(_) => {
                let mut line = String::new();
                push_line(&mut line, (&mut 0, &mut String::new()), event);
                writer.write_str(&line)
            }
        })
    }
}

/// Append `event`'s line to `line`, with its newline.
fn push_line(line: &mut String, cached: (&mut i64, &mut String), event: &Event<'_>) {
    let meta = event.metadata();
    push_now(line, cached);
    line.push_str(match *meta.level() {
        Level::ERROR => " ERROR ",
        Level::WARN => "  WARN ",
        Level::INFO => "  INFO ",
        Level::DEBUG => " DEBUG ",
        Level::TRACE => " TRACE ",
    });
    line.push_str(meta.target());
    line.push(':');
    event.record(&mut TextFields { line });
    line.push('\n');
}

/// The time now as RFC 3339 UTC with microseconds (`2026-11-30T00:52:05.418119Z`, what jiff
/// writes with `{:.6}`), the part to the second formatted once per second (`cached`).
fn push_now(line: &mut String, (second, second_text): (&mut i64, &mut String)) {
    use std::fmt::Write as _;
    let now = jiff::Timestamp::now();
    let micros = now.subsec_microsecond();
    if now.as_second() != *second || second_text.is_empty() {
        second_text.clear();
        let _ = write!(second_text, "{now:.6}");
        // keep `…T00:52:05` only if the text has the shape this appends to; else no cache
        let cut = second_text.len().saturating_sub(8);
        if micros >= 0
            && second_text
                .get(cut..)
                .is_some_and(|tail| tail.starts_with('.'))
        {
            second_text.truncate(cut);
            *second = now.as_second();
        } else {
            line.push_str(second_text);
            second_text.clear();
            return;
        }
    }
    line.push_str(second_text);
    line.push('.');
    let mut digits = itoa::Buffer::new();
    let digits = digits.format(micros.unsigned_abs());
    line.extend(std::iter::repeat_n(
        '0',
        6usize.saturating_sub(digits.len()),
    ));
    line.push_str(digits);
    line.push('Z');
}

/// ` name=value` per field; strings quoted (escaped as `Debug` escapes them when they hold a
/// quote, a backslash or a control character), the message as it is.
struct TextFields<'a> {
    line: &'a mut String,
}

impl TextFields<'_> {
    fn name(&mut self, field: &Field) {
        self.line.push(' ');
        if field.name() != "message" {
            self.line.push_str(field.name());
            self.line.push('=');
        }
    }

    fn number(&mut self, field: &Field, value: impl itoa::Integer) {
        self.name(field);
        self.line.push_str(itoa::Buffer::new().format(value));
    }
}

impl Visit for TextFields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        use std::fmt::Write as _;
        self.name(field);
        if field.name() == "message" {
            self.line.push_str(value);
        } else if ip_webhook_admission::needs_escape(value) {
            let _ = write!(self.line, "{value:?}");
        } else {
            self.line.push('"');
            self.line.push_str(value);
            self.line.push('"');
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.number(field, value);
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.number(field, value);
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.name(field);
        self.line.push_str(if value { "true" } else { "false" });
    }

    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        use std::fmt::Write as _;
        self.name(field);
        let _ = write!(self.line, "{value:?}");
    }
}

/// A writer for the subscriber that buffers into `sink`, and the guard that flushes it.
///
/// Not `tracing-appender`'s non-blocking writer: that one sends every line to its worker
/// through a channel and writes each on its own (one write(2) a line, the cost this avoids),
/// drops lines when its queue is full (or blocks, when told to) where this never drops one,
/// and has no notion of a warning that must go out at once. Measured: a build with its lossless
/// writer in place of this one cost 5 % more CPU per durable `/mutate` (`scripts/bench-ab.sh`,
/// 16 alternating rounds, B ÷ A = 1.050, and 1.048 in an earlier 8), with 0.6 % more
/// user-space instructions (`scripts/bench-instructions.sh`): the difference is its write(2)s.
pub(crate) fn buffered(sink: Box<dyn Write + Send>) -> (BufferedWriter, LogGuard) {
    let shared = Arc::new(Shared {
        pending: Mutex::new(Pending::default()),
        sink: Mutex::new(Sink {
            sink,
            spare: Vec::new(),
        }),
        wake: Condvar::new(),
    });
    let flusher = {
        let shared = shared.clone();
        std::thread::Builder::new()
            .name("log-flusher".into())
            .spawn(move || shared.flush_periodically())
            .ok()
    };
    (
        BufferedWriter {
            shared: shared.clone(),
        },
        LogGuard { shared, flusher },
    )
}

/// Request threads only ever take `pending`, briefly: the disk is written under `sink`, so a
/// slow write (say, while the ledger fsyncs) never holds up an admission.
struct Shared {
    pending: Mutex<Pending>,
    sink: Mutex<Sink>,
    wake: Condvar,
}

/// The log's destination, and the buffer last written to it, emptied: the next flush swaps it
/// in for the lines it takes, so `pending` starts each period with room already made instead
/// of growing from nothing again.
struct Sink {
    sink: Box<dyn Write + Send>,
    spare: Vec<u8>,
}

#[derive(Default)]
struct Pending {
    lines: Vec<u8>,
    stopping: bool,
}

/// The largest buffer a flush keeps for the next period's lines: a period's lines fit in it,
/// and an idle server holds at most two of them (this and the one being filled).
const SPARE_AT_MOST: usize = FLUSH_AT_BYTES;

/// Past this much waiting, a writer writes the buffer itself (back-pressure, not loss).
const BLOCK_AT_BYTES: usize = 4 * 1024 * 1024;

fn relock<T>(result: Result<T, std::sync::PoisonError<T>>) -> T {
    result.unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Shared {
    fn pending(&self) -> MutexGuard<'_, Pending> {
        relock(self.pending.lock())
    }

    /// Write what waits. Lines leave `pending` while `sink` is held, so they reach the sink in
    /// the order they were logged, whoever writes them.
    fn flush(&self) {
        let mut sink = relock(self.sink.lock());
        let Sink { sink, spare } = &mut *sink;
        {
            let mut pending = self.pending();
            if pending.lines.is_empty() {
                return;
            }
            std::mem::swap(&mut pending.lines, spare);
        }
        // Nowhere to report a failed log write; the lines are dropped, the webhook goes on.
        let _ = sink.write_all(spare);
        let _ = sink.flush();
        spare.clear();
        if spare.capacity() > SPARE_AT_MOST {
            // after a burst (or a stuck sink) the buffer is not kept at its peak
            *spare = Vec::new();
        }
    }

    /// Writes each line within [`FLUSH_EVERY`] of its logging, and with nothing logged sleeps
    /// until something is: an idle server's flusher does not wake.
    fn flush_periodically(&self) {
        loop {
            let stopping = {
                let mut pending = self.pending();
                while pending.lines.is_empty() && !pending.stopping {
                    pending = relock(self.wake.wait(pending));
                }
                // the first line waits for company, unless the buffer fills first
                if !pending.stopping && pending.lines.len() < FLUSH_AT_BYTES {
                    pending = relock(self.wake.wait_timeout(pending, FLUSH_EVERY)).0;
                }
                pending.stopping
            };
            self.flush();
            if stopping {
                return;
            }
        }
    }
}

/// Flushes the log buffer when dropped.
pub(crate) struct LogGuard {
    shared: Arc<Shared>,
    flusher: Option<JoinHandle<()>>,
}

impl Drop for LogGuard {
    fn drop(&mut self) {
        self.shared.pending().stopping = true;
        self.shared.wake.notify_all();
        if let Some(flusher) = self.flusher.take() {
            let _ = flusher.join();
        }
        self.shared.flush();
    }
}

#[derive(Clone)]
pub(crate) struct BufferedWriter {
    shared: Arc<Shared>,
}

/// One log line on its way: buffered, or written at once (warnings and errors).
pub(crate) struct LineWriter<'a> {
    shared: &'a Shared,
    at_once: bool,
}

impl Write for LineWriter<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let (first, waiting) = {
            let mut pending = self.shared.pending();
            let first = pending.lines.is_empty();
            pending.lines.extend_from_slice(bytes);
            if pending.stopping {
                (first, BLOCK_AT_BYTES)
            } else {
                (first, pending.lines.len())
            }
        };
        if self.at_once || waiting >= BLOCK_AT_BYTES {
            self.shared.flush();
        } else if first || waiting >= FLUSH_AT_BYTES {
            // the first line wakes the idle flusher; a full buffer cuts its wait short
            self.shared.wake.notify_one();
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for BufferedWriter {
    type Writer = LineWriter<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        LineWriter {
            shared: &self.shared,
            at_once: false,
        }
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> Self::Writer {
        LineWriter {
            shared: &self.shared,
            at_once: *meta.level() <= Level::WARN,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Sink {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    #[test]
    fn info_waits_for_the_flusher_warnings_go_at_once_in_order() {
        let sink = Sink::default();
        let (writer, guard) = buffered(Box::new(sink.clone()));
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .without_time()
            .with_writer(writer)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!("first");
            tracing::info!("second");
            // the flusher may have run in between; what is written is always whole lines in order
            tracing::warn!("third");
        });
        let text = sink.text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines.len(),
            3,
            "a warning writes what waits before it: {text}"
        );
        assert!(
            lines[0].ends_with("first") && lines[2].ends_with("third"),
            "{text}"
        );

        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .without_time()
            .with_writer(BufferedWriter {
                shared: guard.shared.clone(),
            })
            .finish();
        tracing::subscriber::with_default(subscriber, || tracing::info!("fourth"));
        drop(guard);
        assert!(
            sink.text().ends_with("fourth\n"),
            "dropping the guard flushes"
        );
    }

    #[test]
    fn sni_warnings_and_kube_client_errors_stay_at_debug() {
        let quiet = ",rustls::msgs::handshake=error,kube_client::client::builder=off";
        assert_eq!(with_quiet_libraries("info"), format!("info{quiet}"));
        assert_eq!(
            with_quiet_libraries("warn,ip_webhook=info"),
            format!("warn,ip_webhook=info{quiet}")
        );
        assert_eq!(with_quiet_libraries("off"), "off");
        for shown in ["debug", "info,ip_webhook=DEBUG", "trace"] {
            assert_eq!(with_quiet_libraries(shown), shown);
        }
        // naming a library shows its lines at the level named; the other stays quiet
        assert_eq!(
            with_quiet_libraries("info,rustls=warn"),
            "info,rustls=warn,kube_client::client::builder=off"
        );
        assert_eq!(
            with_quiet_libraries("info,kube_client=error"),
            "info,kube_client=error,rustls::msgs::handshake=error"
        );
        for filter in [
            with_quiet_libraries("info"),
            with_quiet_libraries("info,kube_client=error"),
        ] {
            tracing_subscriber::EnvFilter::try_new(&filter).expect(&filter);
        }
    }

    #[test]
    fn text_lines_name_every_field() {
        let sink = Sink::default();
        let (writer, guard) = buffered(Box::new(sink.clone()));
        let subscriber = tracing_subscriber::fmt()
            .with_writer(writer)
            .event_format(Text)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(
                uid = "u-1",
                latency_us = 41u64,
                dry_run = false,
                reason = "pod \"a\"\nb",
                delta = -3i64,
                "admission decision"
            );
            tracing::error!(error = %"disk full", "ledger commit failed for {}", "10.0.0.1");
        });
        drop(guard);
        let text = sink.text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        let (time, rest) = lines[0].split_once(' ').unwrap();
        assert!(
            time.parse::<jiff::Timestamp>().is_ok() && time.ends_with('Z') && time.len() == 27,
            "an RFC 3339 UTC time with microseconds: {time}"
        );
        assert_eq!(
            rest,
            r#" INFO ip_webhook::server::logging::tests: admission decision uid="u-1" latency_us=41 dry_run=false reason="pod \"a\"\nb" delta=-3"#
        );
        assert!(
            lines[1].ends_with("ERROR ip_webhook::server::logging::tests: ledger commit failed for 10.0.0.1 error=disk full"),
            "{}",
            lines[1]
        );
    }

    /// A sink whose writes wait until the test lets them go.
    struct StuckSink {
        entered: std::sync::mpsc::Sender<()>,
        release: Arc<(Mutex<bool>, Condvar)>,
        written: Sink,
    }

    impl Write for StuckSink {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            let _ = self.entered.send(());
            let (released, wake) = &*self.release;
            let mut released = released.lock().unwrap();
            while !*released {
                released = wake.wait(released).unwrap();
            }
            self.written.write(bytes)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_stuck_sink_does_not_hold_up_the_lines_behind_it() {
        let (entered, inside) = std::sync::mpsc::channel();
        let release = Arc::new((Mutex::new(false), Condvar::new()));
        let written = Sink::default();
        let (writer, guard) = buffered(Box::new(StuckSink {
            entered,
            release: release.clone(),
            written: written.clone(),
        }));
        writer.make_writer().write_all(b"first\n").unwrap();
        inside
            .recv_timeout(Duration::from_secs(5))
            .expect("the flusher writes within its period");
        // the flusher is stuck in the sink: lines still go into the buffer at once
        for _ in 0..1000 {
            writer.make_writer().write_all(b"queued\n").unwrap();
        }
        assert!(written.text().is_empty());
        *release.0.lock().unwrap() = true;
        release.1.notify_all();
        drop(guard);
        let text = written.text();
        assert!(text.starts_with("first\nqueued\n"), "{}", &text[..20]);
        assert_eq!(text.lines().count(), 1001);
    }

    #[test]
    fn the_flusher_writes_within_its_period() {
        let sink = Sink::default();
        let (writer, _guard) = buffered(Box::new(sink.clone()));
        let mut line = writer.make_writer();
        line.write_all(b"waiting\n").unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while sink.text().is_empty() {
            assert!(std::time::Instant::now() < deadline, "never flushed");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(sink.text(), "waiting\n");
        // idle since: the flusher sleeps without a timeout, and the next line wakes it
        std::thread::sleep(FLUSH_EVERY * 4);
        line.write_all(b"later\n").unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while sink.text() == "waiting\n" {
            assert!(
                std::time::Instant::now() < deadline,
                "the idle flusher never woke"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(sink.text(), "waiting\nlater\n");
    }
}
