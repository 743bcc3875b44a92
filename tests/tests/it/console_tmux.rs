//! The console in a real terminal: `den demo` runs in tmux at a fixed size, keys are sent
//! the way an operator types them, and the captured pane is read back. Each panel shows
//! live data, a placement from the command palette completes (download, runner and probe
//! agree: the instance reads ready), and a request cancelled from the Routes panel ends
//! cancelled — on screen and for its client.
//!
//! tmux is installed by `tests/run`; without it the test says so and is skipped.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use den_tests::binary;

const TOKEN: &str = "tmux-e2e-token";

struct Tmux {
    /// A private tmux server (`-L`), so the test never touches the user's sessions.
    socket: String,
    session: String,
    err: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tmux {
    fn start(den: &std::path::Path) -> Option<Tmux> {
        if Command::new("tmux").arg("-V").output().is_err() {
            return None;
        }
        let dir = tempfile::tempdir().expect("temp dir");
        let err = dir.path().join("den.err");
        let session = format!("den-e2e-{}", std::process::id());
        let socket = session.clone();
        // The synthetic engine: the test's requests and timings are the model-free
        // demo's (the real-model demo is `agents_real_model`'s).
        let cmd = format!(
            "env DEN_TOKEN={TOKEN} XDG_STATE_HOME={state} {den} --no-record demo --synthetic 2>{err}",
            state = dir.path().display(),
            den = den.display(),
            err = err.display()
        );
        let status = Command::new("tmux")
            .args([
                "-L",
                &socket,
                "new-session",
                "-d",
                "-s",
                &session,
                "-x",
                "160",
                "-y",
                "48",
                &cmd,
            ])
            .status()
            .expect("tmux new-session");
        assert!(status.success(), "tmux could not start the session");
        let _ = Command::new("tmux")
            .args([
                "-L",
                &socket,
                "set-option",
                "-t",
                &session,
                "remain-on-exit",
                "on",
            ])
            .status();
        Some(Tmux {
            socket,
            session,
            err,
            _dir: dir,
        })
    }

    fn tmux(&self) -> Command {
        let mut cmd = Command::new("tmux");
        cmd.args(["-L", &self.socket]);
        cmd
    }

    fn capture(&self) -> String {
        let out = self
            .tmux()
            .args(["capture-pane", "-t", &self.session, "-p"])
            .output()
            .expect("tmux capture-pane");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn keys(&self, keys: &[&str]) {
        let status = self
            .tmux()
            .args(["send-keys", "-t", &self.session])
            .args(keys)
            .status()
            .expect("tmux send-keys");
        assert!(status.success());
        std::thread::sleep(Duration::from_millis(150));
    }

    /// Text typed literally (so `:` and `/` are not taken as tmux key names).
    fn type_text(&self, text: &str) {
        let status = self
            .tmux()
            .args(["send-keys", "-t", &self.session, "-l", text])
            .status()
            .expect("tmux send-keys -l");
        assert!(status.success());
        std::thread::sleep(Duration::from_millis(150));
    }

    /// Waits until the pane satisfies `ok`, showing the last screen when it never does.
    fn wait(&self, what: &str, timeout: Duration, ok: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let screen = self.capture();
            if ok(&screen) {
                return screen;
            }
            if Instant::now() > deadline {
                let err = std::fs::read_to_string(&self.err).unwrap_or_default();
                panic!("timed out waiting for {what}; screen:\n{screen}\nstderr:\n{err}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn router_url(&self) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let err = std::fs::read_to_string(&self.err).unwrap_or_default();
            if let Some(url) = err
                .lines()
                .find_map(|l| l.strip_prefix("den demo: router on "))
            {
                return url.trim().to_owned();
            }
            assert!(Instant::now() < deadline, "den demo never started:\n{err}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.tmux().arg("kill-server").status();
    }
}

/// The table row of the pane that mentions `needle` (not a title or the filter line).
fn line_with<'a>(screen: &'a str, needle: &str) -> Option<&'a str> {
    screen
        .lines()
        .find(|l| l.starts_with('│') && l.contains(needle))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_in_tmux_shows_live_panels_places_a_model_and_cancels_a_request() {
    let den = binary("den").expect("the den binary (cargo build --workspace builds it)");
    let Some(tmux) = Tmux::start(&den) else {
        den_tests::environment::missing("tmux is not installed (tests/run installs it)");
        return;
    };
    let router = tmux.router_url();

    // 1 Nodes: three workers with their page pools.
    let nodes = tmux.wait(
        "three workers on the Nodes panel",
        Duration::from_secs(60),
        |s| {
            ["w-1", "w-2", "w-3"]
                .iter()
                .all(|w| line_with(s, w).is_some_and(|l| l.contains("/512")))
        },
    );
    assert!(nodes.contains("Nodes"), "{nodes}");

    // 4 Pages, 5 Routes, 6 Events: live data on each.
    tmux.keys(&["4"]);
    let pages = tmux.wait("page pools per worker", Duration::from_secs(20), |s| {
        s.contains("Pages") && ["w-1", "w-2", "w-3"].iter().all(|w| s.contains(w))
    });
    assert!(
        pages
            .lines()
            .any(|l| l.contains("w-1") && l.chars().any(|c| "░▒▓█▏▎▍▌▋▊▉".contains(c))),
        "{pages}"
    );
    tmux.keys(&["5"]);
    tmux.wait("completed routes", Duration::from_secs(30), |s| {
        s.contains("completed")
    });
    tmux.keys(&["6"]);
    tmux.wait("the feed in the event log", Duration::from_secs(10), |s| {
        s.contains("feed connected")
    });

    // A placement from the command palette, confirmed, followed to its outcome.
    tmux.type_text(":place den/demo-chat");
    tmux.keys(&["Enter"]);
    tmux.wait("the confirmation", Duration::from_secs(10), |s| {
        s.contains("confirm")
    });
    tmux.keys(&["y"]);
    tmux.wait("the placement to complete", Duration::from_secs(90), |s| {
        s.contains("placed instance")
    });
    tmux.keys(&["3"]);
    let instances = tmux.wait("a ready instance", Duration::from_secs(30), |s| {
        line_with(s, "den/demo-chat").is_some_and(|l| l.contains("ready"))
    });
    assert!(instances.contains("Instances"), "{instances}");
    tmux.keys(&["2"]);
    tmux.wait("its download", Duration::from_secs(20), |s| {
        s.contains("den/demo-chat")
    });

    // A long request, cancelled from the Routes panel.
    let client = den_tests::agents::client();
    let body = serde_json::json!({
        "id": "tmux-long",
        "model": "den-synthetic",
        "tokens": (1..200).collect::<Vec<u32>>(),
        "max_new_tokens": 4000,
    });
    let mut response = client
        .post(format!("{router}/v1/generate"))
        .bearer_auth(TOKEN)
        .json(&body)
        .send()
        .await
        .expect("generate");
    assert!(response.status().is_success(), "{}", response.status());
    tmux.keys(&["5"]);
    tmux.type_text("/tmux-long");
    tmux.keys(&["Enter"]);
    tmux.wait("the live request", Duration::from_secs(30), |s| {
        line_with(s, "tmux-long")
            .is_some_and(|l| !l.contains("cancelled") && !l.contains("completed"))
    });
    tmux.keys(&["c"]);
    tmux.wait("the cancel confirmation", Duration::from_secs(10), |s| {
        s.contains("confirm")
    });
    tmux.keys(&["y"]);
    let routes = tmux.wait("the request cancelled", Duration::from_secs(30), |s| {
        line_with(s, "tmux-long").is_some_and(|l| l.contains("cancelled"))
    });
    assert!(
        !line_with(&routes, "tmux-long").is_some_and(|l| l.contains("running")),
        "{routes}"
    );
    // The client's stream ends with a cancelled terminal line.
    let mut text = String::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_secs(5), response.chunk()).await {
            Ok(Ok(Some(chunk))) => text.push_str(&String::from_utf8_lossy(&chunk)),
            _ => break,
        }
    }
    let last = text.lines().last().unwrap_or_default();
    assert!(
        last.contains("cancelled"),
        "last line of the stream: {last}"
    );

    tmux.keys(&["q"]);
}
