//! Locating the workspace's built binaries and running them as guarded child processes.

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The directory the workspace's binaries are built into, e.g. `…/target/debug`.
///
/// A test executable lives in `<profile dir>/deps/`, so the profile directory is its
/// grandparent; that follows whatever profile and target triple the test was built
/// with. Otherwise `$CARGO_TARGET_DIR/debug`, otherwise `<workspace>/target/debug`.
pub fn target_dir() -> PathBuf {
    if let Ok(exe) = std::env::current_exe()
        && let Some(deps) = exe.parent()
        && deps.file_name().is_some_and(|n| n == "deps")
        && let Some(profile) = deps.parent()
    {
        return profile.to_owned();
    }
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => PathBuf::from(dir).join("debug"),
        None => workspace_dir().join("target").join("debug"),
    }
}

/// The workspace root (the parent of this crate).
pub fn workspace_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_owned)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// The path a workspace binary (`den`, `den-agent`, `den-fleet`, `skulk-fixture-server`) is
/// built at.
pub fn binary_path(name: &str) -> PathBuf {
    target_dir().join(format!("{name}{}", std::env::consts::EXE_SUFFIX))
}

/// A built workspace binary, or an error saying how to build it. `cargo test -p den-tests`
/// builds this crate's own binaries; others need `cargo build -p <package>` first (or
/// [`cargo_build`]).
pub fn binary(name: &str) -> Result<PathBuf, String> {
    let path = binary_path(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "binary {name} not found at {}; build it first (e.g. `cargo build -p {}`)",
            path.display(),
            package_of(name)
        ))
    }
}

/// Builds `package` with the cargo that runs the tests (`$CARGO`), in the same target
/// directory. Slow: call it once per test binary, not per test.
pub fn cargo_build(package: &str) -> Result<(), String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "-p", package])
        .current_dir(workspace_dir())
        .status()
        .map_err(|e| format!("cannot run cargo build -p {package}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("cargo build -p {package} failed ({status})"))
    }
}

fn package_of(binary: &str) -> &'static str {
    match binary {
        "den" => "den-console",
        "den-agent" | "den-agent-soak" => "den-agent",
        "den-fleet" => "den-fleet",
        _ => "den-tests",
    }
}

/// Lines a child wrote, collected by reader threads.
#[derive(Default)]
struct Lines {
    lines: Mutex<Vec<String>>,
    changed: Condvar,
}

impl Lines {
    fn push(&self, line: String) {
        self.lock().push(line);
        self.changed.notify_all();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<String>> {
        // Reader threads only push whole lines: a poisoned lock is still consistent.
        self.lines
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A child process with piped stdout and stderr, killed (and reaped) when dropped.
pub struct ChildGuard {
    name: String,
    child: Child,
    stdout: Arc<Lines>,
    stderr: Arc<Lines>,
}

impl ChildGuard {
    /// Spawns `cmd` with stdout and stderr piped and collected line by line.
    pub fn spawn(mut cmd: Command, name: &str) -> Result<ChildGuard, String> {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {name} ({:?}): {e}", cmd.get_program()))?;
        let stdout = Arc::new(Lines::default());
        let stderr = Arc::new(Lines::default());
        if let Some(out) = child.stdout.take() {
            collect(out, Arc::clone(&stdout));
        }
        if let Some(err) = child.stderr.take() {
            collect(err, Arc::clone(&stderr));
        }
        Ok(ChildGuard {
            name: name.to_owned(),
            child,
            stdout,
            stderr,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Stdout so far, line by line.
    pub fn stdout_lines(&self) -> Vec<String> {
        self.stdout.lock().clone()
    }

    /// Stderr so far, line by line.
    pub fn stderr_lines(&self) -> Vec<String> {
        self.stderr.lock().clone()
    }

    /// Waits until a stdout line satisfies `pred`; returns it, or `None` at the timeout.
    pub fn wait_for_stdout(
        &self,
        timeout: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> Option<String> {
        wait_for_line(&self.stdout, timeout, pred)
    }

    /// Waits until a stderr line satisfies `pred`.
    pub fn wait_for_stderr(
        &self,
        timeout: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> Option<String> {
        wait_for_line(&self.stderr, timeout, pred)
    }

    /// The exit status if the child has exited.
    pub fn try_wait(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Kills the child now and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The last lines of stderr, for assertion messages.
    pub fn stderr_tail(&self, lines: usize) -> String {
        let all = self.stderr_lines();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

fn collect(stream: impl Read + Send + 'static, into: Arc<Lines>) {
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines() {
            match line {
                Ok(line) => into.push(line),
                Err(_) => break,
            }
        }
    });
}

fn wait_for_line(lines: &Lines, timeout: Duration, pred: impl Fn(&str) -> bool) -> Option<String> {
    let deadline = Instant::now() + timeout;
    let mut guard = lines.lock();
    loop {
        if let Some(line) = guard.iter().find(|l| pred(l)) {
            return Some(line.clone());
        }
        let left = deadline.checked_duration_since(Instant::now())?;
        guard = lines
            .changed
            .wait_timeout(guard, left)
            .map(|(g, _)| g)
            .unwrap_or_else(|e| e.into_inner().0);
    }
}

/// Reads an address from a `listening on ADDR` line (extra words after it are fine).
pub fn parse_listening(line: &str) -> Option<SocketAddr> {
    line.trim()
        .strip_prefix("listening on ")?
        .split_whitespace()
        .next()?
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .ok()
}

/// Spawns `cmd` and waits for its first stdout line, which must be `listening on ADDR`.
pub fn spawn_listening(
    cmd: Command,
    name: &str,
    timeout: Duration,
) -> Result<(ChildGuard, SocketAddr), String> {
    let mut guard = ChildGuard::spawn(cmd, name)?;
    let first = guard.wait_for_stdout(timeout, |_| true);
    match first.as_deref().map(|l| (l, parse_listening(l))) {
        Some((_, Some(addr))) => Ok((guard, addr)),
        Some((line, None)) => Err(format!(
            "{name}: expected `listening on ADDR` as the first line, got {line:?}"
        )),
        None => {
            let status = guard.try_wait();
            Err(format!(
                "{name} did not report its address within {timeout:?} (exit: {status:?}); \
                 stderr:\n{}",
                guard.stderr_tail(20)
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_lines_give_the_address() {
        let addr: SocketAddr = "127.0.0.1:52415".parse().expect("addr");
        assert_eq!(parse_listening("listening on 127.0.0.1:52415"), Some(addr));
        assert_eq!(
            parse_listening("listening on http://127.0.0.1:52415/ (den-agent)"),
            Some(addr)
        );
        assert_eq!(parse_listening("starting up"), None);
        assert_eq!(parse_listening("listening on nowhere"), None);
    }

    #[test]
    fn binaries_are_looked_up_next_to_the_test_executable() {
        // this unit-test binary lives in <profile>/deps
        let exe = std::env::current_exe().expect("exe");
        assert_eq!(
            exe.parent().and_then(Path::parent),
            Some(target_dir().as_path())
        );
        let err = binary("no-such-binary").expect_err("absent");
        assert!(
            err.contains("no-such-binary") && err.contains("cargo build"),
            "{err}"
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn children_are_killed_on_drop_and_their_output_is_kept() {
        let mut cmd = Command::new("sh");
        cmd.args([
            "-c",
            "echo listening on 127.0.0.1:9; echo oops >&2; sleep 30",
        ]);
        let (guard, addr) =
            spawn_listening(cmd, "sh", Duration::from_secs(10)).expect("listening line");
        assert_eq!(addr.port(), 9);
        assert!(
            guard
                .wait_for_stderr(Duration::from_secs(10), |l| l == "oops")
                .is_some()
        );
        let proc_dir = PathBuf::from(format!("/proc/{}", guard.id()));
        assert!(proc_dir.exists());
        drop(guard);
        assert!(!proc_dir.exists(), "killed and reaped");
    }
}
