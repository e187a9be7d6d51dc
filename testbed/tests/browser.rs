//! The headless-Chromium harness (testbed::browser) against pages served by
//! testbed::http: reading and clicking, screenshots, axe-core with and
//! without a strict Content-Security-Policy, and the bytes a page costs.

use std::time::Duration;

use k8s4r_testbed::browser::{screenshot_dir, Browser};
use k8s4r_testbed::http::{serve, Reply};
use serde_json::json;

/// What the dashboard will send: scripts only from its own origin.
const STRICT_CSP: &str = "default-src 'self'; script-src 'self'";

const WAIT: Duration = Duration::from_secs(10);

/// A page whose button, wired by a same-origin script, changes a heading;
/// an inline script would change it too, where a policy allows it.
const PAGE: &str = r#"<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>Robots</title><script src="/app.js" defer></script></head>
<body>
<main>
<h1 id="greeting">Hello</h1>
<p id="inline">inline scripts did not run</p>
<script>document.getElementById('inline').textContent = 'inline scripts ran';</script>
<label for="name">Name</label> <input id="name" name="robot-name" value="">
<button id="go" type="button" data-kind="primary">Go</button>
</main>
</body>
</html>
"#;

const APP_JS: &str = r#"document.getElementById('go').addEventListener('click', () => {
  const name = document.getElementById('name').value || 'nobody';
  document.getElementById('greeting').textContent = 'Clicked by ' + name;
});
"#;

/// Clean for axe's WCAG 2 A/AA rules.
const CLEAN: &str = r#"<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>Clean</title></head>
<body><main><h1>Fleet</h1><p>Three robots are online.</p></main></body>
</html>
"#;

/// An image without an alt text: axe's `image-alt`.
const NO_ALT: &str = r#"<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>No alt</title></head>
<body><main><h1>Fleet</h1><img src="/robot.png" width="10" height="10"></main></body>
</html>
"#;

/// The routes every test serves: each page plain and under [`STRICT_CSP`].
async fn site() -> String {
    let strict = |body: &str| Reply::html(body).with_header("content-security-policy", STRICT_CSP);
    serve(vec![
        ("/", strict(PAGE)),
        ("/lax", Reply::html(PAGE)),
        ("/app.js", Reply::javascript(APP_JS)),
        ("/clean", Reply::html(CLEAN)),
        ("/no-alt", Reply::html(NO_ALT)),
        ("/strict/clean", strict(CLEAN)),
        ("/strict/no-alt", strict(NO_ALT)),
    ])
    .await
}

#[tokio::test]
async fn reads_types_and_clicks() {
    let base = site().await;
    let browser = Browser::start().await;
    browser.goto(&format!("{base}/")).await;
    assert_eq!(browser.title().await, "Robots");
    assert_eq!(browser.current_url().await, format!("{base}/"));

    let greeting = browser.find("#greeting").await.expect("the heading");
    assert_eq!(greeting.text().await, "Hello");
    assert!(browser.find("#missing").await.is_none());
    assert_eq!(browser.find_all("main > *").await.len(), 6);

    let button = browser.wait_for("#go", WAIT).await;
    assert_eq!(button.attribute("data-kind").await.as_deref(), Some("primary"));
    assert_eq!(button.attribute("data-none").await, None);

    let input = browser.find("#name").await.expect("the input");
    input.send_keys("r2d2").await;
    let typed = browser
        .execute(
            "return arguments[0].value + '/' + arguments[1];",
            &[input.as_arg(), json!(7)],
        )
        .await;
    assert_eq!(typed, json!("r2d2/7"));

    button.click().await;
    let text = browser.wait_text("#greeting", "Clicked", WAIT).await;
    assert_eq!(text, "Clicked by r2d2");
}

#[tokio::test]
async fn wait_text_says_what_it_saw() {
    let base = site().await;
    let browser = Browser::start().await;
    browser.goto(&format!("{base}/")).await;
    let waited = tokio::spawn(async move {
        browser
            .wait_text("#greeting", "never", Duration::from_millis(300))
            .await
    })
    .await;
    let panic = waited.expect_err("wait_text panics when the text does not come");
    let message = panic.into_panic();
    let message = message
        .downcast_ref::<String>()
        .expect("a formatted panic message");
    assert!(message.contains("last seen: \"Hello\""), "{message}");
}

#[tokio::test]
async fn screenshots_are_png_files() {
    let base = site().await;
    let browser = Browser::start().await;
    browser.goto(&format!("{base}/clean")).await;
    let path = browser.screenshot("testbed browser/clean").await;
    assert_eq!(path, screenshot_dir().join("testbed_browser_clean.png"));
    let png = std::fs::read(&path).expect("the screenshot file");
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n"),
        "not a PNG: {}",
        path.display()
    );
    // 1280 wide by the viewport's height: the IHDR chunk's width.
    assert_eq!(u32::from_be_bytes(png[16..20].try_into().unwrap()), 1280);
}

#[tokio::test]
async fn axe_finds_an_image_without_alt_and_passes_a_clean_page() {
    let base = site().await;
    let browser = Browser::start().await;
    browser.goto(&format!("{base}/no-alt")).await;
    let violations = browser.axe_violations().await;
    assert_eq!(violations.len(), 1, "{violations:#?}");
    assert!(
        violations[0].starts_with("image-alt [critical]"),
        "{violations:#?}"
    );
    assert!(violations[0].contains("img"), "{violations:#?}");
    // A second run reuses the axe already in the page.
    assert_eq!(browser.axe_violations().await, violations);

    browser.goto(&format!("{base}/clean")).await;
    assert_eq!(browser.axe_violations().await, Vec::<String>::new());
}

#[tokio::test]
async fn axe_runs_under_a_strict_content_security_policy() {
    let base = site().await;
    let browser = Browser::start().await;
    // The policy holds: the page's inline script is blocked, its own runs.
    browser.goto(&format!("{base}/")).await;
    assert_eq!(
        browser.find("#inline").await.expect("the paragraph").text().await,
        "inline scripts did not run"
    );
    browser.goto(&format!("{base}/lax")).await;
    assert_eq!(
        browser.find("#inline").await.expect("the paragraph").text().await,
        "inline scripts ran"
    );

    browser.goto(&format!("{base}/strict/no-alt")).await;
    let violations = browser.axe_violations().await;
    assert_eq!(violations.len(), 1, "{violations:#?}");
    assert!(violations[0].starts_with("image-alt "), "{violations:#?}");
    browser.goto(&format!("{base}/strict/clean")).await;
    assert_eq!(browser.axe_violations().await, Vec::<String>::new());
}

#[tokio::test]
async fn page_bytes_count_the_document_and_its_scripts() {
    let base = site().await;
    let browser = Browser::start().await;
    browser.goto(&format!("{base}/")).await;
    browser.wait_for("#go", WAIT).await;
    let bytes = browser.page_bytes().await;
    let bodies = (PAGE.len() + APP_JS.len()) as u64;
    // Each response's body plus the 300 bytes the Resource Timing spec
    // counts for its headers: the page, its script and the favicon's 404.
    assert!(
        bodies <= bytes && bytes <= bodies + 2 * 1024,
        "{bytes} bytes transferred for {bodies} bytes of bodies"
    );
}
