//! Trust: which plugin ConfigMaps may load code — the admin's ed25519 public keys, and the
//! check of a pack's signature against them.
//!
//! Without a trust policy anybody who can write a ConfigMap in the plugin namespace runs code
//! through the host's ServiceAccount. With one (`--trusted-key` files, or PEM text in
//! `--trusted-keys-pem` / `POLICY_HOST_TRUSTED_KEYS`), a pack loads only when it carries a
//! signature, by one of those keys, over:
//!
//! ```text
//! policy-host plugin signature v2
//! name:<metadata.name of the ConfigMap>
//! sha256:<hex sha256 of the uncompressed component>
//! grants:<data.grants exactly as written, empty when absent>
//! limits:<data.limits exactly as written, empty when absent>
//! mode:<data.mode exactly as written, empty when absent>
//! serial:<data.serial>
//! rollout:<data.rollout exactly as written>      (only when data.rollout is present)
//! ```
//!
//! A pack that names its component in a registry (`data.reference`, [`crate::load::oci`]) is
//! signed over one more line, right after `sha256:` (which then holds the pin `data.sha256`,
//! empty when absent):
//!
//! ```text
//! reference:<data.reference exactly as written>
//! ```
//!
//! The reference ends in the manifest's digest, which pins the layer digest, which the host
//! checks the pulled bytes against: signing the reference signs the code. Its signature is
//! checked before anything is pulled, so an unsigned reference never makes the host reach a
//! registry. Byte packs have no such line, so neither kind's signature verifies for the other.
//! The pull Secret and the registry CA are not signed: they decide only how the bytes arrive,
//! and bytes that do not match the signed digest are refused.
//!
//! The signature covers everything a ConfigMap writer could otherwise turn against the key
//! holder's approval (review L1): the code, the grants (what the plugin may reach), the mode (a
//! shadow flipped to `active` starts writing), a rollout's settings (a canary widened to every
//! parent, or its rollback threshold raised out of reach), the limits (memory, deadline and concurrency
//! raised to the host's ceiling), and the name (a pack signed for one ConfigMap cannot stand in
//! for another). The serial stops replays: the host remembers, per ConfigMap name, the highest
//! serial it verified and refuses an older one (an earlier signed pack with a known bug). That
//! memory lives in the host's process: a replay written while no host runs is refused only
//! when it is older than what the host lists first on start.
//!
//! The `rollout:` line is there only when the pack has `data.rollout`, so every pack signed
//! before rollouts existed verifies as it did; a serial is a whole number, so no pack without
//! the line can be read as one with it (and the other way round).
//!
//! Packs signed by the previous scheme (`v1`: component and grants only, no serial) are refused
//! with `PluginSignatureOutdated`, whatever they carry: accepting them would keep the hole open.
//!
//! Why plain ed25519 and not sigstore/cosign: keyless signing needs Fulcio and Rekor on the
//! network, and cosign's keyed signatures sign OCI manifests, which a ConfigMap pack is not;
//! the `sigstore` crate would bring both stacks for one verification. ed25519 comes from `ring`,
//! which the host already links for TLS, and its keys are the PEM files `openssl genpkey
//! -algorithm ed25519` writes (or `policy-host keygen`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair, UnparsedPublicKey};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{PrivatePkcs8KeyDer, SubjectPublicKeyInfoDer};
use sha2::{Digest, Sha256};

use super::pack::{GRANTS_KEY, LIMITS_KEY, MODE_KEY, REFERENCE_KEY, ROLLOUT_KEY, sha256_hex};

/// `data` key of the signature: 128 hex digits.
pub const SIGNATURE_KEY: &str = "signature";
/// `data` key naming the key that signed: its [`key_id`].
pub const SIGNED_BY_KEY: &str = "signedBy";
/// `data` key of the pack's serial: a signed number that only grows (replay protection).
pub const SERIAL_KEY: &str = "serial";

/// The DER prefix of an ed25519 SubjectPublicKeyInfo (RFC 8410): the 32-byte key follows.
const ED25519_SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];

/// Why a key file could not be used, or a pack is not trusted. Each says what to do.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    /// A trusted-key file could not be read or is not an ed25519 public key.
    #[error(
        "trusted key {path}: {problem}; give a PEM `PUBLIC KEY` of an ed25519 key (`openssl pkey -in key.pem -pubout` or `policy-host keygen`)"
    )]
    BadPublicKey {
        /// The file.
        path: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A signing key file could not be read or is not an ed25519 private key.
    #[error(
        "signing key {path}: {problem}; give a PEM `PRIVATE KEY` (PKCS#8) of an ed25519 key (`openssl genpkey -algorithm ed25519` or `policy-host keygen`)"
    )]
    BadPrivateKey {
        /// The file.
        path: String,
        /// What is wrong with it.
        problem: String,
    },
    /// The pack carries no signature.
    #[error(
        "ConfigMap {config_map} is not signed, and this host loads only plugins signed by {expected}; sign it with `policy-host pack --sign <key.pem>` using one of those keys"
    )]
    Unsigned {
        /// namespace/name.
        config_map: String,
        /// The trusted key ids.
        expected: String,
    },
    /// The pack is signed by a key the host does not trust.
    #[error(
        "ConfigMap {config_map} is signed by key {signed_by}, which this host does not trust (it trusts {expected}); sign it with one of those, or add the key with --trusted-key"
    )]
    UnknownKey {
        /// namespace/name.
        config_map: String,
        /// The key id the pack names.
        signed_by: String,
        /// The trusted key ids.
        expected: String,
    },
    /// The signature does not verify: the name, component, grants, limits, mode or serial
    /// changed since signing.
    #[error(
        "ConfigMap {config_map}: the signature by key {signed_by} does not match its name, component, grants, limits, mode, rollout and serial ({problem}); they were changed after signing: repack and sign again with `policy-host pack --sign`"
    )]
    BadSignature {
        /// namespace/name.
        config_map: String,
        /// The key id the pack names.
        signed_by: String,
        /// What failed.
        problem: String,
    },
    /// The pack carries a signature of the previous scheme, which binds neither mode, limits,
    /// name nor a serial.
    #[error(
        "ConfigMap {config_map} is signed by the previous scheme (v1: no data.serial), which does not cover its name, mode, limits or a serial, so this host does not load it; sign it again with this version's `policy-host pack --sign`"
    )]
    OutdatedSignature {
        /// namespace/name.
        config_map: String,
    },
    /// A validly signed pack older than one this host already verified under the same name.
    #[error(
        "ConfigMap {config_map} carries a pack signed with serial {serial}, older than serial {loaded} this host already verified under that name: an earlier pack was put back (a rollback or a replay); to roll back on purpose, sign that pack again with a higher `--serial`"
    )]
    Replayed {
        /// namespace/name.
        config_map: String,
        /// The pack's serial.
        serial: u64,
        /// The highest serial verified under that name.
        loaded: u64,
    },
}

impl TrustError {
    /// A short CamelCase reason for Events and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            TrustError::BadPublicKey { .. } | TrustError::BadPrivateKey { .. } => "TrustKeyInvalid",
            TrustError::Unsigned { .. } => "PluginUnsigned",
            TrustError::UnknownKey { .. } => "PluginUntrusted",
            TrustError::BadSignature { .. } => "PluginSignatureInvalid",
            TrustError::OutdatedSignature { .. } => "PluginSignatureOutdated",
            TrustError::Replayed { .. } => "PluginSignatureReplayed",
        }
    }
}

/// A short, stable name of a public key: the first 16 hex digits of the sha256 of its 32 raw
/// bytes. Shown in Events and written by `pack --sign` as `data.signedBy`.
pub fn key_id(public_key: &[u8]) -> String {
    let digest = Sha256::digest(public_key);
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// The bytes the signature of pack `cm`, whose component hashes to `component_sha256` (for a
/// pack by reference: its pin, empty when absent), covers (see the module docs).
pub fn signed_message(cm: &ConfigMap, component_sha256: &str) -> Vec<u8> {
    let name = cm.metadata.name.as_deref().unwrap_or_default();
    let reference = cm
        .data
        .as_ref()
        .and_then(|d| d.get(REFERENCE_KEY))
        .map(|r| format!("\nreference:{r}"))
        .unwrap_or_default();
    let mut message = format!(
        "policy-host plugin signature v2\nname:{name}\nsha256:{component_sha256}{reference}\ngrants:{}\nlimits:{}\nmode:{}\nserial:{}",
        data_text(cm, GRANTS_KEY),
        data_text(cm, LIMITS_KEY),
        data_text(cm, MODE_KEY),
        data_text(cm, SERIAL_KEY),
    );
    if let Some(rollout) = cm.data.as_ref().and_then(|d| d.get(ROLLOUT_KEY)) {
        message.push_str("\nrollout:");
        message.push_str(rollout);
    }
    message.into_bytes()
}

/// `data[key]` exactly as written, empty when absent.
fn data_text<'a>(cm: &'a ConfigMap, key: &str) -> &'a str {
    cm.data
        .as_ref()
        .and_then(|d| d.get(key))
        .map_or("", String::as_str)
}

/// One trusted ed25519 public key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrustedKey {
    /// [`key_id`] of `raw`.
    pub id: String,
    /// The 32 raw bytes.
    raw: Vec<u8>,
}

impl TrustedKey {
    /// Reads a PEM `PUBLIC KEY` file holding an ed25519 key.
    pub fn from_pem_file(path: &Path) -> Result<TrustedKey, TrustError> {
        let bad = |problem: String| TrustError::BadPublicKey {
            path: path.display().to_string(),
            problem,
        };
        let text = std::fs::read(path).map_err(|e| bad(format!("cannot read it ({e})")))?;
        let spki = SubjectPublicKeyInfoDer::from_pem_slice(&text)
            .map_err(|e| bad(format!("no PEM PUBLIC KEY in it ({e})")))?;
        Self::from_spki(&spki).map_err(bad)
    }

    /// Reads every PEM `PUBLIC KEY` block of `text`, each an ed25519 key (`--trusted-keys-pem`,
    /// `POLICY_HOST_TRUSTED_KEYS`); `source` names where the text came from. Text without a key
    /// is refused: a trust policy that was meant but came out empty would let every pack load.
    pub fn all_from_pem_text(source: &str, text: &str) -> Result<Vec<TrustedKey>, TrustError> {
        let bad = |problem: String| TrustError::BadPublicKey {
            path: source.to_owned(),
            problem,
        };
        let keys = SubjectPublicKeyInfoDer::pem_slice_iter(text.as_bytes())
            .enumerate()
            .map(|(n, spki)| {
                let spki =
                    spki.map_err(|e| bad(format!("PEM block {} is unreadable ({e})", n + 1)))?;
                Self::from_spki(&spki).map_err(|problem| bad(format!("key {}: {problem}", n + 1)))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if keys.is_empty() {
            return Err(bad("it holds no PEM PUBLIC KEY".to_owned()));
        }
        Ok(keys)
    }

    fn from_spki(spki: &SubjectPublicKeyInfoDer<'_>) -> Result<TrustedKey, String> {
        let raw = spki
            .as_ref()
            .strip_prefix(ED25519_SPKI_PREFIX.as_slice())
            .filter(|raw| raw.len() == 32)
            .ok_or_else(|| "it is not an ed25519 key".to_owned())?;
        Ok(TrustedKey {
            id: key_id(raw),
            raw: raw.to_vec(),
        })
    }
}

/// The keys a pack must be signed by; empty: no trust policy, every pack loads.
#[derive(Clone, Debug, Default)]
pub struct TrustPolicy {
    keys: Vec<TrustedKey>,
    /// ConfigMap name → the highest serial verified under it. Shared by clones; one entry per
    /// name a trusted key signed, so it grows only with what the admin signs.
    serials: Arc<Mutex<HashMap<String, u64>>>,
}

impl TrustPolicy {
    /// A policy trusting exactly these keys.
    pub fn new(keys: Vec<TrustedKey>) -> TrustPolicy {
        TrustPolicy {
            keys,
            serials: Arc::default(),
        }
    }

    /// Reads each file as a trusted public key (`--trusted-key`).
    pub fn from_files(paths: &[PathBuf]) -> Result<TrustPolicy, TrustError> {
        let keys = paths
            .iter()
            .map(|p| TrustedKey::from_pem_file(p))
            .collect::<Result<_, _>>()?;
        Ok(TrustPolicy::new(keys))
    }

    /// The same policy, trusting `keys` too.
    pub fn with_keys(mut self, keys: impl IntoIterator<Item = TrustedKey>) -> TrustPolicy {
        self.keys.extend(keys);
        self
    }

    /// Whether packs must be signed.
    pub fn is_enforced(&self) -> bool {
        !self.keys.is_empty()
    }

    /// The trusted key ids, for messages.
    pub fn describe(&self) -> String {
        self.keys
            .iter()
            .map(|k| k.id.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Checks the signature of pack `cm` whose component hashes to `component_sha256`. Always
    /// passes without a policy.
    pub fn verify(&self, cm: &ConfigMap, component_sha256: &str) -> Result<(), TrustError> {
        if !self.is_enforced() {
            return Ok(());
        }
        let config_map = format!("{}/{}", cm.namespace().unwrap_or_default(), cm.name_any());
        let data = cm.data.clone().unwrap_or_default();
        let signature = data.get(SIGNATURE_KEY).map(|s| s.trim()).unwrap_or("");
        let signed_by = data.get(SIGNED_BY_KEY).map(|s| s.trim()).unwrap_or("");
        if signature.is_empty() {
            return Err(TrustError::Unsigned {
                config_map,
                expected: self.describe(),
            });
        }
        let Some(key) = self.keys.iter().find(|k| k.id == signed_by) else {
            return Err(TrustError::UnknownKey {
                config_map,
                signed_by: signed_by.to_owned(),
                expected: self.describe(),
            });
        };
        let bad = |problem: &str| TrustError::BadSignature {
            config_map: config_map.clone(),
            signed_by: signed_by.to_owned(),
            problem: problem.to_owned(),
        };
        if !data.contains_key(SERIAL_KEY) {
            return Err(TrustError::OutdatedSignature { config_map });
        }
        let signature =
            from_hex(signature).ok_or_else(|| bad("data.signature is not 128 hex digits"))?;
        UnparsedPublicKey::new(&ED25519, &key.raw)
            .verify(&signed_message(cm, component_sha256), &signature)
            .map_err(|_| bad("ed25519 verification failed"))?;
        let serial = data_text(cm, SERIAL_KEY)
            .trim()
            .parse::<u64>()
            .map_err(|_| bad("data.serial is not a whole number"))?;
        // Only a verified serial moves the floor: a forged one never reaches here.
        let mut serials = self
            .serials
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let loaded = serials.entry(cm.name_any()).or_insert(serial);
        if serial < *loaded {
            return Err(TrustError::Replayed {
                config_map,
                serial,
                loaded: *loaded,
            });
        }
        *loaded = serial;
        Ok(())
    }
}

/// An ed25519 private key that signs packs (`policy-host pack --sign`).
pub struct SigningKey {
    pair: Ed25519KeyPair,
}

impl SigningKey {
    /// Reads a PEM `PRIVATE KEY` (PKCS#8) file holding an ed25519 key, as `openssl genpkey
    /// -algorithm ed25519` or `policy-host keygen` write it.
    pub fn from_pem_file(path: &Path) -> Result<SigningKey, TrustError> {
        let bad = |problem: String| TrustError::BadPrivateKey {
            path: path.display().to_string(),
            problem,
        };
        let text = std::fs::read(path).map_err(|e| bad(format!("cannot read it ({e})")))?;
        let der = PrivatePkcs8KeyDer::from_pem_slice(&text)
            .map_err(|e| bad(format!("no PEM PRIVATE KEY in it ({e})")))?;
        // openssl writes PKCS#8 v1 (no public key inside), which the checked form refuses.
        let pair = Ed25519KeyPair::from_pkcs8_maybe_unchecked(der.secret_pkcs8_der())
            .map_err(|e| bad(format!("it is not an ed25519 key ({e})")))?;
        Ok(SigningKey { pair })
    }

    /// A new random key, as PKCS#8 DER (private) and SPKI DER (public).
    pub fn generate() -> Result<(Vec<u8>, Vec<u8>), TrustError> {
        let random = ring::rand::SystemRandom::new();
        let pkcs8 =
            Ed25519KeyPair::generate_pkcs8(&random).map_err(|e| TrustError::BadPrivateKey {
                path: "(new key)".into(),
                problem: format!("the system's random source failed ({e})"),
            })?;
        let pair =
            Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).map_err(|e| TrustError::BadPrivateKey {
                path: "(new key)".into(),
                problem: format!("ring refused its own key ({e})"),
            })?;
        let mut spki = ED25519_SPKI_PREFIX.to_vec();
        spki.extend_from_slice(pair.public_key().as_ref());
        Ok((pkcs8.as_ref().to_vec(), spki))
    }

    /// [`key_id`] of this key's public half.
    pub fn id(&self) -> String {
        key_id(self.pair.public_key().as_ref())
    }

    /// Writes `data.signature` and `data.signedBy` into pack `cm`, over its name, its
    /// component's sha256 (`data.sha256`, which `pack` always writes), grants, limits, mode and
    /// serial. A pack without `data.serial` gets the current Unix time in seconds, so packs
    /// signed later carry higher serials.
    pub fn sign(&self, cm: &mut ConfigMap, component_sha256: &str) {
        let data = cm.data.get_or_insert_with(Default::default);
        data.entry(SERIAL_KEY.to_owned()).or_insert_with(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
                .to_string()
        });
        let signature = self.pair.sign(&signed_message(cm, component_sha256));
        let data = cm.data.get_or_insert_with(Default::default);
        data.insert(SIGNATURE_KEY.to_owned(), to_hex(signature.as_ref()));
        data.insert(SIGNED_BY_KEY.to_owned(), self.id());
    }
}

/// `sha256_hex` re-exported for callers that sign a component they hold.
pub fn component_sha256(component: &[u8]) -> String {
    sha256_hex(component)
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn from_hex(text: &str) -> Option<Vec<u8>> {
    if text.len() != 128 || !text.is_ascii() {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// A fresh key pair written as the PEM files an admin would have.
    struct Keys {
        dir: PathBuf,
        private: PathBuf,
        public: PathBuf,
    }

    impl Keys {
        fn new(name: &str) -> Keys {
            let dir = std::env::temp_dir()
                .join(format!("policy-host-trust-{}-{name}", std::process::id()));
            std::fs::create_dir_all(&dir).expect("temp dir");
            let (pkcs8, spki) = SigningKey::generate().expect("a key");
            let private = dir.join("key.pem");
            let public = dir.join("key.pub");
            std::fs::write(&private, pem("PRIVATE KEY", &pkcs8)).expect("write");
            std::fs::write(&public, pem("PUBLIC KEY", &spki)).expect("write");
            Keys {
                dir,
                private,
                public,
            }
        }

        fn signer(&self) -> SigningKey {
            SigningKey::from_pem_file(&self.private).expect("signing key")
        }

        fn policy(&self) -> TrustPolicy {
            TrustPolicy::from_files(std::slice::from_ref(&self.public)).expect("policy")
        }
    }

    impl Drop for Keys {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn pem(label: &str, der: &[u8]) -> String {
        crate::plugin_cli::keygen::pem(label, der)
    }

    const SHA: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    fn pack(grants: Option<&str>) -> ConfigMap {
        let mut data = BTreeMap::new();
        data.insert("sha256".to_owned(), SHA.to_owned());
        if let Some(grants) = grants {
            data.insert(GRANTS_KEY.to_owned(), grants.to_owned());
        }
        ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some("etcd".into()),
                namespace: Some("policy-host".into()),
                ..Default::default()
            },
            data: Some(data),
            ..Default::default()
        }
    }

    #[test]
    fn without_trusted_keys_every_pack_loads() {
        assert!(TrustPolicy::default().verify(&pack(None), SHA).is_ok());
    }

    #[test]
    fn a_pack_signed_by_a_trusted_key_loads() {
        let keys = Keys::new("trusted");
        let mut cm = pack(Some("appCall: [client]"));
        keys.signer().sign(&mut cm, SHA);
        assert_eq!(
            keys.policy().verify(&cm, SHA).map_err(|e| e.to_string()),
            Ok(())
        );
    }

    #[test]
    fn an_unsigned_pack_is_refused_naming_the_expected_key() {
        let keys = Keys::new("unsigned");
        let policy = keys.policy();
        let error = policy.verify(&pack(None), SHA).expect_err("unsigned");
        assert_eq!(error.reason(), "PluginUnsigned");
        let id = keys.signer().id();
        assert!(error.to_string().contains(&id), "{error}");
        assert!(
            error.to_string().contains("policy-host pack --sign"),
            "{error}"
        );
    }

    #[test]
    fn a_pack_signed_by_another_key_is_refused() {
        let trusted = Keys::new("trusted-other");
        let stranger = Keys::new("stranger");
        let mut cm = pack(None);
        stranger.signer().sign(&mut cm, SHA);
        let error = trusted.policy().verify(&cm, SHA).expect_err("untrusted");
        assert_eq!(error.reason(), "PluginUntrusted");
        assert!(
            error.to_string().contains(&stranger.signer().id()),
            "{error}"
        );
        assert!(
            error.to_string().contains(&trusted.signer().id()),
            "{error}"
        );
    }

    #[test]
    fn a_signature_by_another_key_under_the_trusted_id_does_not_verify() {
        let trusted = Keys::new("impersonated");
        let stranger = Keys::new("impersonator");
        let mut cm = pack(None);
        stranger.signer().sign(&mut cm, SHA);
        if let Some(data) = cm.data.as_mut() {
            data.insert(SIGNED_BY_KEY.into(), trusted.signer().id());
        }
        let error = trusted.policy().verify(&cm, SHA).expect_err("forged");
        assert_eq!(error.reason(), "PluginSignatureInvalid");
    }

    #[test]
    fn another_component_under_a_signature_is_refused() {
        let keys = Keys::new("component");
        let mut cm = pack(None);
        keys.signer().sign(&mut cm, SHA);
        let other = SHA.replace('9', "8");
        let error = keys.policy().verify(&cm, &other).expect_err("altered");
        assert_eq!(error.reason(), "PluginSignatureInvalid");
    }

    const REFERENCE: &str = "oci://registry.example/plugins/etcd@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    /// A pack by reference signs its reference: another digest (other code) under the same
    /// signature is refused, and a byte pack's signature does not carry over to a reference.
    #[test]
    fn another_digest_under_a_signed_reference_is_refused() {
        let keys = Keys::new("reference");
        let mut cm = pack(Some("appCall: [client]"));
        cm.data
            .get_or_insert_with(Default::default)
            .insert(REFERENCE_KEY.into(), REFERENCE.into());
        keys.signer().sign(&mut cm, SHA);
        assert_eq!(
            keys.policy().verify(&cm, SHA).map_err(|e| e.to_string()),
            Ok(())
        );
        let mut moved = cm.clone();
        moved.data.get_or_insert_with(Default::default).insert(
            REFERENCE_KEY.into(),
            REFERENCE.replace("0123456789abcdef0123", "1123456789abcdef0123"),
        );
        let error = keys.policy().verify(&moved, SHA).expect_err("moved");
        assert_eq!(error.reason(), "PluginSignatureInvalid");

        let mut bytes_signed = pack(Some("appCall: [client]"));
        keys.signer().sign(&mut bytes_signed, SHA);
        bytes_signed
            .data
            .get_or_insert_with(Default::default)
            .insert(REFERENCE_KEY.into(), REFERENCE.into());
        let error = keys
            .policy()
            .verify(&bytes_signed, SHA)
            .expect_err("a byte pack's signature under a reference");
        assert_eq!(error.reason(), "PluginSignatureInvalid");
    }

    #[test]
    fn widened_grants_under_a_signature_are_refused() {
        let keys = Keys::new("grants");
        let mut cm = pack(Some("appCall: [client]"));
        keys.signer().sign(&mut cm, SHA);
        if let Some(data) = cm.data.as_mut() {
            data.insert(GRANTS_KEY.into(), "appCall: [client, peer]".into());
        }
        let error = keys.policy().verify(&cm, SHA).expect_err("widened");
        assert_eq!(error.reason(), "PluginSignatureInvalid");
        assert!(error.to_string().contains("sign again"), "{error}");
    }

    fn with_data(mut cm: ConfigMap, key: &str, value: &str) -> ConfigMap {
        cm.data
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_owned(), value.to_owned());
        cm
    }

    fn signed(keys: &Keys, cm: ConfigMap) -> ConfigMap {
        let mut cm = cm;
        keys.signer().sign(&mut cm, SHA);
        cm
    }

    #[test]
    fn a_shadow_pack_flipped_to_active_is_refused() {
        let keys = Keys::new("mode");
        let cm = signed(&keys, with_data(pack(None), MODE_KEY, "shadow"));
        assert_eq!(
            keys.policy().verify(&cm, SHA).map_err(|e| e.to_string()),
            Ok(())
        );
        for mode in ["active", ""] {
            let flipped = with_data(cm.clone(), MODE_KEY, mode);
            let error = keys.policy().verify(&flipped, SHA).expect_err("flipped");
            assert_eq!(error.reason(), "PluginSignatureInvalid", "mode {mode:?}");
        }
    }

    #[test]
    fn a_widened_or_removed_rollout_under_a_signature_is_refused() {
        let keys = Keys::new("rollout");
        let canary = with_data(pack(None), MODE_KEY, "rollout");
        let cm = signed(
            &keys,
            with_data(canary, ROLLOUT_KEY, "{percent: 5, maxFailureRate: 0.1}"),
        );
        assert_eq!(
            keys.policy().verify(&cm, SHA).map_err(|e| e.to_string()),
            Ok(())
        );
        let widened = with_data(cm.clone(), ROLLOUT_KEY, "{percent: 100, maxFailureRate: 1}");
        let error = keys.policy().verify(&widened, SHA).expect_err("widened");
        assert_eq!(error.reason(), "PluginSignatureInvalid");
        let mut removed = cm;
        if let Some(data) = removed.data.as_mut() {
            data.remove(ROLLOUT_KEY);
        }
        let error = keys.policy().verify(&removed, SHA).expect_err("removed");
        assert_eq!(error.reason(), "PluginSignatureInvalid");
    }

    #[test]
    fn raised_limits_under_a_signature_are_refused() {
        let keys = Keys::new("limits");
        let cm = signed(
            &keys,
            with_data(pack(None), LIMITS_KEY, "{memoryMiB: 64, concurrency: 4}"),
        );
        let raised = with_data(cm.clone(), LIMITS_KEY, "{memoryMiB: 512, concurrency: 64}");
        let error = keys.policy().verify(&raised, SHA).expect_err("raised");
        assert_eq!(error.reason(), "PluginSignatureInvalid");
        let mut unlimited = cm;
        if let Some(data) = unlimited.data.as_mut() {
            data.remove(LIMITS_KEY);
        }
        let error = keys.policy().verify(&unlimited, SHA).expect_err("removed");
        assert_eq!(error.reason(), "PluginSignatureInvalid");
    }

    #[test]
    fn a_signed_pack_under_another_name_is_refused() {
        let keys = Keys::new("name");
        let mut cm = signed(&keys, pack(None));
        cm.metadata.name = Some("etcd-canary".into());
        let error = keys.policy().verify(&cm, SHA).expect_err("renamed");
        assert_eq!(error.reason(), "PluginSignatureInvalid");
    }

    #[test]
    fn a_serial_older_than_the_one_verified_is_refused_and_the_same_one_loads_again() {
        let keys = Keys::new("serial");
        let policy = keys.policy();
        let newer = signed(&keys, with_data(pack(None), SERIAL_KEY, "5"));
        let older = signed(&keys, with_data(pack(None), SERIAL_KEY, "3"));
        assert_eq!(
            policy.verify(&newer, SHA).map_err(|e| e.to_string()),
            Ok(())
        );
        let error = policy.verify(&older, SHA).expect_err("replayed");
        assert_eq!(error.reason(), "PluginSignatureReplayed");
        assert!(error.to_string().contains("serial 3"), "{error}");
        assert!(error.to_string().contains("serial 5"), "{error}");
        assert_eq!(
            policy.verify(&newer, SHA).map_err(|e| e.to_string()),
            Ok(())
        );
        // The floor is per ConfigMap: another pack starts its own.
        let mut other = with_data(pack(None), SERIAL_KEY, "3");
        other.metadata.name = Some("redis".into());
        let other = signed(&keys, other);
        assert_eq!(
            policy.verify(&other, SHA).map_err(|e| e.to_string()),
            Ok(())
        );
        // A serial changed after signing does not verify at all.
        let bumped = with_data(older, SERIAL_KEY, "9");
        let error = policy.verify(&bumped, SHA).expect_err("bumped");
        assert_eq!(error.reason(), "PluginSignatureInvalid");
    }

    #[test]
    fn a_pack_signed_by_the_previous_scheme_is_refused_saying_to_sign_again() {
        let keys = Keys::new("v1");
        let signer = keys.signer();
        let mut cm = pack(Some("appCall: [client]"));
        let v1 = format!("policy-host plugin signature v1\nsha256:{SHA}\ngrants:appCall: [client]");
        let signature = signer.pair.sign(v1.as_bytes());
        if let Some(data) = cm.data.as_mut() {
            data.insert(SIGNATURE_KEY.into(), to_hex(signature.as_ref()));
            data.insert(SIGNED_BY_KEY.into(), signer.id());
        }
        let error = keys.policy().verify(&cm, SHA).expect_err("v1");
        assert_eq!(error.reason(), "PluginSignatureOutdated");
        assert!(
            error.to_string().contains("policy-host pack --sign"),
            "{error}"
        );
    }

    #[test]
    fn a_garbled_signature_is_refused_not_a_panic() {
        let keys = Keys::new("garbled");
        let mut cm = pack(None);
        keys.signer().sign(&mut cm, SHA);
        for garbage in ["zz", "é".repeat(64).as_str(), &"0".repeat(128)] {
            if let Some(data) = cm.data.as_mut() {
                data.insert(SIGNATURE_KEY.into(), garbage.to_owned());
            }
            let error = keys.policy().verify(&cm, SHA).expect_err("garbled");
            assert_eq!(error.reason(), "PluginSignatureInvalid", "{garbage}");
        }
    }

    #[test]
    fn key_files_that_are_not_ed25519_keys_are_clear_errors() {
        let keys = Keys::new("files");
        let error = TrustedKey::from_pem_file(&keys.private).expect_err("a private key");
        assert_eq!(error.reason(), "TrustKeyInvalid");
        let error = TrustedKey::from_pem_file(&keys.dir.join("missing.pub")).expect_err("no file");
        assert!(error.to_string().contains("cannot read"), "{error}");
        let error = SigningKey::from_pem_file(&keys.public)
            .err()
            .map(|e| e.to_string());
        assert!(error.is_some_and(|e| e.contains("PRIVATE KEY")));
        // An RSA-sized SPKI is not an ed25519 key.
        let rsa = keys.dir.join("rsa.pub");
        std::fs::write(&rsa, pem("PUBLIC KEY", &[0x30; 40])).expect("write");
        let error = TrustedKey::from_pem_file(&rsa).expect_err("not ed25519");
        assert!(error.to_string().contains("not an ed25519 key"), "{error}");
    }

    /// A key pair as `openssl genpkey -algorithm ed25519` and `openssl pkey -pubout` wrote it
    /// (PKCS#8 v1, no public key inside): a test key, never used for anything else.
    const OPENSSL_PRIVATE: &str = "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIJZdIy/3VuGhHNOL3hqUWszt8jzfv3SRZM5rfwkIUBoR\n-----END PRIVATE KEY-----\n";
    const OPENSSL_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEA5/OTfGbACR3RRmQ4BCSxmW2Oj+DQwGr5AyhXFcMPX1w=\n-----END PUBLIC KEY-----\n";

    #[test]
    fn keys_written_by_openssl_sign_and_verify() {
        let keys = Keys::new("openssl");
        let private = keys.dir.join("openssl.pem");
        let public = keys.dir.join("openssl.pub");
        std::fs::write(&private, OPENSSL_PRIVATE).expect("write");
        std::fs::write(&public, OPENSSL_PUBLIC).expect("write");
        let signer = SigningKey::from_pem_file(&private).expect("openssl's private key");
        let trusted = TrustedKey::from_pem_file(&public).expect("openssl's public key");
        assert_eq!(signer.id(), trusted.id);
        let mut cm = pack(Some("appCall: [client]"));
        signer.sign(&mut cm, SHA);
        let policy = TrustPolicy::new(vec![trusted]);
        assert_eq!(policy.verify(&cm, SHA).map_err(|e| e.to_string()), Ok(()));
    }

    /// Review H2: in a cluster the keys come as PEM text in the pod spec, several in one value.
    /// Text that holds no public key is refused, never read as "no trust policy".
    #[test]
    fn trusted_keys_given_as_pem_text_are_every_public_key_in_it() {
        let keys = Keys::new("text");
        let ours = TrustedKey::from_pem_file(&keys.public).expect("our key");
        let text = format!(
            "{}{OPENSSL_PUBLIC}",
            std::fs::read_to_string(&keys.public).expect("read")
        );
        let read = TrustedKey::all_from_pem_text("POLICY_HOST_TRUSTED_KEYS", &text).expect("keys");
        let theirs = TrustPolicy::default().with_keys(read.clone());
        assert_eq!(read.len(), 2);
        assert_eq!(read[0], ours);
        let mut cm = pack(None);
        keys.signer().sign(&mut cm, SHA);
        assert!(theirs.verify(&cm, SHA).is_ok());
        for (what, text) in [
            ("empty", String::new()),
            ("a private key", OPENSSL_PRIVATE.to_owned()),
            (
                "a path",
                "/etc/policy-host/trusted-keys/plugin-signing.pub".to_owned(),
            ),
        ] {
            let error =
                TrustedKey::all_from_pem_text("POLICY_HOST_TRUSTED_KEYS", &text).expect_err(what);
            assert_eq!(error.reason(), "TrustKeyInvalid", "{what}");
            assert!(
                error.to_string().contains("POLICY_HOST_TRUSTED_KEYS"),
                "{what}: {error}"
            );
        }
    }
}
