//! The world of a plugin run without a network: canned answers to its calls and exchanges
//! (a script) and the record of what a live run asked and got (a recorder), so `simulate`,
//! benchmarks and shadow mode decide without touching the application.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::credentials::HandedOut;
use crate::contract::app_call::{CallError, Request, Response};
use crate::contract::exchange::ExchangeError;

/// A request and the answer it got.
pub type Exchange = (Request, Result<Response, CallError>);

/// Bytes one recorder keeps (requests and answers, calls and exchange rounds); past it the
/// recording is incomplete and says so ([`AppCallRecorder::is_complete`]): host memory that no
/// plugin limit covered otherwise (review #5).
pub const RECORDING_BUDGET: usize = 4 << 20;

/// Calls and exchange rounds a script logs for its caller to read; the rest are answered but
/// not logged.
pub const MAX_LOGGED_CALLS: usize = 1024;

/// One pod's scripted answers, by path.
type ScriptedPaths = HashMap<String, Result<Response, CallError>>;

/// Canned answers to app-calls, and a record of the calls a plugin made: the world of a plugin
/// run without a network (benchmarks, `policy-host simulate`, and shadow mode, where a candidate
/// plugin must decide without touching the real application).
///
/// Two kinds of answer: by pod and path (a hand-written script: method and body are recorded,
/// not matched), and by whole request (the replay of an [`AppCallRecorder`]: only the very
/// request the recorded run made gets its answer). Clones share the record, so a caller keeps
/// one clone to read what the plugin asked.
#[derive(Clone, Debug, Default)]
pub struct AppCallScript {
    /// pod → path → answer.
    answers: Arc<HashMap<String, ScriptedPaths>>,
    /// Whole requests and their answers, in the order they were recorded.
    replies: Arc<Vec<Exchange>>,
    /// Which `replies` were answered already: a request made twice gets the second answer the
    /// second time (a plugin polling until something changes sees the change).
    used: Arc<Mutex<Vec<bool>>>,
    calls: Arc<Mutex<Vec<Request>>>,
    /// Exchange rounds and their replies ([`super::exchange`]), hand-written or recorded.
    rounds: Arc<Vec<ExchangeRound>>,
    /// Which `rounds` were answered already (as `used` for app-calls).
    rounds_used: Arc<Mutex<Vec<bool>>>,
    /// The exchange rounds answered so far, with the answer given.
    rounds_made: Arc<Mutex<Vec<ExchangeRound>>>,
}

impl AppCallScript {
    /// A script from `(pod, path, answer)` rows; a later row for the same pod and path wins.
    pub fn new(
        rows: impl IntoIterator<Item = (String, String, Result<Response, CallError>)>,
    ) -> Self {
        let mut answers: HashMap<String, ScriptedPaths> = HashMap::new();
        for (pod, path, answer) in rows {
            answers.entry(pod).or_default().insert(path, answer);
        }
        Self {
            answers: Arc::new(answers),
            ..Self::default()
        }
    }

    /// A script that answers exactly the requests in `replies` (pod, port, method, path and
    /// body must all match), each with its recorded answer.
    pub fn replaying(replies: Vec<Exchange>) -> Self {
        Self {
            used: Arc::new(Mutex::new(vec![false; replies.len()])),
            replies: Arc::new(replies),
            ..Self::default()
        }
    }

    /// The same script, also answering exchanges: each round's request (all the bytes the
    /// plugin sent before reading) gets its reply. A round without a port answers on any port.
    pub fn with_exchanges(mut self, rounds: impl IntoIterator<Item = ExchangeRound>) -> Self {
        let mut all: Vec<ExchangeRound> = self.rounds.as_ref().clone();
        all.extend(rounds);
        self.rounds_used = Arc::new(Mutex::new(vec![false; all.len()]));
        self.rounds = Arc::new(all);
        self
    }

    /// The calls answered so far (through any clone), in order.
    pub fn calls(&self) -> Vec<Request> {
        self.calls.lock().map(|c| c.clone()).unwrap_or_default()
    }

    /// The exchange rounds answered so far (through any clone), in order, with the answer
    /// each got.
    pub fn exchanges(&self) -> Vec<ExchangeRound> {
        self.rounds_made
            .lock()
            .map(|r| r.clone())
            .unwrap_or_default()
    }

    /// Answers one exchange round: the first unused round with this pod, port and request,
    /// else the last such; anything else is unreachable, as an absent pod would be.
    pub(crate) fn answer_exchange(
        &self,
        pod: &str,
        port: &str,
        request: &[u8],
    ) -> Result<Vec<u8>, ExchangeError> {
        let equal: Vec<usize> = self
            .rounds
            .iter()
            .enumerate()
            .filter(|(_, round)| {
                round.pod == pod
                    && round.port.as_deref().is_none_or(|p| p == port)
                    && round.request == request
            })
            .map(|(index, _)| index)
            .collect();
        let chosen = equal.last().copied().map(|last| {
            // Never held across an await: a plain mutex is right here.
            let mut used = self.rounds_used.lock().unwrap_or_else(|p| p.into_inner());
            let index = equal
                .iter()
                .copied()
                .find(|&i| used.get(i).is_some_and(|u| !u))
                .unwrap_or(last);
            if let Some(flag) = used.get_mut(index) {
                *flag = true;
            }
            index
        });
        let reply = match chosen.and_then(|i| self.rounds.get(i)) {
            Some(round) => round.reply.clone(),
            None => Err(ExchangeError::Unreachable(format!(
                "no scripted exchange with pod `{pod}` port `{port}` for this request ({} bytes); a script cannot reach the application",
                request.len()
            ))),
        };
        if let Ok(mut made) = self.rounds_made.lock()
            && made.len() < MAX_LOGGED_CALLS
        {
            made.push(ExchangeRound {
                pod: pod.to_owned(),
                port: Some(port.to_owned()),
                request: request.to_vec(),
                reply: reply.clone(),
            });
        }
        reply
    }

    /// Forgets the recorded calls.
    pub fn clear_calls(&self) {
        if let Ok(mut calls) = self.calls.lock() {
            calls.clear();
        }
    }

    /// Answers one request: first from the replies (the first unused equal request, else the
    /// last equal one), then by pod and path. Anything else is unreachable, as an absent pod
    /// would be.
    pub(super) fn answer(&self, request: Request) -> Result<Response, CallError> {
        let answer = self.replay(&request).or_else(|| {
            self.answers
                .get(&request.pod)
                .and_then(|paths| paths.get(&request.path))
                .cloned()
        });
        let answer = answer.unwrap_or_else(|| {
            Err(CallError::Unreachable(if self.replies.is_empty() {
                format!(
                    "no scripted answer for pod `{}` path `{}`",
                    request.pod, request.path
                )
            } else {
                format!(
                    "the recorded run made no {:?} {} to pod `{}` port `{}` with this body; a replay cannot reach the application",
                    request.method, request.path, request.pod, request.port
                )
            }))
        });
        // Never held across an await: a plain mutex is right here.
        if let Ok(mut calls) = self.calls.lock()
            && calls.len() < MAX_LOGGED_CALLS
        {
            calls.push(request);
        }
        answer
    }

    fn replay(&self, request: &Request) -> Option<Result<Response, CallError>> {
        let equal: Vec<usize> = self
            .replies
            .iter()
            .enumerate()
            .filter(|(_, (recorded, _))| recorded == request)
            .map(|(index, _)| index)
            .collect();
        let last = *equal.last()?;
        let mut used = self.used.lock().ok()?;
        let index = equal
            .into_iter()
            .find(|&i| used.get(i).is_some_and(|u| !u))
            .unwrap_or(last);
        if let Some(flag) = used.get_mut(index) {
            *flag = true;
        }
        self.replies.get(index).map(|(_, answer)| answer.clone())
    }
}

/// The calls a live scope made and the answers they got, in order, so a second plugin can be
/// shown the same application without reaching it ([`AppCallRecorder::replay`]): shadow mode
/// runs the candidate on the active plugin's recorded answers. Clones share the record.
#[derive(Clone, Debug, Default)]
pub struct AppCallRecorder {
    exchanges: Arc<Mutex<Vec<Exchange>>>,
    rounds: Arc<Mutex<Vec<ExchangeRound>>>,
    /// Bytes kept so far, and whether something was left out (over [`RECORDING_BUDGET`]).
    kept: Arc<Mutex<(usize, bool)>>,
    /// Credentials handed to the recorded plugin, by `(secret, key)`: a shadow candidate is
    /// handed the same ones. Kept in memory only, for as long as the recording.
    credentials: Arc<Mutex<super::credentials::CredentialValues>>,
}

/// Bytes an answer to an app-call holds.
fn answer_size(answer: &Result<Response, CallError>) -> usize {
    match answer {
        Ok(response) => response.body.len(),
        Err(CallError::Refused(m) | CallError::Unreachable(m)) => m.len(),
        Err(CallError::Timeout) => 0,
    }
}

impl AppCallRecorder {
    /// An empty record.
    pub fn new() -> Self {
        Self::default()
    }

    /// The requests made so far, in order.
    pub fn calls(&self) -> Vec<Request> {
        self.exchanges
            .lock()
            .map(|e| e.iter().map(|(request, _)| request.clone()).collect())
            .unwrap_or_default()
    }

    /// The exchange rounds made so far, in order, with their replies.
    pub fn exchanges(&self) -> Vec<ExchangeRound> {
        self.rounds.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// A script that answers the recorded requests (and exchange rounds) with the recorded
    /// answers, and nothing else.
    pub fn replay(&self) -> AppCallScript {
        AppCallScript::replaying(self.exchanges.lock().map(|e| e.clone()).unwrap_or_default())
            .with_exchanges(self.exchanges())
    }

    /// False when something was left out of the recording (over [`RECORDING_BUDGET`]): a
    /// replay of it would not show the same application, so it is not used.
    pub fn is_complete(&self) -> bool {
        self.kept.lock().map(|k| !k.1).unwrap_or(false)
    }

    /// Keeps a credential handed to the recorded plugin, for its replay.
    pub(crate) fn record_credential(&self, handed: &HandedOut) {
        if let Ok(mut credentials) = self.credentials.lock() {
            credentials.insert(
                (handed.secret.clone(), handed.key.clone()),
                handed.value.clone(),
            );
        }
    }

    /// The credentials the recorded plugin was handed, for a replay's scope.
    pub fn credentials(&self) -> super::credentials::CredentialSource {
        super::credentials::CredentialSource::Scripted(Arc::new(
            self.credentials
                .lock()
                .map(|c| c.clone())
                .unwrap_or_default(),
        ))
    }

    /// Empties the recording and marks it incomplete if any request, answer or exchange round
    /// carries a value of `handed` (see [`super::credentials`]).
    pub fn forget_if_carrying(&self, handed: &[HandedOut]) {
        if handed.is_empty() {
            return;
        }
        let carries = |bytes: &[u8]| handed.iter().any(|h| h.is_in(bytes));
        let in_calls = self.exchanges.lock().is_ok_and(|calls| {
            calls.iter().any(|(request, answer)| {
                carries(request.path.as_bytes())
                    || request.body.as_ref().is_some_and(|b| carries(b.as_bytes()))
                    || answer.as_ref().is_ok_and(|r| carries(r.body.as_bytes()))
            })
        });
        let in_rounds = self.rounds.lock().is_ok_and(|rounds| {
            rounds.iter().any(|round| {
                carries(&round.request) || round.reply.as_ref().is_ok_and(|r| carries(r))
            })
        });
        if in_calls || in_rounds {
            if let Ok(mut calls) = self.exchanges.lock() {
                calls.clear();
            }
            if let Ok(mut rounds) = self.rounds.lock() {
                rounds.clear();
            }
            if let Ok(mut kept) = self.kept.lock() {
                *kept = (0, true);
            }
            if let Ok(mut credentials) = self.credentials.lock() {
                credentials.clear();
            }
        }
    }

    /// Takes `size` bytes of the budget, or marks the recording incomplete.
    fn take(&self, size: usize) -> bool {
        // Never held across an await: a plain mutex is right here.
        let Ok(mut kept) = self.kept.lock() else {
            return false;
        };
        if kept.1 || kept.0 + size > RECORDING_BUDGET {
            kept.1 = true;
            return false;
        }
        kept.0 += size;
        true
    }

    /// Writes one exchange round (see [`super::exchange`]).
    pub(crate) fn record_exchange(&self, round: ExchangeRound) {
        let size = round.pod.len()
            + round.request.len()
            + match &round.reply {
                Ok(bytes) => bytes.len(),
                Err(_) => 0,
            };
        if self.take(size)
            && let Ok(mut rounds) = self.rounds.lock()
        {
            rounds.push(round);
        }
    }

    pub(super) fn record(&self, request: Request, answer: &Result<Response, CallError>) {
        let size = request.pod.len()
            + request.path.len()
            + request.body.as_ref().map_or(0, String::len)
            + answer_size(answer);
        if self.take(size)
            && let Ok(mut exchanges) = self.exchanges.lock()
        {
            exchanges.push((request, answer.clone()));
        }
    }
}

/// One round of an exchange: the bytes the plugin sent before reading, and the reply it read
/// (or the error it got). The unit scripts answer and recorders write.
#[derive(Clone, Debug, PartialEq)]
pub struct ExchangeRound {
    /// Pod name.
    pub pod: String,
    /// Port as the plugin named it; `None` in a script answers on any port.
    pub port: Option<String>,
    /// The request bytes.
    pub request: Vec<u8>,
    /// The reply bytes, or why there was none.
    pub reply: Result<Vec<u8>, ExchangeError>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::app_call::Method;

    fn request(n: usize) -> Request {
        Request {
            pod: "db-0".into(),
            port: "client".into(),
            method: Method::Post,
            path: format!("/call/{n}"),
            body: Some("b".repeat(1024)),
        }
    }

    fn ok() -> Result<Response, CallError> {
        Ok(Response {
            status: 200,
            body: "r".repeat(1024),
        })
    }

    /// Review #5: a plugin calling in a loop within its deadline made the recorder (shadow
    /// mode) and the script's call log (simulate, shadows) keep every call.
    #[test]
    fn recordings_and_call_logs_are_bounded() {
        let recorder = AppCallRecorder::new();
        for n in 0..20_000 {
            recorder.record(request(n), &ok());
            recorder.record_exchange(ExchangeRound {
                pod: "db-0".into(),
                port: None,
                request: vec![0; 1024],
                reply: Ok(vec![0; 1024]),
            });
        }
        let kept: usize = recorder
            .calls()
            .iter()
            .map(|r| r.path.len() + r.body.as_ref().map_or(0, String::len))
            .sum::<usize>()
            + recorder
                .exchanges()
                .iter()
                .map(|r| r.request.len() + r.reply.as_ref().map_or(0, Vec::len))
                .sum::<usize>();
        assert!(kept <= RECORDING_BUDGET, "{kept} bytes recorded");
        assert!(!recorder.is_complete(), "an overflowing recording says so");

        let script = AppCallScript::new([("db-0".to_string(), "/call/0".to_string(), ok())]);
        for n in 0..20_000 {
            let _ = script.answer(request(n));
        }
        assert!(
            script.calls().len() <= MAX_LOGGED_CALLS,
            "{}",
            script.calls().len()
        );
    }
}
