//! systemd's readiness protocol (`sd_notify`), spoken directly: a datagram to the socket
//! in `$NOTIFY_SOCKET`. With `Type=notify` in the unit, `systemctl start` returns and units
//! ordered after den start only once the router listens (or the worker has started), not
//! when the process was forked. Outside systemd (`NOTIFY_SOCKET` unset) nothing is sent.

use std::os::unix::net::UnixDatagram;

/// Tells systemd the service is ready, with a one-line status; errors are one line for
/// the log (a failed notification does not stop the service).
pub fn ready(status: &str) -> Result<bool, String> {
    notify(&format!("READY=1\nSTATUS={}", one_line(status)))
}

/// Tells systemd the service is stopping (a drain has begun).
pub fn stopping() -> Result<bool, String> {
    notify("STOPPING=1")
}

/// Sends `state` to `$NOTIFY_SOCKET`; `Ok(false)` when not run by systemd.
fn notify(state: &str) -> Result<bool, String> {
    let Some(target) = std::env::var_os("NOTIFY_SOCKET") else {
        return Ok(false);
    };
    let socket =
        UnixDatagram::unbound().map_err(|e| format!("sd_notify: cannot open a socket: {e}"))?;
    let bytes = target.as_encoded_bytes();
    let sent = if let Some(name) = bytes.strip_prefix(b"@") {
        // An abstract socket (Linux): '@' stands for the leading NUL.
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)
            .map_err(|e| format!("sd_notify: bad abstract socket name: {e}"))?;
        socket.send_to_addr(state.as_bytes(), &addr)
    } else {
        socket.send_to(state.as_bytes(), std::path::Path::new(&target))
    };
    sent.map(|_| true)
        .map_err(|e| format!("sd_notify to {}: {e}", target.to_string_lossy()))
}

fn one_line(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_is_one_line() {
        assert_eq!(one_line("a\nb\tc"), "a b c");
    }
}
