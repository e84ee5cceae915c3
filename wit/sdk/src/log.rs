//! Lines in the host's log, tagged by the host with the plugin and the parent. Natively
//! (in tests) they go to stderr, where the test runner captures them.

/// Log level.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// Very detailed tracing.
    Trace,
    /// Detail for debugging a plugin.
    Debug,
    /// Something an operator wants to see.
    Info,
    /// Something unexpected, handled.
    Warn,
    /// Something failed.
    Error,
}

/// Writes one log line with key/value fields.
pub fn log(level: Level, message: &str, fields: &[(&str, &str)]) {
    #[cfg(target_arch = "wasm32")]
    crate::wasm::log(level, message, fields);
    #[cfg(not(target_arch = "wasm32"))]
    eprintln!("{level:?} {message} {fields:?}");
}

/// Writes a debug line.
pub fn debug(message: &str, fields: &[(&str, &str)]) {
    log(Level::Debug, message, fields);
}

/// Writes an info line.
pub fn info(message: &str, fields: &[(&str, &str)]) {
    log(Level::Info, message, fields);
}

/// Writes a warning line.
pub fn warn(message: &str, fields: &[(&str, &str)]) {
    log(Level::Warn, message, fields);
}
