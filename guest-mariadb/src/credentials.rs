//! Where the plugin gets the passwords it logs in and replicates with: the one seam to switch
//! to the SDK's credential call when the host's credential path lands (ARCHITECTURE.md,
//! "Design note: credentials for an app": a `credential(secret, key)` import granted per
//! Secret).
//!
//! Until then a component has no way to read the user's Secret, so in wasm [`read`] says the
//! credentials are unavailable: the plugin still creates every child (the Pods get the
//! passwords themselves, through `secretKeyRef`), and reports `Available=False`,
//! `CredentialsUnavailable` instead of probing the servers. Native tests provide the values
//! with [`provide`], as the host will from the Secret.

use std::cell::RefCell;
use std::collections::BTreeMap;

/// The Secret keys the plugin reads.
pub const ROOT_PASSWORD_KEY: &str = "root-password";
/// See [`ROOT_PASSWORD_KEY`].
pub const REPLICATION_PASSWORD_KEY: &str = "replication-password";

/// The passwords of one cluster.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The root account's: the plugin's sessions log in with it.
    pub root_password: String,
    /// The `repl` account's: `CHANGE MASTER TO … MASTER_PASSWORD` names it.
    pub replication_password: String,
}

/// Never print a password, even in a test's failure message.
impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Credentials { .. }")
    }
}

/// Why the passwords cannot be had.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CredentialsError {
    /// The host gives plugins no credentials yet.
    #[error(
        "the host cannot hand the plugin the Secret `{secret}` yet (no credential path); the servers run, but the plugin cannot manage replication"
    )]
    Unavailable {
        /// The Secret named in the spec.
        secret: String,
    },
    /// The Secret lacks a key.
    #[error("the Secret `{secret}` has no key `{key}`; add it")]
    MissingKey {
        /// The Secret.
        secret: String,
        /// The key.
        key: String,
    },
}

thread_local! {
    static PROVIDED: RefCell<BTreeMap<(String, String), String>> =
        const { RefCell::new(BTreeMap::new()) };
}

/// Makes `key` of `secret` readable by [`read`] on this thread (tests, standing in for the
/// host).
pub fn provide(secret: &str, key: &str, value: &str) {
    PROVIDED.with(|p| {
        p.borrow_mut()
            .insert((secret.to_owned(), key.to_owned()), value.to_owned())
    });
}

/// The passwords in `secret`. The seam: this becomes the SDK's credential call.
pub fn read(secret: &str) -> Result<Credentials, CredentialsError> {
    let value = |key: &str| {
        PROVIDED.with(|p| {
            p.borrow()
                .get(&(secret.to_owned(), key.to_owned()))
                .cloned()
        })
    };
    let any = PROVIDED.with(|p| p.borrow().keys().any(|(s, _)| s == secret));
    if !any {
        return Err(CredentialsError::Unavailable {
            secret: secret.to_owned(),
        });
    }
    let get = |key: &str| {
        value(key).ok_or_else(|| CredentialsError::MissingKey {
            secret: secret.to_owned(),
            key: key.to_owned(),
        })
    };
    Ok(Credentials {
        root_password: get(ROOT_PASSWORD_KEY)?,
        replication_password: get(REPLICATION_PASSWORD_KEY)?,
    })
}
