//! The host's own image follows `deploy/Dockerfile`: [`DockerfileImage`] reads its final stage
//! (the `COPY --from=build` lines, `USER`, `ENTRYPOINT`, `CMD`), so the Dockerfile and the image
//! the tests run cannot drift apart.

use std::path::PathBuf;

use super::{ImageFile, ImageSpec, NONROOT_UID};
use crate::{Error, Result};

/// The final stage of a Dockerfile, as far as the image's layout and user go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DockerfileImage {
    /// The `FROM` image of the final stage.
    pub base: String,
    /// `COPY --from=<stage> <source> <destination>` lines: (source in the build stage,
    /// destination in the image).
    pub copies: Vec<(String, String)>,
    /// The `USER`, checked to be numeric (`65532` or `65532:65532`).
    pub user: String,
    /// The `ENTRYPOINT` (exec form).
    pub entrypoint: Vec<String>,
    /// The `CMD` (exec form).
    pub cmd: Vec<String>,
}

/// The base images [`DockerfileImage`] knows how to stand in for: distroless's, which carry
/// glibc and libgcc (the `cc` variants), the CA bundle, `/etc/passwd` with `nonroot` = 65532,
/// and `/tmp`. The local image gives the same with the machine's files.
const KNOWN_BASES: &[&str] = &[
    "gcr.io/distroless/cc-debian12:nonroot",
    "gcr.io/distroless/cc-debian12",
];

impl DockerfileImage {
    /// Reads the final stage of `text` (a Dockerfile). Refuses what the local image could not
    /// reproduce (an unknown base, instructions other than `COPY --from`, `USER`, `ENTRYPOINT`,
    /// `CMD`, `ENV`, `LABEL`, `WORKDIR /`) and a `USER` that is a name: the kubelet cannot check
    /// a named user against `runAsNonRoot` and refuses to start the container.
    pub fn parse(text: &str) -> Result<DockerfileImage, DockerfileError> {
        let mut instructions: Vec<(String, String)> = Vec::new();
        let mut pending = String::new();
        for line in text.lines() {
            let line = line.trim();
            if pending.is_empty() && (line.is_empty() || line.starts_with('#')) {
                continue;
            }
            match line.strip_suffix('\\') {
                Some(start) => {
                    pending.push_str(start);
                    pending.push(' ');
                }
                None => {
                    pending.push_str(line);
                    let whole = std::mem::take(&mut pending);
                    let (word, rest) = whole
                        .split_once(char::is_whitespace)
                        .unwrap_or((&whole, ""));
                    instructions.push((word.to_ascii_uppercase(), rest.trim().to_owned()));
                }
            }
        }
        let last_from = instructions
            .iter()
            .rposition(|(word, _)| word == "FROM")
            .ok_or_else(|| DockerfileError("it has no FROM".into()))?;
        let base = instructions[last_from]
            .1
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_owned();
        if !KNOWN_BASES.contains(&base.as_str()) {
            return Err(DockerfileError(format!(
                "its final stage is FROM {base}, which the local image cannot stand in for (known: {}); extend KNOWN_BASES in tests/src/images.rs with what that base holds",
                KNOWN_BASES.join(", ")
            )));
        }
        let mut image = DockerfileImage {
            base,
            copies: Vec::new(),
            user: String::new(),
            entrypoint: Vec::new(),
            cmd: Vec::new(),
        };
        for (word, rest) in &instructions[last_from + 1..] {
            match word.as_str() {
                "COPY" => {
                    let parts: Vec<&str> = rest.split_whitespace().collect();
                    match parts.as_slice() {
                        [from, source, destination] if from.starts_with("--from=") => image
                            .copies
                            .push(((*source).to_owned(), (*destination).to_owned())),
                        _ => {
                            return Err(DockerfileError(format!(
                                "COPY {rest}: only `COPY --from=<stage> <file> <absolute path>` is understood"
                            )));
                        }
                    }
                }
                "USER" => image.user = rest.clone(),
                "ENTRYPOINT" => image.entrypoint = exec_form(word, rest)?,
                "CMD" => image.cmd = exec_form(word, rest)?,
                "LABEL" | "ENV" => {}
                "WORKDIR" if rest == "/" => {}
                other => {
                    return Err(DockerfileError(format!(
                        "{other} {rest} in the final stage is not reproduced by the local image; extend DockerfileImage::parse"
                    )));
                }
            }
        }
        let numeric = |part: &str| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit());
        let mut ids = image.user.split(':');
        let uid_ok = ids.next().is_some_and(numeric);
        let gid_ok = ids.next().is_none_or(numeric) && ids.next().is_none();
        if !(uid_ok && gid_ok) {
            return Err(DockerfileError(format!(
                "USER `{}` is not numeric: under runAsNonRoot the kubelet refuses to start a container whose image user is a name (CreateContainerConfigError \"non-numeric user\"); write `USER {NONROOT_UID}:{NONROOT_UID}`",
                image.user
            )));
        }
        Ok(image)
    }

    /// The local image of this stage, named `name`: each `COPY` source found with `resolve`
    /// (which maps a path of the build stage to a file here), the base's CA bundle, user,
    /// entrypoint and command as written.
    pub fn image_spec(
        &self,
        name: &str,
        resolve: impl Fn(&str) -> Option<PathBuf>,
    ) -> Result<ImageSpec> {
        let mut files = Vec::new();
        for (source, destination) in &self.copies {
            let local = resolve(source).ok_or_else(|| Error::Image {
                image: name.to_owned(),
                problem: format!(
                    "the Dockerfile copies {source}, which has no local counterpart; build it first"
                ),
            })?;
            files.push(ImageFile {
                source: local,
                path: destination.clone(),
            });
        }
        Ok(ImageSpec {
            user: Some(self.user.clone()),
            entrypoint: self.entrypoint.clone(),
            cmd: self.cmd.clone(),
            ca_certificates: true,
            ..ImageSpec::new(name, files)
        })
    }
}

/// A Dockerfile the local image cannot follow; the message says what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the Dockerfile cannot be reproduced as a local image: {0}")]
pub struct DockerfileError(pub String);

fn exec_form(word: &str, rest: &str) -> Result<Vec<String>, DockerfileError> {
    serde_json::from_str(rest).map_err(|_| {
        DockerfileError(format!(
            "{word} {rest}: only the exec form (a JSON array) is understood"
        ))
    })
}
