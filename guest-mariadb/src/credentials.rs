//! The passwords the plugin logs in and replicates with, read through the SDK's credential
//! call (ARCHITECTURE.md, "Credentials"): the admin grants the Secret
//! (`pack --grant-secret '{parent}-credentials:root-password,replication-password'`), the host
//! creates it with random values on the first read when it is absent, and refuses any decision
//! that would carry a value outside a session. The Pods get the same values through
//! `secretKeyRef`, which the host never reads.

use policy_host_sdk::AppCall;
use policy_host_sdk::credentials::{Credential, CredentialError};

/// The Secret keys the plugin reads.
pub const ROOT_PASSWORD_KEY: &str = "root-password";
/// See [`ROOT_PASSWORD_KEY`].
pub const REPLICATION_PASSWORD_KEY: &str = "replication-password";

/// The passwords of one cluster. `Credential`'s `Debug` prints no value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credentials {
    /// The root account's: the plugin's sessions log in with it.
    pub root_password: Credential,
    /// The `repl` account's: `CHANGE MASTER TO … MASTER_PASSWORD` names it.
    pub replication_password: Credential,
}

/// Why the passwords cannot be had, saying what to do.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CredentialsError {
    /// The host refused: the bundle's grant does not name this Secret.
    #[error(
        "the plugin may not read the Secret `{secret}` ({why}); use the Secret `<name>-credentials` the bundle grants, or have the admin pack the plugin with `--grant-secret {secret}`"
    )]
    NotGranted {
        /// The Secret.
        secret: String,
        /// The host's words.
        why: String,
    },
    /// The Secret or one of its keys is missing (and the host may not create it).
    #[error("the Secret `{secret}` has no key `{key}` ({why}); add it")]
    Missing {
        /// The Secret.
        secret: String,
        /// The key.
        key: String,
        /// The host's words.
        why: String,
    },
    /// The API server did not answer; a later decision tries again.
    #[error("the Secret `{secret}` could not be read now ({why}); retrying")]
    Unavailable {
        /// The Secret.
        secret: String,
        /// The host's words.
        why: String,
    },
    /// A value is not text, and SQL needs text (`MASTER_PASSWORD`).
    #[error("the Secret `{secret}` key `{key}` is not UTF-8 text; store a text password")]
    NotText {
        /// The Secret.
        secret: String,
        /// The key.
        key: String,
    },
}

/// The passwords in `secret`, from the host.
pub fn read(app: &mut dyn AppCall, secret: &str) -> Result<Credentials, CredentialsError> {
    let mut get = |key: &str| {
        let value = app.credential(secret, key).map_err(|e| {
            let secret = secret.to_owned();
            match e {
                CredentialError::Refused(why) => CredentialsError::NotGranted { secret, why },
                CredentialError::Missing(why) => CredentialsError::Missing {
                    secret,
                    key: key.to_owned(),
                    why,
                },
                CredentialError::Unavailable(why) => CredentialsError::Unavailable { secret, why },
            }
        })?;
        if value.as_str().is_none() {
            return Err(CredentialsError::NotText {
                secret: secret.to_owned(),
                key: key.to_owned(),
            });
        }
        Ok(value)
    };
    Ok(Credentials {
        root_password: get(ROOT_PASSWORD_KEY)?,
        replication_password: get(REPLICATION_PASSWORD_KEY)?,
    })
}

#[cfg(test)]
mod tests {
    use policy_host_sdk::testing::ScriptedAppCall;

    use super::*;

    #[test]
    fn both_passwords_are_read_and_a_refusal_says_which_grant_is_missing() {
        let mut app = ScriptedAppCall::new()
            .with_credential("db-credentials", ROOT_PASSWORD_KEY, "r00t")
            .with_credential("db-credentials", REPLICATION_PASSWORD_KEY, "repl");
        let credentials = read(&mut app, "db-credentials").expect("granted");
        assert_eq!(credentials.root_password.as_str(), Some("r00t"));
        assert!(
            !format!("{credentials:?}").contains("r00t"),
            "Debug prints no value"
        );
        let refused = read(&mut app, "other").expect_err("not scripted: refused");
        assert!(
            refused.to_string().contains("--grant-secret other"),
            "{refused}"
        );
    }
}
