//! The Ray Jobs REST API, as the dashboard of Ray 2.x serves it (checked against Ray 2.60):
//!
//! | call | request | answer |
//! | --- | --- | --- |
//! | submit | `POST /api/jobs/` with a [`SubmitBody`] | `{"job_id", "submission_id"}`; an id taken: 500 with `already exists` |
//! | list | `GET /api/jobs/` | a JSON array of [`JobInfo`] (every job the cluster knows) |
//! | one job | `GET /api/jobs/{submission_id}` | a [`JobInfo`]; 404 for an unknown id |
//! | stop | `POST /api/jobs/{submission_id}/stop` | `{"stopped": bool}`; 404 for an unknown id |
//! | logs | `GET /api/jobs/{submission_id}/logs` | `{"logs": "..."}` |
//! | version | `GET /api/version` | `{"ray_version", ...}` |
//! | nodes | `GET /api/v0/nodes` | `{"data": {"result": {"result": [{"state", "resources_total"}]}}}` |
//!
//! The blocking client (ureq) runs on tokio's blocking pool; each request is tried up to
//! [`TRIES`] times with a doubling pause when the dashboard cannot be reached or answers 502,
//! 503 or 504, then reported as [`ExecutorError::SchedulerUnavailable`] (transient). A 401 or
//! 403 is [`ExecutorError::Misconfigured`] naming the token variable (never retried).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::executor::ExecutorError;

/// Tries of one request while the dashboard does not answer (or answers 502/503/504).
pub(crate) const TRIES: u32 = 3;

/// Largest answer read (the list of every job of a busy cluster; a job's logs).
const MAX_ANSWER: u64 = 256 << 20;

/// The JSON body of `POST /api/jobs/`. Field order is fixed here (never a map's), so the
/// rendered body is the same bytes whatever serde_json features a build enables.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct SubmitBody {
    pub entrypoint: String,
    pub submission_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entrypoint_num_cpus: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entrypoint_num_gpus: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entrypoint_memory: Option<u64>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub entrypoint_resources: BTreeMap<String, f64>,
    pub runtime_env: RuntimeEnv,
    pub metadata: BTreeMap<String, String>,
}

/// The `runtime_env` of a submitted job: only `env_vars` (a local `working_dir` is refused by
/// the REST API, which takes only URIs of uploaded packages: the entrypoint `cd`s instead).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct RuntimeEnv {
    pub env_vars: BTreeMap<String, String>,
}

/// One job as `GET /api/jobs/` lists it (the fields puzzletron reads).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub(crate) struct JobInfo {
    /// `SUBMISSION` (a job submitted through this API) or `DRIVER` (a `ray.init` script).
    #[serde(rename = "type")]
    pub kind: Option<String>,
    pub submission_id: Option<String>,
    /// `PENDING`, `RUNNING`, `STOPPED`, `SUCCEEDED`, `FAILED`.
    pub status: Option<String>,
    pub message: Option<String>,
    pub error_type: Option<String>,
    /// Milliseconds since the Unix epoch.
    pub start_time: Option<u64>,
    pub end_time: Option<u64>,
    pub metadata: Option<BTreeMap<String, String>>,
    pub driver_exit_code: Option<i64>,
    pub driver_node_id: Option<String>,
}

impl JobInfo {
    /// A metadata value.
    pub(super) fn meta(&self, key: &str) -> Option<&str> {
        self.metadata.as_ref()?.get(key).map(String::as_str)
    }
}

#[derive(Deserialize)]
struct LogsAnswer {
    #[serde(default)]
    logs: String,
}

/// A node of `GET /api/v0/nodes`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub(crate) struct NodeInfo {
    pub state: Option<String>,
    pub resources_total: BTreeMap<String, f64>,
}

/// An HTTP answer: status and body.
struct Answer {
    status: u16,
    body: String,
}

/// The dashboard's HTTP client.
#[derive(Clone)]
pub(crate) struct Client {
    agent: ureq::Agent,
    /// `http://host:port`, no trailing `/`.
    pub base: String,
    token: Option<String>,
    /// The name of the variable the token came from, for errors (never the token).
    pub token_env: Option<String>,
    /// The runner key naming the address, for errors (`runner.ray.address`).
    pub address_key: String,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("base", &self.base)
            .field("token_env", &self.token_env)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl Client {
    pub(super) fn new(
        base: String,
        token: Option<String>,
        token_env: Option<String>,
        address_key: String,
        timeout: Duration,
    ) -> Self {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(timeout.min(Duration::from_secs(5))))
            .timeout_global(Some(timeout))
            .build()
            .into();
        Self {
            agent,
            base,
            token,
            token_env,
            address_key,
        }
    }

    /// One request, on the blocking pool, with the retries of the module docs. `Ok` for every
    /// answer the dashboard gave (any status but 401/403 and 502-504).
    async fn call(
        &self,
        method: &'static str,
        path: String,
        body: Option<String>,
    ) -> Result<Answer, ExecutorError> {
        self.call_tries(method, path, body, TRIES).await
    }

    async fn call_tries(
        &self,
        method: &'static str,
        path: String,
        body: Option<String>,
        tries: u32,
    ) -> Result<Answer, ExecutorError> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            this.call_blocking(method, &path, body.as_deref(), tries)
        })
        .await
        .map_err(|e| ExecutorError::Other {
            message: format!("Ray request task failed: {e}"),
            retryable: true,
        })?
    }

    fn call_blocking(
        &self,
        method: &'static str,
        path: &str,
        body: Option<&str>,
        tries: u32,
    ) -> Result<Answer, ExecutorError> {
        let url = format!("{}{path}", self.base);
        if let (Some(var), None) = (&self.token_env, &self.token) {
            return Err(ExecutorError::Misconfigured {
                key: format!("runner.ray.token_env ({var})"),
                problem: format!(
                    "the environment variable {var} holding the Ray cluster's token is not set \
                     or empty (nothing was sent to {})",
                    self.base
                ),
            });
        }
        let mut pause = Duration::from_millis(200);
        let mut last = String::new();
        for attempt in 1..=tries {
            match self.once(method, &url, body) {
                Ok(a) if matches!(a.status, 502..=504) => {
                    last = format!("HTTP {}: {}", a.status, first_line(&a.body));
                }
                Ok(a) if matches!(a.status, 401 | 403) => {
                    return Err(self.unauthorized(a.status, &a.body));
                }
                Ok(a) => return Ok(a),
                Err(e) => last = e,
            }
            tracing::debug!(url, attempt, error = %last, "Ray dashboard did not answer");
            if attempt < tries {
                std::thread::sleep(pause);
                pause *= 2;
            }
        }
        Err(ExecutorError::SchedulerUnavailable {
            command: format!("{method} {url} ({})", self.address_key),
            tries,
            message: last,
        })
    }

    fn once(&self, method: &str, url: &str, body: Option<&str>) -> Result<Answer, String> {
        let auth = self.token.as_ref().map(|t| format!("Bearer {t}"));
        let result = match (method, body) {
            ("POST", Some(b)) => {
                let mut r = self
                    .agent
                    .post(url)
                    .header("Content-Type", "application/json");
                if let Some(a) = &auth {
                    r = r.header("Authorization", a);
                }
                r.send(b)
            }
            ("POST", None) => {
                let mut r = self.agent.post(url);
                if let Some(a) = &auth {
                    r = r.header("Authorization", a);
                }
                r.send_empty()
            }
            _ => {
                let mut r = self.agent.get(url);
                if let Some(a) = &auth {
                    r = r.header("Authorization", a);
                }
                r.call()
            }
        };
        let resp = result.map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let body = resp
            .into_body()
            .with_config()
            .limit(MAX_ANSWER)
            .read_to_string()
            .map_err(|e| format!("reading the answer: {e}"))?;
        Ok(Answer { status, body })
    }

    fn unauthorized(&self, status: u16, body: &str) -> ExecutorError {
        let key = match &self.token_env {
            Some(v) => format!(
                "runner.ray.token_env (the token in ${v} was sent and refused: is it the \
                 cluster's current token?)"
            ),
            None => "runner.ray.token_env (no token was sent: name the variable holding the \
                     cluster's token)"
                .to_string(),
        };
        ExecutorError::Misconfigured {
            key,
            problem: format!(
                "the Ray dashboard at {} answered HTTP {status} ({})",
                self.base,
                first_line(body)
            ),
        }
    }

    fn parse<T: for<'de> Deserialize<'de>>(
        &self,
        what: &str,
        a: &Answer,
    ) -> Result<T, ExecutorError> {
        serde_json::from_str(&a.body).map_err(|e| ExecutorError::Parse {
            command: format!("{what} at {}", self.base),
            detail: format!("expected the JSON of Ray's Jobs API: {e}"),
            output: a.body.chars().take(2000).collect(),
        })
    }

    fn failed(&self, what: &str, a: &Answer) -> ExecutorError {
        ExecutorError::CommandFailed {
            command: format!("{what} at {}", self.base),
            exit_code: Some(i32::from(a.status)),
            stderr: a.body.chars().take(4000).collect(),
        }
    }

    /// `POST /api/jobs/`, tried once (a second try of a POST that reached Ray would find its
    /// own id taken: the caller looks the job up instead): `Ok(Ok(()))` accepted,
    /// `Ok(Err(message))` refused by Ray (an id already taken says `already exists`), `Err`
    /// when the call itself failed.
    pub(super) async fn submit(&self, body: &str) -> Result<Result<(), String>, ExecutorError> {
        let a = self
            .call_tries("POST", "/api/jobs/".into(), Some(body.to_string()), 1)
            .await?;
        if (200..300).contains(&a.status) {
            Ok(Ok(()))
        } else {
            Ok(Err(format!("HTTP {}: {}", a.status, last_line(&a.body))))
        }
    }

    /// `GET /api/jobs/`: every job the cluster knows.
    pub(super) async fn list(&self) -> Result<Vec<JobInfo>, ExecutorError> {
        let a = self.call("GET", "/api/jobs/".into(), None).await?;
        if a.status != 200 {
            return Err(self.failed("GET /api/jobs/", &a));
        }
        self.parse("GET /api/jobs/", &a)
    }

    /// `GET /api/jobs/{id}`: `None` for an id the cluster does not know (404).
    pub(super) async fn get(&self, id: &str) -> Result<Option<JobInfo>, ExecutorError> {
        let what = format!("GET /api/jobs/{id}");
        let a = self.call("GET", format!("/api/jobs/{id}"), None).await?;
        match a.status {
            200 => self.parse(&what, &a).map(Some),
            404 => Ok(None),
            _ => Err(self.failed(&what, &a)),
        }
    }

    /// `POST /api/jobs/{id}/stop`: `false` for an unknown id.
    pub(super) async fn stop(&self, id: &str) -> Result<bool, ExecutorError> {
        let what = format!("POST /api/jobs/{id}/stop");
        let a = self
            .call("POST", format!("/api/jobs/{id}/stop"), None)
            .await?;
        match a.status {
            200 => Ok(true),
            404 => Ok(false),
            _ => Err(self.failed(&what, &a)),
        }
    }

    /// `GET /api/jobs/{id}/logs`.
    pub(super) async fn logs(&self, id: &str) -> Result<String, ExecutorError> {
        let what = format!("GET /api/jobs/{id}/logs");
        let a = self
            .call("GET", format!("/api/jobs/{id}/logs"), None)
            .await?;
        if a.status != 200 {
            return Err(self.failed(&what, &a));
        }
        Ok(self.parse::<LogsAnswer>(&what, &a)?.logs)
    }

    /// `GET /api/version`: the Ray version.
    pub(super) async fn version(&self) -> Result<String, ExecutorError> {
        let a = self.call("GET", "/api/version".into(), None).await?;
        if a.status != 200 {
            return Err(self.failed("GET /api/version", &a));
        }
        let v: serde_json::Value = self.parse("GET /api/version", &a)?;
        Ok(v.get("ray_version")
            .and_then(|v| v.as_str())
            .unwrap_or("unknown")
            .to_string())
    }

    /// `GET /api/v0/nodes`: the nodes alive.
    pub(super) async fn nodes(&self) -> Result<Vec<NodeInfo>, ExecutorError> {
        let a = self.call("GET", "/api/v0/nodes".into(), None).await?;
        if a.status != 200 {
            return Err(self.failed("GET /api/v0/nodes", &a));
        }
        let v: serde_json::Value = self.parse("GET /api/v0/nodes", &a)?;
        let list = v
            .pointer("/data/result/result")
            .cloned()
            .unwrap_or(serde_json::Value::Null);
        let nodes: Vec<NodeInfo> =
            serde_json::from_value(list).map_err(|e| ExecutorError::Parse {
                command: format!("GET /api/v0/nodes at {}", self.base),
                detail: format!("expected data.result.result, a list of nodes: {e}"),
                output: a.body.chars().take(2000).collect(),
            })?;
        Ok(nodes
            .into_iter()
            .filter(|n| n.state.as_deref().is_none_or(|s| s == "ALIVE"))
            .collect())
    }
}

fn first_line(s: &str) -> &str {
    s.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("")
}

/// The last line with text (a Python traceback ends with the error, then a lone `.`).
fn last_line(s: &str) -> &str {
    s.lines()
        .map(str::trim)
        .rfind(|l| l.chars().any(char::is_alphanumeric))
        .unwrap_or("")
}
