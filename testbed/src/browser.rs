//! Headless Chromium for the dashboard's end-to-end tests: a minimal W3C
//! WebDriver client that talks plain HTTP to a chromedriver of its own on
//! a free loopback port. A test opens pages, finds elements by CSS
//! selector, reads and clicks them, waits for text, takes screenshots,
//! checks a page with axe-core and measures what the page transferred.
//!
//! Chromium, chromedriver and axe-core come from `scripts/setup.sh`
//! (Debian's `chromium` and `chromium-driver`, npm's `axe-core` pinned in
//! `tests/browser/package-lock.json`).
//!
//! The methods panic with what went wrong instead of returning errors: they
//! are for tests, where a failed browser command is a failed test.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use reqwest::Method;
use serde_json::{json, Value};

/// The Chromium binary the sessions run (Debian's `chromium`).
const CHROMIUM: &str = "/usr/bin/chromium";

/// The key of a web element's reference in WebDriver JSON.
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";

/// How long chromedriver may take to answer `/status` after it starts.
const DRIVER_START: Duration = Duration::from_secs(30);

/// The most one WebDriver command may take (a page load, an axe run).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(90);

/// The pause between two polls of [`Browser::wait_for`] and
/// [`Browser::wait_text`]; it only paces the loop.
const POLL: Duration = Duration::from_millis(50);

/// Where axe-core is once `scripts/setup.sh` ran `npm ci` in `tests/browser`.
const AXE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/browser/node_modules/axe-core/axe.min.js"
);

/// A headless Chromium session driven through a chromedriver of its own.
/// Dropping it ends the session and kills chromedriver and the browser.
pub struct Browser {
    session: Session,
    // Dropped after `session` is deleted in `Drop for Browser`.
    driver: Driver,
}

/// An element of the current page, found by [`Browser::find`] or
/// [`Browser::find_all`]. It goes stale when the page replaces it.
#[derive(Clone)]
pub struct Element {
    session: Session,
    id: String,
}

/// What a WebDriver command answered instead of a value: the W3C error
/// code (`no such element`, `stale element reference`...) and message, or
/// `transport` when chromedriver could not be reached.
#[derive(Debug)]
struct WebDriverError {
    error: String,
    message: String,
}

impl fmt::Display for WebDriverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.error, self.message)
    }
}

type Result<T> = std::result::Result<T, WebDriverError>;

/// One WebDriver session: the HTTP client and `http://127.0.0.1:PORT/session/ID`.
#[derive(Clone)]
struct Session {
    http: reqwest::Client,
    url: String,
}

impl Session {
    /// Sends a command (`path` relative to the session) and returns its
    /// `value`. A POST without a body sends `{}`, as WebDriver wants.
    async fn call(&self, method: Method, path: &str, body: Option<Value>) -> Result<Value> {
        command(&self.http, method, &format!("{}{path}", self.url), body).await
    }

    /// [`Session::call`], panicking with `what` and the error.
    async fn must(&self, method: Method, path: &str, body: Option<Value>, what: &str) -> Value {
        match self.call(method, path, body).await {
            Ok(value) => value,
            Err(e) => panic!("browser: {what}: {e}"),
        }
    }
}

/// Sends a WebDriver command to `url`; returns the answer's `value`, or
/// its error when the status is not a success.
async fn command(http: &reqwest::Client, method: Method, url: &str, body: Option<Value>) -> Result<Value> {
    let transport = |e: reqwest::Error| WebDriverError {
        error: "transport".into(),
        message: e.to_string(),
    };
    let mut request = http.request(method.clone(), url);
    if method == Method::POST {
        request = request.json(&body.unwrap_or_else(|| json!({})));
    }
    let response = request.send().await.map_err(transport)?;
    let status = response.status();
    let answer: Value = response.json().await.map_err(transport)?;
    let value = answer.get("value").cloned().unwrap_or(Value::Null);
    if status.is_success() {
        return Ok(value);
    }
    Err(WebDriverError {
        error: value["error"].as_str().unwrap_or("unknown error").to_owned(),
        message: value["message"]
            .as_str()
            .unwrap_or(&format!("HTTP {status}"))
            .to_owned(),
    })
}

impl Browser {
    /// Starts chromedriver on a free port and a headless Chromium session
    /// in a fresh profile, 1280×900. Panics, saying to run
    /// `scripts/setup.sh`, when chromedriver or Chromium is not installed.
    pub async fn start() -> Browser {
        let driver = Driver::spawn();
        let http = client();
        let base = format!("http://127.0.0.1:{}", driver.port);
        driver.wait_ready(&http, &base).await;
        let created = command(
            &http,
            Method::POST,
            &format!("{base}/session"),
            Some(capabilities(&driver)),
        )
        .await
        .unwrap_or_else(|e| panic!("browser: create a session: {e}\n{}", driver.log()));
        let id = created["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("browser: a session without an id: {created}"));
        let session = Session {
            http,
            url: format!("{base}/session/{id}"),
        };
        Browser { session, driver }
    }

    /// Opens `url` and returns once the page has loaded (its `load` event).
    pub async fn goto(&self, url: &str) {
        let what = format!("open {url}");
        self.session
            .must(Method::POST, "/url", Some(json!({ "url": url })), &what)
            .await;
    }

    /// The URL of the current page.
    pub async fn current_url(&self) -> String {
        let url = self.session.must(Method::GET, "/url", None, "read the URL").await;
        url.as_str().unwrap_or_default().to_owned()
    }

    /// The title of the current page.
    pub async fn title(&self) -> String {
        let title = self
            .session
            .must(Method::GET, "/title", None, "read the title")
            .await;
        title.as_str().unwrap_or_default().to_owned()
    }

    /// Runs `script` as the body of a function in the page, with `args` as
    /// its `arguments` (an [`Element::as_arg`] becomes the element), and
    /// returns what it returns. WebDriver runs it outside the page's
    /// Content-Security-Policy.
    pub async fn execute(&self, script: &str, args: &[Value]) -> Value {
        let body = json!({ "script": script, "args": args });
        let what = format!("run the script {}", excerpt(script));
        self.session
            .must(Method::POST, "/execute/sync", Some(body), &what)
            .await
    }

    /// Like [`Browser::execute`], but the script ends by calling its last
    /// argument (a callback the arguments get after `args`) with the result.
    pub async fn execute_async(&self, script: &str, args: &[Value]) -> Value {
        let body = json!({ "script": script, "args": args });
        let what = format!("run the async script {}", excerpt(script));
        self.session
            .must(Method::POST, "/execute/async", Some(body), &what)
            .await
    }

    /// Every element that matches the CSS selector `css`, in document order.
    pub async fn find_all(&self, css: &str) -> Vec<Element> {
        match self.try_find_all(css).await {
            Ok(elements) => elements,
            Err(e) => panic!("browser: find {css:?}: {e}"),
        }
    }

    /// The first element that matches `css`, if any.
    pub async fn find(&self, css: &str) -> Option<Element> {
        self.find_all(css).await.into_iter().next()
    }

    /// Waits up to `timeout` for an element matching `css` and returns the
    /// first; panics when there is none by then.
    pub async fn wait_for(&self, css: &str, timeout: Duration) -> Element {
        let found = crate::eventually_or(timeout, || async {
            self.try_find_all(css).await.ok()?.into_iter().next()
        })
        .await;
        match found {
            Some(element) => element,
            None => panic!(
                "browser: no element matches {css:?} after {timeout:?} on {}",
                self.current_url().await
            ),
        }
    }

    /// Waits up to `timeout` until the text of the first element matching
    /// `css` contains `needle`, and returns that text; panics with what the
    /// element said last (or that there was none). An element the page
    /// replaces meanwhile is looked up again.
    pub async fn wait_text(&self, css: &str, needle: &str, timeout: Duration) -> String {
        let until = Instant::now() + timeout;
        let mut seen = None;
        loop {
            if let Ok(Some(text)) = self.try_text_of(css).await {
                if text.contains(needle) {
                    return text;
                }
                seen = Some(text);
            }
            if Instant::now() >= until {
                let seen = seen.map_or_else(|| "no such element".to_owned(), |t| format!("{t:?}"));
                panic!("browser: {css:?} did not say {needle:?} within {timeout:?}; last seen: {seen}");
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Saves a PNG of the viewport as `<name>.png` in [`screenshot_dir`]
    /// and returns its path. Characters other than letters, digits, `-`
    /// and `_` in `name` become `_`.
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        let encoded = self
            .session
            .must(Method::GET, "/screenshot", None, "take a screenshot")
            .await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(encoded.as_str().unwrap_or_default())
            .expect("browser: a screenshot that is not base64");
        let dir = screenshot_dir();
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        let path = dir.join(format!("{}.png", file_name(name)));
        std::fs::write(&path, png).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        path
    }

    /// Runs axe-core's WCAG 2 A and AA rules on the current page; one line
    /// per violation: its rule id, impact, what it asks for and the first
    /// elements that break it. Empty when the page passes. Panics, saying
    /// to run `scripts/setup.sh`, when axe-core is not installed.
    pub async fn axe_violations(&self) -> Vec<String> {
        self.inject_axe().await;
        let result = self.execute_async(AXE_RUN, &[]).await;
        if let Some(error) = result.get("error") {
            panic!("browser: axe.run failed: {error}");
        }
        let violations = result.as_array().cloned().unwrap_or_default();
        violations.iter().map(violation_line).collect()
    }

    /// The bytes the current page transferred: its document plus every
    /// resource it fetched so far, as the Resource Timing API counts them
    /// (`transferSize`). Chromium counts each response's body as sent
    /// plus a flat 300 bytes for its headers, as the specification says,
    /// and 0 for what came from the cache; the browser's own favicon
    /// request is a resource too, once it was made.
    pub async fn page_bytes(&self) -> u64 {
        let bytes = self.execute(PAGE_BYTES, &[]).await;
        bytes
            .as_f64()
            .unwrap_or_else(|| panic!("browser: page bytes that are not a number: {bytes}")) as u64
    }

    async fn try_find_all(&self, css: &str) -> Result<Vec<Element>> {
        let body = json!({ "using": "css selector", "value": css });
        let found = self.session.call(Method::POST, "/elements", Some(body)).await?;
        let elements = found.as_array().cloned().unwrap_or_default();
        Ok(elements
            .iter()
            .filter_map(|e| e[ELEMENT_KEY].as_str())
            .map(|id| Element {
                session: self.session.clone(),
                id: id.to_owned(),
            })
            .collect())
    }

    /// The text of the first element matching `css`, None when there is
    /// none; an error when it went stale between finding and reading.
    async fn try_text_of(&self, css: &str) -> Result<Option<String>> {
        match self.try_find_all(css).await?.into_iter().next() {
            Some(element) => element.try_text().await.map(Some),
            None => Ok(None),
        }
    }

    /// Puts axe-core into the page unless it is there already.
    async fn inject_axe(&self) {
        let present = self.execute("return typeof window.axe === 'object';", &[]).await;
        if present == json!(true) {
            return;
        }
        let source = std::fs::read_to_string(AXE)
            .unwrap_or_else(|e| panic!("axe-core is not installed ({AXE}: {e}): run scripts/setup.sh"));
        let loaded = self
            .execute(&format!("{source}\n;return typeof window.axe;"), &[])
            .await;
        assert_eq!(
            loaded,
            json!("object"),
            "browser: axe-core did not load into the page"
        );
    }
}

impl Drop for Browser {
    /// Ends the session (best effort, so that Chromium quits cleanly);
    /// then `Driver`'s drop kills whatever is left.
    fn drop(&mut self) {
        if let Some((_, id)) = self.session.url.split_once("/session/") {
            delete_session(self.driver.port, id);
        }
    }
}

impl Element {
    /// The element's rendered text, as a user sees it.
    pub async fn text(&self) -> String {
        match self.try_text().await {
            Ok(text) => text,
            Err(e) => panic!("browser: read an element's text: {e}"),
        }
    }

    /// Clicks the element's center, scrolling it into view first.
    pub async fn click(&self) {
        self.must(Method::POST, "/click", None, "click an element").await;
    }

    /// The element's attribute `name`; None when it has none.
    pub async fn attribute(&self, name: &str) -> Option<String> {
        let what = format!("read an element's attribute {name:?}");
        let value = self
            .must(Method::GET, &format!("/attribute/{name}"), None, &what)
            .await;
        value.as_str().map(str::to_owned)
    }

    /// Types `text` into the element (an input, a textarea), after what it
    /// holds.
    pub async fn send_keys(&self, text: &str) {
        let body = json!({ "text": text });
        self.must(Method::POST, "/value", Some(body), "type into an element")
            .await;
    }

    /// The element as an argument of [`Browser::execute`].
    pub fn as_arg(&self) -> Value {
        json!({ ELEMENT_KEY: self.id })
    }

    async fn try_text(&self) -> Result<String> {
        let path = format!("/element/{}/text", self.id);
        let text = self.session.call(Method::GET, &path, None).await?;
        Ok(text.as_str().unwrap_or_default().to_owned())
    }

    async fn must(&self, method: Method, path: &str, body: Option<Value>, what: &str) -> Value {
        let path = format!("/element/{}{path}", self.id);
        self.session.must(method, &path, body, what).await
    }
}

/// Where [`Browser::screenshot`] saves: `$K8S4R_SCREENSHOT_DIR`, else
/// `screenshots/` in the Cargo target directory (found from
/// `$CARGO_TARGET_TMPDIR` when set, else from the test binary's place in
/// `<target>/<profile>/deps/`), else `k8s4r-screenshots` in the system's
/// temporary directory.
pub fn screenshot_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("K8S4R_SCREENSHOT_DIR") {
        return PathBuf::from(dir);
    }
    if let Some(tmp) = std::env::var_os("CARGO_TARGET_TMPDIR") {
        if let Some(target) = Path::new(&tmp).parent() {
            return target.join("screenshots");
        }
    }
    if let Some(target) = target_dir_of_exe() {
        return target.join("screenshots");
    }
    std::env::temp_dir().join("k8s4r-screenshots")
}

/// `<target>` when this program is a test binary in `<target>/<profile>/deps/`.
fn target_dir_of_exe() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let deps = exe.parent()?;
    if deps.file_name()? != "deps" {
        return None;
    }
    Some(deps.parent()?.parent()?.to_path_buf())
}

/// `name` with anything but letters, digits, `-` and `_` made `_`.
fn file_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The start of a script, for messages.
fn excerpt(script: &str) -> String {
    let line = script.trim().lines().next().unwrap_or_default();
    let short: String = line.chars().take(80).collect();
    format!("{short:?}")
}

/// An HTTP client for chromedriver on loopback: no proxy, and a rustls
/// configuration of its own (ring, no roots) because the workspace's reqwest
/// has no crypto provider to build one; plain HTTP never uses it.
fn client() -> reqwest::Client {
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports the default TLS versions")
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .no_proxy()
        .timeout(COMMAND_TIMEOUT)
        .build()
        .expect("an HTTP client for chromedriver")
}

/// The session's capabilities: headless Chromium in the driver's profile
/// directory, failing a page load or a script after 30 s.
fn capabilities(driver: &Driver) -> Value {
    let profile = driver.dir.path().join("profile");
    let args = [
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1280,900",
    ]
    .map(str::to_owned)
    .into_iter()
    .chain([format!("--user-data-dir={}", profile.display())])
    .collect::<Vec<_>>();
    json!({
        "capabilities": {
            "alwaysMatch": {
                "browserName": "chrome",
                "pageLoadStrategy": "normal",
                "timeouts": { "pageLoad": 30_000, "script": 30_000, "implicit": 0 },
                "goog:chromeOptions": { "binary": CHROMIUM, "args": args },
            }
        }
    })
}

/// Runs axe on the document and hands its violations to the WebDriver
/// callback, or `{error}` when axe fails.
const AXE_RUN: &str = r#"
const done = arguments[arguments.length - 1];
axe.run(document, { runOnly: ['wcag2a', 'wcag2aa'], resultTypes: ['violations'] })
  .then(r => done(r.violations.map(v => ({
    id: v.id, impact: v.impact, help: v.help, targets: v.nodes.map(n => n.target),
  }))))
  .catch(e => done({ error: String(e && e.stack || e) }));
"#;

/// The current page's document plus resources, in transferred bytes.
const PAGE_BYTES: &str = r#"
const size = e => e.transferSize || 0;
const navigation = performance.getEntriesByType('navigation').map(size).reduce((a, b) => a + b, 0);
const resources = performance.getEntriesByType('resource').map(size).reduce((a, b) => a + b, 0);
return navigation + resources;
"#;

/// One violation as a line: `id [impact] help: target, target (+N more)`.
fn violation_line(v: &Value) -> String {
    let targets: Vec<String> = v["targets"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|t| {
            // A target is a list of selectors: one per frame or shadow root.
            let parts: Vec<&str> = t
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            parts.join(" >> ")
        })
        .collect();
    let shown = targets.iter().take(3).cloned().collect::<Vec<_>>().join(", ");
    let more = match targets.len() {
        n if n > 3 => format!(" (+{} more)", n - 3),
        _ => String::new(),
    };
    format!(
        "{} [{}] {}: {shown}{more}",
        v["id"].as_str().unwrap_or("?"),
        v["impact"].as_str().unwrap_or("?"),
        v["help"].as_str().unwrap_or("?"),
    )
}

/// chromedriver, in a process group of its own with the Chromium it starts,
/// and the directory that holds its log and the browser's profile. Dropping
/// it kills the whole group.
struct Driver {
    port: u16,
    child: Child,
    dir: tempfile::TempDir,
}

impl Driver {
    /// Starts chromedriver on a free port; panics, saying to run
    /// `scripts/setup.sh`, when it or Chromium is missing.
    fn spawn() -> Driver {
        let binary = chromedriver_binary();
        assert!(
            Path::new(CHROMIUM).exists(),
            "{CHROMIUM} is not installed: run scripts/setup.sh (it installs Debian's chromium)"
        );
        let dir = tempfile::tempdir().expect("a temporary directory for the browser");
        let port = crate::free_port();
        let log =
            std::fs::File::create(dir.path().join("chromedriver.out")).expect("chromedriver's output file");
        let err = log.try_clone().expect("chromedriver's output file, again");
        use std::os::unix::process::CommandExt;
        let child = Command::new(&binary)
            .arg(format!("--port={port}"))
            .arg(format!(
                "--log-path={}",
                dir.path().join("chromedriver.log").display()
            ))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", binary.display()));
        Driver { port, child, dir }
    }

    /// Polls `/status` until chromedriver says it is ready; panics with its
    /// log after [`DRIVER_START`].
    async fn wait_ready(&self, http: &reqwest::Client, base: &str) {
        let url = format!("{base}/status");
        let ready = crate::eventually_or(DRIVER_START, || async {
            let status = command(http, Method::GET, &url, None).await.ok()?;
            (status["ready"] == json!(true)).then_some(())
        })
        .await;
        if ready.is_none() {
            panic!(
                "chromedriver did not get ready on port {} within {DRIVER_START:?}\n{}",
                self.port,
                self.log()
            );
        }
    }

    /// What chromedriver printed and logged, for failures.
    fn log(&self) -> String {
        let read = |name: &str| std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
        format!(
            "chromedriver output:\n{}\nchromedriver log:\n{}",
            read("chromedriver.out"),
            read("chromedriver.log")
        )
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // The group's id is chromedriver's pid (`process_group(0)`).
        let group = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

/// The chromedriver on PATH (or in /usr/bin); panics with what to do when
/// there is none.
fn chromedriver_binary() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin")])
        .map(|dir| dir.join("chromedriver"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("chromedriver is not installed: run scripts/setup.sh (it installs chromium-driver)")
        })
}

/// Ends session `id` with a blocking `DELETE`, for `Drop`: Chromium quits
/// cleanly. chromedriver answers once the browser is gone, and may keep the
/// connection open, so this reads up to the end of the answer's head.
/// Errors are ignored (the process group is killed next anyway).
fn delete_session(port: u16, id: &str) {
    use std::io::{Read, Write};
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let Ok(mut stream) = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
        return;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let request = format!(
        "DELETE /session/{id} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    );
    if stream.write_all(request.as_bytes()).is_err() {
        return;
    }
    let mut answer = Vec::new();
    let mut buf = [0u8; 1024];
    while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
        }
    }
}
