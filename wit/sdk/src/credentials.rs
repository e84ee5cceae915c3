//! Credentials for a plugin's sessions: the value of a key of a Secret the admin granted
//! (`pack --grant-secret`), read through [`AppCall::credential`](crate::AppCall::credential).
//!
//! The host knows no protocol, so the plugin sees the value (a MySQL scramble or a SCRAM
//! proof is computed from it). It may use it in a session and nowhere else: the host refuses
//! a decision whose status, applied objects or Events carry a value it was handed
//! (`PluginLeaksCredential`), and cuts values out of the plugin's log lines. Give the same
//! value to your Pods with a `secretKeyRef` ([`crate::children::Container::env_from_secret`]),
//! which the host never reads. A grant with generated keys (`{parent}-credentials:password`)
//! makes the host create the Secret with random values the first time the plugin reads it, so
//! the plugin never draws random bytes and stays a function of what it observed.

/// A credential's value. Its `Debug` never prints the value, so it cannot slip into a log
/// line or a test failure by accident.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential(Vec<u8>);

impl Credential {
    /// Wraps a value (the host's answer, or a test's).
    pub fn new(value: impl Into<Vec<u8>>) -> Self {
        Self(value.into())
    }

    /// The value's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The value as text, if it is UTF-8.
    pub fn as_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.0).ok()
    }
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Credential(<{} bytes>)", self.0.len())
    }
}

/// Why no credential was handed out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CredentialError {
    /// Not granted, or not a Secret name and key of the parent's namespace.
    Refused(String),
    /// The Secret or its key does not exist (and the host may not create it here).
    Missing(String),
    /// The API server did not answer; a later decision may try again.
    Unavailable(String),
}

impl std::fmt::Display for CredentialError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CredentialError::Refused(why) => write!(f, "credential refused: {why}"),
            CredentialError::Missing(why) => write!(f, "credential missing: {why}"),
            CredentialError::Unavailable(why) => write!(f, "credential unavailable: {why}"),
        }
    }
}

impl std::error::Error for CredentialError {}
