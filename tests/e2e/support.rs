//! `spawn_app()` for the real binary, and a small API client.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

use hooklane_testkit::farm::Farm;
use serde_json::{json, Value};
use tokio::process::{Child, Command};

pub const ADMIN_TOKEN: &str = "test-admin-token-0123456789abcdef";

/// A scratch directory removed on drop.
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "hooklane-e2e-{name}-{}-{}",
            std::process::id(),
            uuid_like()
        ));
        std::fs::create_dir_all(&dir).expect("create scratch dir");
        Self(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn uuid_like() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{nanos:x}")
}

/// A running `hooklane serve` on port 0 with its own database.
pub struct Server {
    child: Child,
    pub base: String,
    pub database: PathBuf,
    pub log: PathBuf,
    /// What follows `hooklane serve` on the command line.
    args: Vec<String>,
    env: Vec<(String, String)>,
    /// The open-files limit (soft and hard) it runs under, if the test sets one.
    open_files: Option<u64>,
    http: reqwest::Client,
    /// What the last start printed before it listened.
    startup: Vec<String>,
}

impl Server {
    /// Starts `serve` with the test defaults (loopback allowed) plus `env`.
    pub async fn start(scratch: &Scratch, env: &[(&str, &str)]) -> Self {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Self::start_with(
            scratch.path().join("hooklane.db"),
            scratch.path().join("serve.log"),
            env,
        )
        .await
    }

    async fn start_with(database: PathBuf, log: PathBuf, env: Vec<(String, String)>) -> Self {
        Self::spawn_with(database, log, (Vec::new(), env), None).await
    }

    /// As [`Server::start`], under an open-files limit of `open_files`, soft and hard (so
    /// that `serve` cannot raise it), as a container or Lambda would set it.
    pub async fn start_with_open_files(
        scratch: &Scratch,
        env: &[(&str, &str)],
        open_files: u64,
    ) -> Self {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Self::spawn_with(
            scratch.path().join("hooklane.db"),
            scratch.path().join("serve.log"),
            (Vec::new(), env),
            Some(open_files),
        )
        .await
    }

    /// Starts `serve --backend aws` plus `args` against the AWS emulator of the tests
    /// (`AWS_*` passed through), with the test defaults (the secrets key among them) plus
    /// `env`. Its AWS requests are
    /// recorded in the scratch directory, for `iam::assert_allowed`.
    pub async fn start_aws(scratch: &Scratch, args: &[&str], env: &[(String, String)]) -> Self {
        hooklane_testkit::testing::require_emulator();
        let mut args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        args.splice(0..0, ["--backend".to_owned(), "aws".to_owned()]);
        let mut all: Vec<(String, String)> = std::env::vars()
            .filter(|(k, _)| k.starts_with("AWS_"))
            .collect();
        let record = scratch.path().join("aws-requests.jsonl");
        all.push((
            "HOOKLANE_AWS_REQUEST_LOG".to_owned(),
            record.display().to_string(),
        ));
        // The operator's key of endpoint secrets (a stack reads it from its SSM parameter):
        // the AWS shape has none unless given one. The tests' AWS shapes in-process use the
        // same key.
        all.push((
            "HOOKLANE_SECRETS_KEY".to_owned(),
            hooklane_testkit::testing::TEST_SECRETS_KEY
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect(),
        ));
        all.extend(env.iter().cloned());
        Self::spawn_with(
            scratch.path().join("unused.db"),
            scratch.path().join("serve.log"),
            (args, all),
            None,
        )
        .await
    }

    /// Starts `serve` with `args` and `env` (`command`), under `open_files` if given.
    async fn spawn_with(
        database: PathBuf,
        log: PathBuf,
        command: (Vec<String>, Vec<(String, String)>),
        open_files: Option<u64>,
    ) -> Self {
        let (args, env) = command;
        let (child, base, startup) = spawn(&database, &log, &args, &env, open_files)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        Self {
            child,
            base,
            startup,
            database,
            log,
            args,
            env,
            open_files,
            http: reqwest::Client::new(),
        }
    }

    /// `kill -9`, nothing flushed, nothing cleaned up.
    pub async fn kill9(&mut self) {
        let _ = self.child.start_kill();
        let _ = self.child.wait().await;
    }

    /// SIGTERM, as a service manager stops it; waits for the process to exit.
    pub async fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = self.pid().expect("serve is running");
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(sent.success(), "kill -TERM {pid}: {sent}");
        self.child.wait().await.expect("wait for serve")
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Peak resident memory of the server process so far, in KiB (Linux `VmHWM`).
    pub fn peak_rss_kib(&self) -> Option<u64> {
        self.proc_status("VmHWM")?
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()
    }

    /// A field of the server process's `/proc/<pid>/status`, as written there.
    pub fn proc_status(&self, field: &str) -> Option<String> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()?)).ok()?;
        status
            .lines()
            .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
            .map(|value| value.trim().to_owned())
    }

    /// Stops the server and starts it again with some settings changed.
    pub async fn restart_with(&mut self, changes: &[(&str, &str)]) {
        self.kill9().await;
        for (key, value) in changes {
            self.env.retain(|(k, _)| k != key);
            self.env.push((key.to_string(), value.to_string()));
        }
        self.restart().await;
    }

    /// Starts a new process on the same database and settings.
    pub async fn restart(&mut self) {
        let (child, base, startup) = spawn(
            &self.database,
            &self.log,
            &self.args,
            &self.env,
            self.open_files,
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        self.child = child;
        self.base = base;
        self.startup = startup;
    }

    /// The lines the last start printed on stdout before it listened.
    pub fn startup_output(&self) -> &[String] {
        &self.startup
    }

    /// The last value `serve` was given for a variable.
    pub fn env_var(&self, name: &str) -> Option<&str> {
        self.env
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The value that follows `flag` on the command line.
    pub fn arg_after(&self, flag: &str) -> Option<&str> {
        let at = self.args.iter().position(|a| a == flag)?;
        self.args.get(at + 1).map(String::as_str)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub async fn request(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        self.request_as(ADMIN_TOKEN, method, path, body).await
    }

    /// [`Server::request`] with another credential than the admin token.
    pub async fn request_as(
        &self,
        credential: &str,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(credential)
            .timeout(Duration::from_secs(30));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request
            .send()
            .await
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        let status = response.status().as_u16();
        let text = response.text().await.unwrap_or_default();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// POSTs `body` as JSON text exactly as given (escapes, number spellings), as the admin;
    /// the status and the answer's text.
    pub async fn post_text(&self, path: &str, body: String) -> (u16, String) {
        let response = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(ADMIN_TOKEN)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("post");
        let status = response.status().as_u16();
        (status, response.text().await.unwrap_or_default())
    }

    pub async fn raw_post(
        &self,
        path: &str,
        content_type: &str,
        body: &'static str,
    ) -> (u16, Value) {
        let response = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(ADMIN_TOKEN)
            .header("content-type", content_type)
            .body(body)
            .send()
            .await
            .expect("raw post");
        let status = response.status().as_u16();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        self.request(reqwest::Method::GET, path, None).await
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.request(reqwest::Method::POST, path, Some(body)).await
    }

    pub async fn create_account(&self, id: &str) {
        let (status, body) = self
            .post("/v1/accounts", json!({"id": id, "name": format!("Account {id}"), "owner_email": format!("owner@{id}.example")}))
            .await;
        assert_eq!(status, 201, "create account {id}: {body}");
    }

    /// Creates an endpoint; returns (id, secret).
    pub async fn create_endpoint(
        &self,
        account: &str,
        url: &str,
        extra: Value,
    ) -> (String, String) {
        let mut body = json!({"url": url});
        if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
            body.extend(extra.clone());
        }
        let (status, created) = self
            .post(&format!("/v1/accounts/{account}/endpoints"), body)
            .await;
        assert_eq!(status, 201, "create endpoint {url}: {created}");
        (
            created["id"].as_str().expect("endpoint id").to_owned(),
            created["secret"].as_str().expect("secret").to_owned(),
        )
    }

    /// Creates an endpoint of the account (no options) for each of the farm's `names`;
    /// returns their ids in that order.
    pub async fn farm_endpoints<const N: usize>(
        &self,
        account: &str,
        farm: &Farm,
        names: [&str; N],
    ) -> [String; N] {
        let mut ids = Vec::with_capacity(N);
        for name in names {
            let (id, _) = self
                .create_endpoint(account, &farm.url(name), json!({}))
                .await;
            ids.push(id);
        }
        ids.try_into().expect("one id per name")
    }

    pub async fn publish(&self, account: &str, event_type: &str, data: Value) -> Value {
        let (status, body) = self
            .post(
                &format!("/v1/accounts/{account}/events"),
                json!({"type": event_type, "data": data}),
            )
            .await;
        assert_eq!(status, 202, "publish: {body}");
        self.fanned_out(account, &body).await;
        body
    }

    /// Waits until every delivery a publish answered (`answer`, its event) exists: the
    /// call answers once the event is stored, and the fan-out writes them a moment later.
    pub async fn fanned_out(&self, account: &str, answer: &Value) {
        let ids: Vec<String> = answer["deliveries"]
            .as_array()
            .map(|listed| {
                listed
                    .iter()
                    .filter_map(|d| d["id"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        let start = Instant::now();
        for id in &ids {
            let path = format!("/v1/accounts/{account}/deliveries/{id}");
            while self.get(&path).await.0 != 200 {
                assert!(
                    start.elapsed() < Duration::from_secs(10),
                    "delivery {id} of {answer} not written within 10 s"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }

    /// Every delivery of the account, following cursors.
    pub async fn deliveries(&self, account: &str, filter: &str) -> Vec<Value> {
        let mut all = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut path = format!("/v1/accounts/{account}/deliveries?limit=500{filter}");
            if let Some(c) = &cursor {
                path.push_str(&format!("&cursor={c}"));
            }
            let (status, page) = self.get(&path).await;
            assert_eq!(status, 200, "{page}");
            all.extend(page["data"].as_array().cloned().unwrap_or_default());
            match page["next_cursor"].as_str() {
                Some(next) => cursor = Some(next.to_owned()),
                None => return all,
            }
        }
    }

    /// Whether `count` of the account's deliveries have failed within `timeout`.
    pub async fn failed_within(&self, timeout: Duration, account: &str, count: usize) -> bool {
        self.eventually(timeout, || async {
            self.deliveries(account, "&status=failed").await.len() == count
        })
        .await
    }

    /// Polls `probe` until it returns true or `timeout` passes.
    pub async fn eventually<F, Fut>(&self, timeout: Duration, mut probe: F) -> bool
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if probe().await {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        probe().await
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

async fn spawn(
    database: &Path,
    log: &Path,
    args: &[String],
    env: &[(String, String)],
    open_files: Option<u64>,
) -> Result<(Child, String, Vec<String>), String> {
    let log_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| format!("open log: {e}"))?;
    let mut command = match open_files {
        // util-linux's prlimit sets the limit and executes the binary in its place (the
        // tests forbid the unsafe `pre_exec`).
        Some(limit) => {
            let mut command = Command::new("prlimit");
            command
                .arg(format!("--nofile={limit}:{limit}"))
                .arg("--")
                .arg(env!("CARGO_BIN_EXE_hooklane"));
            command
        }
        None => Command::new(env!("CARGO_BIN_EXE_hooklane")),
    };
    command
        .arg("serve")
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("RUST_LOG", "info,hyper=warn,reqwest=warn")
        .env("NO_COLOR", "1")
        .env("HOOKLANE_LISTEN", "127.0.0.1:0")
        .env("HOOKLANE_DATABASE", database)
        .env("HOOKLANE_ADMIN_TOKEN", ADMIN_TOKEN)
        .env("HOOKLANE_ALLOW_CIDRS", "127.0.0.0/8")
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log_file))
        .kill_on_drop(true);
    for (key, value) in env {
        command.env(key, value);
    }
    let mut child = command
        .spawn()
        .map_err(|e| format!("spawn hooklane: {e}"))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let (base, startup) = hooklane_testkit::testing::serve_startup(stdout)
        .await
        .ok_or_else(|| {
            format!(
                "hooklane serve did not start; log:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            )
        })?;
    Ok((child, base, startup))
}

/// The Python interpreter of the test venv (with `standardwebhooks`), set up by scripts/test.
pub fn test_python() -> PathBuf {
    let python = std::env::var_os("HOOKLANE_TEST_PYTHON").map(PathBuf::from).unwrap_or_else(|| {
        panic!("HOOKLANE_TEST_PYTHON is not set: run the tests with scripts/test, which provisions the Python venv")
    });
    assert!(
        python.exists(),
        "HOOKLANE_TEST_PYTHON={} does not exist: run scripts/test",
        python.display()
    );
    python
}
