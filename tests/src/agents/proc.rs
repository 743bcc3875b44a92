//! [`Proc`]: a `den-agent` child process, its log, and the signals tests send it.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::agent_binary;

/// A child process that is killed (and its log shown on failure) when dropped.
pub struct Proc {
    pub name: String,
    child: Child,
    log: PathBuf,
    lines: mpsc::Receiver<String>,
}

impl Proc {
    /// Start `den-agent ARGS`, logging to `dir/NAME.log`.
    pub fn spawn(name: &str, dir: &Path, args: &[String], env: &[(&str, String)]) -> Proc {
        Proc::spawn_under(name, dir, &[], args, env)
    }

    /// Start `WRAPPER… den-agent ARGS` (e.g. `unshare … sh -c '…; exec "$@"' sh`): the
    /// wrapper's last argument is followed by the binary and its arguments.
    pub fn spawn_under(
        name: &str,
        dir: &Path,
        wrapper: &[String],
        args: &[String],
        env: &[(&str, String)],
    ) -> Proc {
        let log = dir.join(format!("{name}.log"));
        let stderr = std::fs::File::create(&log).expect("log file");
        let mut cmd = match wrapper.split_first() {
            None => Command::new(agent_binary()),
            Some((program, rest)) => {
                let mut c = Command::new(program);
                c.args(rest).arg(agent_binary());
                c
            }
        };
        cmd.args(args)
            .env("DEN_LOG", "info,den_agent=debug")
            .env_remove("DEN_TOKEN")
            .env_remove("DEN_CONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("start den-agent");
        let stdout = child.stdout.take().expect("stdout pipe");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Proc {
            name: name.to_owned(),
            child,
            log,
            lines: rx,
        }
    }

    /// The rest of the first stdout line starting with `prefix`.
    pub fn wait_line(&mut self, prefix: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(rest) = line.strip_prefix(prefix) {
                        return rest.trim().to_owned();
                    }
                }
                Err(_) => panic!(
                    "{} did not print {prefix:?} within {timeout:?}; log:\n{}",
                    self.name,
                    tail(&self.log, 40)
                ),
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Send a signal by name (`KILL`, `TERM`, `STOP`, `CONT`).
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.pid().to_string())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok, "kill -{sig} {} failed", self.name);
    }

    /// Wait for the process to exit; its exit code (None when killed by a signal).
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.code();
            }
            assert!(
                Instant::now() < deadline,
                "{} did not exit within {timeout:?}; log:\n{}",
                self.name,
                tail(&self.log, 40)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "---- {} log (tail) ----\n{}",
                self.name,
                tail(&self.log, 60)
            );
        }
        // A stopped process must be continued to die promptly from SIGKILL's cleanup.
        if let Ok(None) = self.child.try_wait() {
            let _ = Command::new("kill")
                .arg("-CONT")
                .arg(self.child.id().to_string())
                .stderr(Stdio::null())
                .status();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
