//! A real headless Chromium for the console's tests, driven over WebDriver
//! (W3C WebDriver, through `chromedriver`) with fantoccini: Debian's
//! `chromium` and `chromium-driver`, which `scripts/services.sh` installs.
//! The page's elements are found by their `data-testid`.

use std::{path::PathBuf, process::Stdio, time::Duration};

use anyhow::Context;
use fantoccini::{Client, ClientBuilder, Locator, elements::Element};
use serde_json::json;
use tokio::process::{Child, Command};

/// How long a test waits for an element or a text.
pub const WAIT: Duration = Duration::from_secs(20);

/// A Chromium session and the chromedriver serving it; both end when
/// dropped (also when the test fails).
pub struct Browser {
    /// The WebDriver session.
    pub client: Client,
    /// Where downloads land.
    pub downloads: tempfile::TempDir,
    _profile: tempfile::TempDir,
    _driver: Child,
}

/// The CSS selector of `data-testid` `id`.
pub fn testid(id: &str) -> String {
    format!("[data-testid=\"{id}\"]")
}

impl Browser {
    /// Starts chromedriver on a free loopback port and a headless Chromium
    /// session that accepts the test CA's certificates, with flags that keep
    /// it off the network (no background, component or sync traffic).
    ///
    /// # Errors
    /// chromedriver or Chromium missing (run `scripts/services.sh`), or the
    /// session not starting.
    pub async fn start() -> anyhow::Result<Self> {
        let port = crate::scenario::free_local_addr()?.port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context(
                "chromedriver not found: run scripts/services.sh (it installs chromium-driver)",
            )?;
        let profile = tempfile::tempdir()?;
        let downloads = tempfile::tempdir()?;
        let mut capabilities = serde_json::Map::new();
        capabilities.insert("browserName".into(), json!("chrome"));
        capabilities.insert("acceptInsecureCerts".into(), json!(true));
        capabilities.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": "/usr/bin/chromium",
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--disable-quic", "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--window-size=1400,1000",
                    format!("--user-data-dir={}", profile.path().display()),
                ],
                "prefs": {
                    "download.default_directory": downloads.path().display().to_string(),
                    "download.prompt_for_download": false,
                },
            }),
        );
        let url = format!("http://127.0.0.1:{port}");
        let mut last = None;
        for _ in 0..50 {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            match ClientBuilder::new(connector)
                .capabilities(capabilities.clone())
                .connect(&url)
                .await
            {
                Ok(client) => {
                    return Ok(Self {
                        client,
                        downloads,
                        _profile: profile,
                        _driver: driver,
                    });
                }
                Err(error) => last = Some(error),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        anyhow::bail!("no Chromium session through chromedriver: {last:?}")
    }

    /// Opens `url`.
    ///
    /// # Errors
    /// WebDriver failed.
    pub async fn open(&self, url: &str) -> anyhow::Result<()> {
        self.client.goto(url).await?;
        self.no_dialog().await
    }

    /// The element `id` once it is there.
    ///
    /// # Errors
    /// Not there within [`WAIT`].
    pub async fn find(&self, id: &str) -> anyhow::Result<Element> {
        self.client
            .wait()
            .at_most(WAIT)
            .for_element(Locator::Css(&testid(id)))
            .await
            .with_context(|| format!("no [data-testid={id}] within {WAIT:?}"))
    }

    /// Every element `id` now.
    ///
    /// # Errors
    /// WebDriver failed.
    pub async fn all(&self, id: &str) -> anyhow::Result<Vec<Element>> {
        Ok(self.client.find_all(Locator::Css(&testid(id))).await?)
    }

    /// Whether an element `id` is there now.
    ///
    /// # Errors
    /// WebDriver failed.
    pub async fn has(&self, id: &str) -> anyhow::Result<bool> {
        Ok(!self.all(id).await?.is_empty())
    }

    /// Clicks `id` once it is there.
    ///
    /// # Errors
    /// Not there, or WebDriver failed.
    pub async fn click(&self, id: &str) -> anyhow::Result<()> {
        self.find(id).await?.click().await?;
        self.no_dialog().await
    }

    /// Replaces the value of input `id` with `text`.
    ///
    /// # Errors
    /// Not there, or WebDriver failed.
    pub async fn fill(&self, id: &str, text: &str) -> anyhow::Result<()> {
        let input = self.find(id).await?;
        input.clear().await?;
        input.send_keys(text).await?;
        Ok(())
    }

    /// The text of `id` once it is there.
    ///
    /// # Errors
    /// Not there, or WebDriver failed.
    pub async fn text(&self, id: &str) -> anyhow::Result<String> {
        Ok(self.find(id).await?.text().await?)
    }

    /// Waits until the text of `id` satisfies `ok`; returns it.
    ///
    /// # Errors
    /// Not so within [`WAIT`] (the message shows the last text).
    pub async fn text_until(
        &self,
        id: &str,
        what: &str,
        ok: impl Fn(&str) -> bool,
    ) -> anyhow::Result<String> {
        let deadline = tokio::time::Instant::now() + WAIT;
        let mut last = String::new();
        while tokio::time::Instant::now() < deadline {
            if let Ok(elements) = self.all(id).await
                && let Some(element) = elements.first()
                && let Ok(text) = element.text().await
            {
                if ok(&text) {
                    return Ok(text);
                }
                last = text;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let error = self.text("error").await.unwrap_or_default();
        anyhow::bail!("[data-testid={id}] never {what}; last text {last:?}; page error {error:?}")
    }

    /// Waits until `count` elements `id` are there; returns them.
    ///
    /// # Errors
    /// Not so within [`WAIT`].
    pub async fn at_least(&self, id: &str, count: usize) -> anyhow::Result<Vec<Element>> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let found = self.all(id).await?;
            if found.len() >= count {
                return Ok(found);
            }
            if tokio::time::Instant::now() > deadline {
                anyhow::bail!("{} [data-testid={id}], not {count}", found.len());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Fails when the page opened an `alert`, `confirm` or `prompt`: the
    /// console never does, so one is a script the page should not have run.
    ///
    /// # Errors
    /// A dialog is open (its text in the message).
    pub async fn no_dialog(&self) -> anyhow::Result<()> {
        match self.client.get_alert_text().await {
            Ok(text) => anyhow::bail!("the page opened a dialog: {text:?}"),
            Err(_) => Ok(()),
        }
    }

    /// Saves a screenshot of the page as `NAME.png` under
    /// `target/console-screenshots/`, or under `docs/console/` (which the
    /// console's doc shows) when `REDRIVE_SCREENSHOTS=docs`.
    ///
    /// # Errors
    /// WebDriver or writing failed.
    pub async fn screenshot(&self, name: &str) -> anyhow::Result<PathBuf> {
        let png = self.client.screenshot().await?;
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
        let dir = if std::env::var("REDRIVE_SCREENSHOTS").as_deref() == Ok("docs") {
            root.join("docs/console")
        } else {
            root.join("target/console-screenshots")
        };
        std::fs::create_dir_all(&dir)?;
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, png)?;
        Ok(path)
    }

    /// Runs `script` in the page (a function body; `arguments` holds
    /// `args`) and returns its result.
    ///
    /// # Errors
    /// WebDriver or the script failed.
    pub async fn run(
        &self,
        script: &str,
        args: Vec<serde_json::Value>,
    ) -> anyhow::Result<serde_json::Value> {
        Ok(self.client.execute_async(script, args).await?)
    }

    /// Ends the session (chromedriver is killed when dropped).
    ///
    /// # Errors
    /// WebDriver failed.
    pub async fn close(self) -> anyhow::Result<()> {
        self.client.clone().close().await?;
        Ok(())
    }
}
