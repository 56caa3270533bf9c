//! The operator commands' logic, independent of the command line: `status`, `explain`,
//! `release`, `check` (the doctor) and `check --drift`.

pub(crate) mod control;
pub(crate) mod doctor;
pub(crate) mod drift;
pub(crate) mod explain;
pub(crate) mod release;
pub(crate) mod status;

static INVOCATION: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();

/// How the user runs the operator commands, for messages: `kubectl ipw` or `ip-webhook`.
pub(crate) fn invocation() -> &'static str {
    INVOCATION.get().copied().unwrap_or("ip-webhook")
}

/// Record how the process was invoked (once; the command line knows: `kubectl ipw`).
pub(crate) fn set_invocation(name: &'static str) {
    let _ = INVOCATION.set(name);
}
