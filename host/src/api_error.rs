//! How an error of the Kubernetes API reads for a user: the API server's own message, not the
//! Debug dump of its `Status`. Shared by every stage that writes (act, load, the controller's
//! own bookkeeping), so none imports another stage for it.

/// The API server's own message for an API error (its message, code and reason), or the
/// client's error as it reads.
pub fn api_error_text(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => {
            format!("{} ({} {})", status.message, status.code, status.reason)
        }
        other => other.to_string(),
    }
}
