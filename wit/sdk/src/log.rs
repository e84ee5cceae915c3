//! Lines in the host's log, tagged by the host with the plugin and the parent. Natively
//! (in tests) they go to stderr, where the test runner captures them. [`Action::summary`]
//! names what a decision does in a few words, for a log line or a test's expectations.

use crate::contract::Action;

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

impl Action {
    /// What the action does, in a few words: `apply Pod/demo-0`,
    /// `delete PersistentVolumeClaim/data-demo-1`, `status`, `event Normal/MemberAdded`.
    pub fn summary(&self) -> String {
        match self {
            Action::Apply(object) => format!(
                "apply {}/{}",
                object["kind"].as_str().unwrap_or("?"),
                object["metadata"]["name"].as_str().unwrap_or("?")
            ),
            Action::Delete { kind, name } => format!("delete {}/{name}", kind.kind),
            Action::SetStatus(_) => "status".to_owned(),
            Action::RecordEvent(event) => format!("event {:?}/{}", event.event_type, event.reason),
        }
    }
}

/// The [`summary`](Action::summary) of every action, comma-separated, for one log line.
pub fn summarize(actions: &[Action]) -> String {
    actions
        .iter()
        .map(Action::summary)
        .collect::<Vec<_>>()
        .join(", ")
}
