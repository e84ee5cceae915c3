//! Which host wrote what, and when: a layer on a host under test's kube client records every
//! request that is not a read, as `METHOD path`, with when it was sent and when its answer
//! came back. The suites that run several hosts side by side (shards, a leader and its
//! standby) attribute the writes to a parent from these.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Instant;

use kube::Client;
use policy_host_testenv::TestEnv;

/// One write a host sent.
#[derive(Clone, Debug)]
pub struct Write {
    /// `METHOD path`, e.g. `PATCH /apis/test.policy-host.io/v1/namespaces/n/probes/p/status`.
    pub request: String,
    /// When the host sent it.
    pub sent: Instant,
    /// When its answer came back (`None`: not yet, or never).
    pub answered: Option<Instant>,
}

impl Write {
    /// Whether it is a write for the `Probe` parent `name`: to the parent itself (its
    /// finalizer), its status, or its `<name>-out` ConfigMap.
    pub fn is_for_probe(&self, name: &str) -> bool {
        [
            format!("/probes/{name}"),
            format!("/probes/{name}/status"),
            format!("/configmaps/{name}-out"),
        ]
        .iter()
        .any(|path| self.request.ends_with(path.as_str()))
    }

    /// Whether it is a write to a Lease (leader election's own).
    pub fn is_to_a_lease(&self) -> bool {
        self.request.contains("/leases")
    }
}

/// The writes one host sent to the API server, in the order sent.
#[derive(Clone, Default)]
pub struct Writes(Arc<Mutex<Vec<Write>>>);

impl Writes {
    /// A client for `env`'s API server that records into these writes.
    pub async fn client(&self, env: &TestEnv) -> anyhow::Result<Client> {
        let recorded = self.clone();
        Ok(
            kube::client::ClientBuilder::try_from(env.kube_config().await?)?
                .with_layer(&tower::layer::layer_fn(move |inner| RecordWrites {
                    inner,
                    writes: recorded.clone(),
                }))
                .build(),
        )
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Write>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many writes were sent so far.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether none was sent.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Every write sent so far.
    pub fn all(&self) -> Vec<Write> {
        self.lock().clone()
    }

    /// How many of the writes from the `since`-th on were for the `Probe` parent `name`.
    pub fn for_probe_since(&self, name: &str, since: usize) -> usize {
        self.lock()
            .iter()
            .skip(since)
            .filter(|write| write.is_for_probe(name))
            .count()
    }

    /// How many writes were for the `Probe` parent `name`.
    pub fn for_probe(&self, name: &str) -> usize {
        self.for_probe_since(name, 0)
    }
}

/// A client service that records every non-GET request into [`Writes`].
struct RecordWrites<S> {
    inner: S,
    writes: Writes,
}

impl<S, B> tower::Service<http::Request<B>> for RecordWrites<S>
where
    S: tower::Service<http::Request<B>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let recorded = (request.method() != http::Method::GET).then(|| {
            let mut writes = self.writes.lock();
            writes.push(Write {
                request: format!("{} {}", request.method(), request.uri().path()),
                sent: Instant::now(),
                answered: None,
            });
            (self.writes.clone(), writes.len() - 1)
        });
        let answer = self.inner.call(request);
        Box::pin(async move {
            let answer = answer.await;
            if let Some((writes, index)) = recorded {
                writes.lock()[index].answered = Some(Instant::now());
            }
            answer
        })
    }
}
