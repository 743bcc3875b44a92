//! What `place` asks beyond the model and the nodes: the rest of the integration guide's
//! intent — requested context, the resource's expiry, the management node the API must
//! answer as, the approved card digest — and how long to wait for readiness. The same
//! flags on the command line (`den place`) and in the palette (`place MODEL NODE
//! --context-tokens 8192`), parsed here (the palette) or by clap with [`parse_expiry`]
//! (the command line).

use std::fmt;
use std::time::Duration;

/// The intent's optional parts; `Default` asks nothing beyond model and nodes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PlaceIntent {
    /// Requested per-sequence context; a preview that cannot hold it is rejected, and the
    /// running instance's limit is checked against it during readiness.
    pub context_tokens: Option<u64>,
    /// The external resource's expiry: an upper bound for every placement deadline.
    pub expires: Option<Expiry>,
    /// The node id the management API must answer (`GET /node_id`); another answer
    /// stops the placement before anything is sent.
    pub management_node: Option<String>,
    /// The approved card digest: a preview or requirements with another digest fail.
    pub card_digest: Option<String>,
    /// How long to wait for download, runner and probe after submission (default 10 min).
    pub wait: Option<Duration>,
    /// The compute node's own API (`http(s)://HOST:PORT`): its `/node_id` must be one of
    /// the wanted nodes, and its `/state` is polled beside the management API's
    /// (membership and readiness are then two-sided).
    pub compute: Option<String>,
}

/// When the resource expires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// This long after the command starts.
    In(Duration),
    /// At this UNIX time, ms.
    AtUnixMs(u64),
}

impl Expiry {
    /// The expiry as UNIX ms, given the time the command started.
    pub fn unix_ms(self, now_unix_ms: u64) -> u64 {
        match self {
            Expiry::In(d) => {
                now_unix_ms.saturating_add(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            }
            Expiry::AtUnixMs(t) => t,
        }
    }
}

impl fmt::Display for Expiry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // Milliseconds unless whole seconds: `--expires 500ms` must not read back as 0s.
            Expiry::In(d) if d.subsec_millis() == 0 => write!(f, "{}s", d.as_secs()),
            Expiry::In(d) => write!(f, "{}ms", d.as_millis()),
            Expiry::AtUnixMs(t) => write!(f, "@{}", t / 1000),
        }
    }
}

/// `--expires`: a duration from now (`30m`, `2h`, `90s`), a UNIX time in seconds
/// (`@1767225600`) or an RFC 3339 UTC time (`2026-12-31T23:00:00Z`, offsets allowed).
pub fn parse_expiry(s: &str) -> Result<Expiry, String> {
    let s = s.trim();
    if let Some(secs) = s.strip_prefix('@') {
        return secs
            .parse::<u64>()
            .ok()
            .and_then(|t| t.checked_mul(1000))
            .map(Expiry::AtUnixMs)
            .ok_or_else(|| format!("{s:?} is not a UNIX time: give @SECONDS"));
    }
    if s.contains('T') {
        return den_protocol::time::rfc3339_unix_ms(s)
            .map(Expiry::AtUnixMs)
            .ok_or_else(|| {
                format!("{s:?} is not an RFC 3339 time: give e.g. 2026-12-31T23:00:00Z")
            });
    }
    crate::config::parse_duration(s)
        .map(Expiry::In)
        .map_err(|_| {
            format!(
                "{s:?} is not an expiry: give a duration (30m), @UNIX_SECONDS or an RFC 3339 time"
            )
        })
}

/// A value-taking palette flag.
const FLAGS: [&str; 6] = [
    "--context-tokens",
    "--expires",
    "--expect-management-node",
    "--card-digest",
    "--wait",
    "--compute",
];

impl PlaceIntent {
    /// Splits palette words into positional ones and the intent's flags (`--flag VALUE`
    /// or `--flag=VALUE`, each at most once).
    pub fn split(words: &[String]) -> Result<(Vec<String>, PlaceIntent), String> {
        let mut positional = Vec::new();
        let mut intent = PlaceIntent::default();
        let mut seen: Vec<&str> = Vec::new();
        let mut it = words.iter();
        while let Some(w) = it.next() {
            if !w.starts_with("--") {
                positional.push(w.clone());
                continue;
            }
            let (flag, inline) = match w.split_once('=') {
                Some((f, v)) => (f, Some(v.to_owned())),
                None => (w.as_str(), None),
            };
            let Some(&known) = FLAGS.iter().find(|f| **f == flag) else {
                return Err(format!(
                    "unknown flag {flag}: place takes {}",
                    FLAGS.join(", ")
                ));
            };
            if seen.contains(&known) {
                return Err(format!("{known} is given twice"));
            }
            seen.push(known);
            let value = match inline.or_else(|| it.next().cloned()) {
                Some(v) if !v.is_empty() => v,
                _ => return Err(format!("{known} needs a value")),
            };
            intent.set(known, &value)?;
        }
        Ok((positional, intent))
    }

    fn set(&mut self, flag: &str, value: &str) -> Result<(), String> {
        match flag {
            "--context-tokens" => {
                self.context_tokens = Some(parse_context_tokens(value)?);
            }
            "--expires" => self.expires = Some(parse_expiry(value)?),
            "--expect-management-node" => self.management_node = Some(parse_name(flag, value)?),
            "--card-digest" => self.card_digest = Some(parse_name(flag, value)?),
            "--wait" => {
                self.wait =
                    Some(crate::config::parse_duration(value).map_err(|e| format!("--wait: {e}"))?)
            }
            "--compute" => self.compute = Some(parse_compute_url(value)?),
            _ => return Err(format!("unknown flag {flag}")),
        }
        Ok(())
    }

    /// The flags that give this intent, as the palette reads them back.
    pub fn flags(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(n) = self.context_tokens {
            out.push(format!("--context-tokens {n}"));
        }
        if let Some(e) = self.expires {
            out.push(format!("--expires {e}"));
        }
        if let Some(n) = &self.management_node {
            out.push(format!("--expect-management-node {n}"));
        }
        if let Some(d) = &self.card_digest {
            out.push(format!("--card-digest {d}"));
        }
        if let Some(w) = self.wait {
            out.push(format!("--wait {}ms", w.as_millis()));
        }
        if let Some(c) = &self.compute {
            out.push(format!("--compute {c}"));
        }
        out
    }
}

/// `--compute`: an `http://` or `https://` base URL with a host.
pub fn parse_compute_url(s: &str) -> Result<String, String> {
    let url = reqwest::Url::parse(s.trim())
        .map_err(|_| format!("--compute {s:?} is not a URL: give http://HOST:PORT"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(format!(
            "--compute {s:?}: give the compute node's API as http://HOST:PORT or https://HOST:PORT"
        ));
    }
    Ok(s.trim().to_owned())
}

/// `--context-tokens`: a positive token count.
pub fn parse_context_tokens(s: &str) -> Result<u64, String> {
    match s.trim().parse::<u64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!(
            "--context-tokens {s:?}: give a positive number of tokens"
        )),
    }
}

/// A node id or a card digest: printable, no spaces, at most 256 bytes.
fn parse_name(flag: &str, s: &str) -> Result<String, String> {
    if s.is_empty() || s.len() > 256 || !s.chars().all(|c| c.is_ascii_graphic()) {
        return Err(format!(
            "{flag}: give a printable id without spaces (at most 256 bytes)"
        ));
    }
    Ok(s.to_owned())
}

/// For clap: a node id or card digest.
pub fn parse_node_or_digest(s: &str) -> Result<String, String> {
    parse_name("the value", s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn expiries_are_durations_unix_times_or_rfc3339() {
        assert_eq!(
            parse_expiry("30m"),
            Ok(Expiry::In(Duration::from_secs(1800)))
        );
        assert_eq!(
            parse_expiry("@1767225600"),
            Ok(Expiry::AtUnixMs(1_767_225_600_000))
        );
        assert_eq!(
            parse_expiry("2026-01-01T00:00:00Z"),
            Ok(Expiry::AtUnixMs(1_767_225_600_000))
        );
        assert_eq!(
            parse_expiry("2026-01-01T01:30:00.25+01:30"),
            Ok(Expiry::AtUnixMs(1_767_225_600_250))
        );
        assert_eq!(
            parse_expiry("1970-01-01T00:00:00Z"),
            Ok(Expiry::AtUnixMs(0))
        );
        assert_eq!(
            parse_expiry("2024-02-29T12:00:00Z"),
            Ok(Expiry::AtUnixMs(1_709_208_000_000))
        );
        for bad in [
            "",
            "soon",
            "@x",
            "2026-13-01T00:00:00Z",
            "2026-01-01T25:00:00Z",
            "2026-01-01T00:00:00",
        ] {
            let e = parse_expiry(bad).unwrap_err();
            assert!(!e.contains('\n'), "{e}");
        }
        assert_eq!(Expiry::In(Duration::from_secs(60)).unix_ms(1_000), 61_000);
        for d in ["500ms", "90s", "1500ms"] {
            let e = parse_expiry(d).unwrap();
            assert_eq!(parse_expiry(&e.to_string()), Ok(e), "{d} reads back as {e}");
        }
    }

    #[test]
    fn palette_flags_split_from_positional_words() {
        let (pos, intent) = PlaceIntent::split(&words(
            "m node-a --context-tokens 8192 node-b --expires=2h --expect-management-node mgmt --card-digest sha256:ab --wait 90s --compute http://10.0.0.7:52415",
        ))
        .unwrap();
        assert_eq!(pos, ["m", "node-a", "node-b"]);
        assert_eq!(
            intent,
            PlaceIntent {
                context_tokens: Some(8192),
                expires: Some(Expiry::In(Duration::from_secs(7200))),
                management_node: Some("mgmt".into()),
                card_digest: Some("sha256:ab".into()),
                wait: Some(Duration::from_secs(90)),
                compute: Some("http://10.0.0.7:52415".into()),
            }
        );
        // Read back, the flags give the same intent.
        let again = words(&intent.flags().join(" "));
        assert_eq!(PlaceIntent::split(&again).unwrap().1, intent);
        for (line, says) in [
            ("m --context-tokens 0", "positive"),
            ("m --context-tokens", "needs a value"),
            ("m --wait 1s --wait 2s", "twice"),
            ("m --colour red", "unknown flag --colour"),
            ("m --expires tomorrow", "not an expiry"),
        ] {
            let e = PlaceIntent::split(&words(line)).unwrap_err();
            assert!(e.contains(says), "{line}: {e}");
        }
    }
}
