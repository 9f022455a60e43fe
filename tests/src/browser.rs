//! A real headless Chromium for the console's tests, driven over WebDriver
//! (W3C WebDriver, through `chromedriver`) with fantoccini: Debian's
//! `chromium` and `chromium-driver`, which `scripts/services.sh` installs.
//! The page's elements are found by their `data-testid`.

use std::{path::PathBuf, process::Stdio, time::Duration};

use anyhow::Context;
use fantoccini::{Client, ClientBuilder, Locator, elements::Element, error::CmdError};
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

    /// Clicks `id` once it is there and enabled.
    ///
    /// # Errors
    /// Not there, disabled, or WebDriver failed.
    pub async fn click(&self, id: &str) -> anyhow::Result<()> {
        // WebDriver clicks a disabled button without a word (and nothing
        // happens): wait until it is enabled, as a person would.
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let clicked = self
                .on_element(id, |element| async move {
                    if !element.is_enabled().await? {
                        return Ok(false);
                    }
                    element.click().await.map(|()| true)
                })
                .await?;
            if clicked {
                return self.no_dialog().await;
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "[data-testid={id}] stayed disabled for {WAIT:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Clicks the link `id` and waits until the screen it leaves is gone
    /// ([`Self::leave`]).
    ///
    /// # Errors
    /// As [`Self::leave`].
    pub async fn follow(&self, id: &str) -> anyhow::Result<()> {
        self.leave(&format!("clicking [data-testid={id}]"), self.click(id))
            .await
    }

    /// Opens `url`, another address of the console than the one shown, and
    /// waits until the screen it leaves is gone ([`Self::leave`]); on a
    /// page that shows no console yet, as [`Self::open`].
    ///
    /// # Errors
    /// As [`Self::leave`].
    pub async fn go(&self, url: &str) -> anyhow::Result<()> {
        if !self.client.find_all(Locator::Css("main")).await?.is_empty() {
            return self.leave(&format!("opening {url}"), self.open(url)).await;
        }
        self.open(url).await
    }

    /// Runs `act` (a click or an address: `what` says which) and waits until
    /// the screen shown before it is gone. The console renders a new
    /// route's screen after the `hashchange` event, so an element found
    /// right after the click can still be the old screen's (a form filled
    /// there is thrown away with it, a list read there is the old one). The
    /// screen is the last child of `<main>` (console/src/main.tsx), a new
    /// node whenever the route (or, for the dead letters, their filters)
    /// changes.
    ///
    /// # Errors
    /// No screen shown, `act` failed, or the screen not replaced within
    /// [`WAIT`] (`act` leads where the page already is).
    async fn leave(
        &self,
        what: &str,
        act: impl std::future::Future<Output = anyhow::Result<()>>,
    ) -> anyhow::Result<()> {
        let leaving = self
            .client
            .find(Locator::Css("main > :last-child"))
            .await
            .context("no screen under <main> to leave")?;
        act.await?;
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            match leaving.attr("class").await {
                Err(error) if error.is_stale_element_reference() || error.is_no_such_element() => {
                    return Ok(());
                }
                Err(error) => return Err(error.into()),
                Ok(_) if tokio::time::Instant::now() > deadline => {
                    anyhow::bail!("the screen stayed after {what}")
                }
                Ok(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    /// For every element `id` now, in document order, its attribute `attr`
    /// and the text of its descendant `cell` (a testid), read in one script:
    /// a list that the page re-renders meanwhile is read whole, never half
    /// old and half new.
    ///
    /// # Errors
    /// WebDriver or the script failed.
    pub async fn rows(
        &self,
        id: &str,
        attr: &str,
        cell: &str,
    ) -> anyhow::Result<Vec<(Option<String>, Option<String>)>> {
        let value = self
            .run(
                "const [row, attr, cell, done] = arguments; \
                 done(Array.from(document.querySelectorAll(row), (r) => { \
                   const c = r.querySelector(cell); \
                   return [r.getAttribute(attr), c === null ? null : c.textContent]; }));",
                vec![json!(testid(id)), json!(attr), json!(testid(cell))],
            )
            .await?;
        Ok(serde_json::from_value(value)?)
    }

    /// Runs `act` on the element `id`, finding it again while the page
    /// replaces it between the find and the act (WebDriver's "stale element
    /// reference": a render swapped the node), until [`WAIT`].
    ///
    /// # Errors
    /// Not there, still replaced at the deadline, or `act` failed otherwise.
    async fn on_element<T, F, Fut>(&self, id: &str, act: F) -> anyhow::Result<T>
    where
        F: Fn(Element) -> Fut,
        Fut: std::future::Future<Output = Result<T, CmdError>>,
    {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            match act(self.find(id).await?).await {
                Err(error)
                    if error.is_stale_element_reference()
                        && tokio::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                result => {
                    return result.with_context(|| format!("[data-testid={id}]"));
                }
            }
        }
    }

    /// Replaces the value of input `id` with `text`.
    ///
    /// # Errors
    /// Not there, or WebDriver failed.
    pub async fn fill(&self, id: &str, text: &str) -> anyhow::Result<()> {
        self.on_element(id, |input| async move {
            input.clear().await?;
            input.send_keys(text).await
        })
        .await
    }

    /// The text of `id` once it is there.
    ///
    /// # Errors
    /// Not there, or WebDriver failed.
    pub async fn text(&self, id: &str) -> anyhow::Result<String> {
        self.on_element(id, |element| async move { element.text().await })
            .await
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
