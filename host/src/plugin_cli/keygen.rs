//! `policy-host keygen`: a new ed25519 key pair for signing plugin packs, written as the PEM
//! files `openssl genpkey -algorithm ed25519` and `openssl pkey -pubout` would write.

use std::io::Write;
use std::path::{Path, PathBuf};

use base64::Engine;

use super::CliError;
use crate::load::trust::{SigningKey, key_id};

/// PEM armour: `label` around the base64 of `der`, 64 characters a line.
pub fn pem(label: &str, der: &[u8]) -> String {
    let body = base64::engine::general_purpose::STANDARD.encode(der);
    let mut text = format!("-----BEGIN {label}-----\n");
    for line in body.as_bytes().chunks(64) {
        text.push_str(&String::from_utf8_lossy(line));
        text.push('\n');
    }
    text.push_str(&format!("-----END {label}-----\n"));
    text
}

/// What `keygen` wrote.
#[derive(Debug)]
pub struct KeyFiles {
    /// `<prefix>.pem`: the private key (mode 0600). Keep it out of the cluster.
    pub private: PathBuf,
    /// `<prefix>.pub`: the public key, for the host's `--trusted-key`.
    pub public: PathBuf,
    /// The key's id, as `data.signedBy` and the host's messages name it.
    pub id: String,
}

/// Writes a new key pair to `<prefix>.pem` and `<prefix>.pub`; refuses to overwrite either.
pub fn keygen(prefix: &Path) -> Result<KeyFiles, CliError> {
    let private = prefix.with_extension("pem");
    let public = prefix.with_extension("pub");
    let (pkcs8, spki) = SigningKey::generate()?;
    let id = key_id(spki.get(12..).unwrap_or_default());
    write_new(&private, &pem("PRIVATE KEY", &pkcs8), 0o600)?;
    write_new(&public, &pem("PUBLIC KEY", &spki), 0o644)?;
    Ok(KeyFiles {
        private,
        public,
        id,
    })
}

fn write_new(path: &Path, text: &str, mode: u32) -> Result<(), CliError> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|e| {
            CliError::Write(format!(
                "{}: {e} (keygen never overwrites a key; pick another prefix)",
                path.display()
            ))
        })?;
    file.write_all(text.as_bytes())
        .map_err(|e| CliError::Write(format!("{}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::trust::{TrustPolicy, TrustedKey};

    #[test]
    fn keygen_writes_a_pair_the_host_reads_and_never_overwrites() {
        let dir = std::env::temp_dir().join(format!("policy-host-keygen-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let files = keygen(&dir.join("signing")).expect("keygen");
        let signer = SigningKey::from_pem_file(&files.private).expect("private key reads back");
        let trusted = TrustedKey::from_pem_file(&files.public).expect("public key reads back");
        assert_eq!(signer.id(), files.id);
        assert_eq!(trusted.id, files.id);
        assert!(TrustPolicy::new(vec![trusted]).is_enforced());
        let mode = std::fs::metadata(&files.private).map(|m| {
            use std::os::unix::fs::PermissionsExt;
            m.permissions().mode() & 0o777
        });
        assert_eq!(mode.ok(), Some(0o600));
        let again = keygen(&dir.join("signing")).expect_err("overwrite");
        assert!(again.to_string().contains("never overwrites"), "{again}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
