//! A small Prometheus text-format registry.
//!
//! Counters, gauges and histograms keyed by name and label set, rendered in the
//! Prometheus exposition format (version 0.0.4) for `GET /metrics`. Families and label
//! sets render in sorted order so the output is stable.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Mutex, MutexGuard};

/// Latency buckets in milliseconds, for TTFT and inter-token latency.
pub const LATENCY_MS_BUCKETS: &[f64] = &[
    1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0,
];

type Labels = Vec<(String, String)>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

#[derive(Debug)]
struct Family {
    kind: Kind,
    help: &'static str,
    buckets: &'static [f64],
    series: BTreeMap<Labels, Series>,
}

#[derive(Debug, Default)]
struct Series {
    value: f64,
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

/// The registry. Share it behind an `Arc`.
#[derive(Debug, Default)]
pub struct Metrics {
    families: Mutex<BTreeMap<&'static str, Family>>,
}

impl Metrics {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn counter_add(
        &self,
        name: &'static str,
        help: &'static str,
        labels: &[(&str, &str)],
        v: f64,
    ) {
        self.with_series(name, help, Kind::Counter, &[], labels, |s| {
            s.value += v.max(0.0)
        });
    }

    pub fn gauge_set(
        &self,
        name: &'static str,
        help: &'static str,
        labels: &[(&str, &str)],
        v: f64,
    ) {
        self.with_series(name, help, Kind::Gauge, &[], labels, |s| s.value = v);
    }

    pub fn histogram_observe(
        &self,
        name: &'static str,
        help: &'static str,
        buckets: &'static [f64],
        labels: &[(&str, &str)],
        v: f64,
    ) {
        if !v.is_finite() {
            return;
        }
        self.with_series(name, help, Kind::Histogram, buckets, labels, |s| {
            if s.counts.len() != buckets.len() {
                s.counts = vec![0; buckets.len()];
            }
            for (i, b) in buckets.iter().enumerate() {
                if v <= *b {
                    s.counts[i] += 1;
                }
            }
            s.sum += v;
            s.count += 1;
        });
    }

    /// The current value of a counter or gauge (0 when absent), for tests and summaries.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let families = self.lock();
        families
            .get(name)
            .and_then(|f| f.series.get(&owned(labels)))
            .map(|s| if s.count > 0 { s.sum } else { s.value })
            .unwrap_or(0.0)
    }

    /// The exposition text.
    pub fn render(&self) -> String {
        let families = self.lock();
        let mut out = String::new();
        for (name, f) in families.iter() {
            let kind = match f.kind {
                Kind::Counter => "counter",
                Kind::Gauge => "gauge",
                Kind::Histogram => "histogram",
            };
            let _ = writeln!(out, "# HELP {name} {}", f.help);
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for (labels, s) in &f.series {
                match f.kind {
                    Kind::Counter | Kind::Gauge => {
                        let _ = writeln!(
                            out,
                            "{name}{} {}",
                            fmt_labels(labels, None),
                            fmt_value(s.value)
                        );
                    }
                    Kind::Histogram => {
                        for (b, c) in f.buckets.iter().zip(&s.counts) {
                            let le = fmt_value(*b);
                            let _ =
                                writeln!(out, "{name}_bucket{} {c}", fmt_labels(labels, Some(&le)));
                        }
                        let _ = writeln!(
                            out,
                            "{name}_bucket{} {}",
                            fmt_labels(labels, Some("+Inf")),
                            s.count
                        );
                        let _ = writeln!(
                            out,
                            "{name}_sum{} {}",
                            fmt_labels(labels, None),
                            fmt_value(s.sum)
                        );
                        let _ =
                            writeln!(out, "{name}_count{} {}", fmt_labels(labels, None), s.count);
                    }
                }
            }
        }
        out
    }

    fn with_series(
        &self,
        name: &'static str,
        help: &'static str,
        kind: Kind,
        buckets: &'static [f64],
        labels: &[(&str, &str)],
        f: impl FnOnce(&mut Series),
    ) {
        let mut families = self.lock();
        let family = families.entry(name).or_insert_with(|| Family {
            kind,
            help,
            buckets,
            series: BTreeMap::new(),
        });
        // A name registered with another kind is a programming error; ignore the sample
        // rather than emit an inconsistent family.
        if family.kind != kind {
            return;
        }
        // Hot paths count every frame: find an existing series without allocating its
        // key (label sets are a handful of short pairs).
        let existing = if family.series.len() <= 16 {
            family
                .series
                .iter_mut()
                .find(|(k, _)| same_labels(k, labels))
        } else {
            None
        };
        match existing {
            Some((_, series)) => f(series),
            None => f(family.series.entry(owned(labels)).or_default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<&'static str, Family>> {
        // A panic while holding the lock cannot leave a family half-updated in a way
        // that matters for monitoring, so recover from poisoning.
        self.families.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// `stored` (sorted) holds exactly the pairs of `given` (any order, no duplicates).
fn same_labels(stored: &Labels, given: &[(&str, &str)]) -> bool {
    stored.len() == given.len()
        && given
            .iter()
            .all(|(k, v)| stored.iter().any(|(sk, sv)| sk == k && sv == v))
}

fn owned(labels: &[(&str, &str)]) -> Labels {
    let mut v: Labels = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    v.sort();
    v
}

fn fmt_labels(labels: &Labels, le: Option<&str>) -> String {
    let mut parts: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
        .collect();
    if let Some(le) = le {
        parts.push(format!("le=\"{le}\""));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", parts.join(","))
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The value of the series `name` with exactly `labels` (in any order) in exposition
/// text such as [`Metrics::render`] writes, as a client scraping `/metrics` reads it;
/// `None` when the text has no such series or its value is not a number.
pub fn read_value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let want: BTreeMap<&str, &str> = labels.iter().copied().collect();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(series)
        .find(|(n, got, _)| {
            *n == name
                && got.len() == want.len()
                && got
                    .iter()
                    .all(|(k, v)| want.get(k.as_str()) == Some(&v.as_str()))
        })
        .and_then(|(_, _, v)| v.trim().parse().ok())
}

/// One exposition line: the metric name, its labels (values unescaped) and the value
/// text; `None` for a line that is not a series. Label values are quoted strings in
/// which `,`, `}`, `=` and escaped quotes may appear, so they are scanned, not split.
fn series(line: &str) -> Option<(&str, BTreeMap<String, String>, &str)> {
    let Some((name, rest)) = line.split_once('{') else {
        let (name, value) = line.split_once(' ')?;
        return Some((name, BTreeMap::new(), value));
    };
    let mut labels = BTreeMap::new();
    let mut chars = rest.char_indices().peekable();
    loop {
        while chars.next_if(|(_, c)| *c == ',' || *c == ' ').is_some() {}
        let (start, c) = chars.next()?;
        if c == '}' {
            let value = rest.get(start + 1..)?;
            return Some((name, labels, value));
        }
        let mut key = String::from(c);
        loop {
            match chars.next()? {
                (_, '=') => break,
                (_, c) => key.push(c),
            }
        }
        if chars.next()?.1 != '"' {
            return None;
        }
        let mut value = String::new();
        loop {
            match chars.next()?.1 {
                '"' => break,
                '\\' => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                c => value.push(c),
            }
        }
        labels.insert(key, value);
    }
}

fn fmt_value(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_render_writes_read_value_reads_back() {
        let m = Metrics::new();
        let io = "den_tier_io_bytes_total";
        m.counter_add(io, "h", &[("tier", "ssd"), ("direction", "read")], 4.5e6);
        m.counter_add(io, "h", &[("tier", "ssd"), ("direction", "write")], 8000.0);
        m.counter_add(io, "h", &[("tier", "ram"), ("direction", "read")], 1500.0);
        m.gauge_set("den_up", "h", &[], 1.0);
        let text = m.render();
        let read = |name, labels: &[(&str, &str)]| read_value(&text, name, labels);
        // Labels in any order; exactly the set asked for.
        assert_eq!(
            read(io, &[("direction", "read"), ("tier", "ssd")]),
            Some(4.5e6)
        );
        assert_eq!(
            read(io, &[("tier", "ram"), ("direction", "read")]),
            Some(1500.0)
        );
        assert_eq!(read(io, &[("tier", "ram"), ("direction", "write")]), None);
        assert_eq!(read(io, &[("tier", "ssd")]), None);
        assert_eq!(read("den_up", &[]), Some(1.0));
        assert_eq!(read("den_down", &[]), None);
        assert_eq!(read_value("den_up NaN-ish\n", "den_up", &[]), None);
    }

    #[test]
    fn renders_counters_gauges_and_histograms() {
        let m = Metrics::new();
        m.counter_add(
            "den_requests_total",
            "Requests.",
            &[("outcome", "completed")],
            2.0,
        );
        m.gauge_set("den_pages", "Pages by state.", &[("state", "free")], 7.0);
        m.histogram_observe("den_ttft_ms", "TTFT.", &[1.0, 10.0], &[], 5.0);
        let text = m.render();
        assert!(text.contains("# TYPE den_requests_total counter"));
        assert!(text.contains("den_requests_total{outcome=\"completed\"} 2"));
        assert!(text.contains("den_pages{state=\"free\"} 7"));
        assert!(text.contains("den_ttft_ms_bucket{le=\"1\"} 0"));
        assert!(text.contains("den_ttft_ms_bucket{le=\"10\"} 1"));
        assert!(text.contains("den_ttft_ms_bucket{le=\"+Inf\"} 1"));
        assert!(text.contains("den_ttft_ms_count 1"));
        assert_eq!(m.value("den_pages", &[("state", "free")]), 7.0);
    }

    #[test]
    fn escapes_label_values() {
        let m = Metrics::new();
        m.counter_add("x", "h", &[("reason", "a\"b")], 1.0);
        assert!(m.render().contains("x{reason=\"a\\\"b\"} 1"));
    }

    /// Label values with the characters that end a naive split (`,` `}` `=` quotes,
    /// backslashes, newlines) are read back as written; a partial label set is not a
    /// match, and a malformed line is skipped, not misread.
    #[test]
    fn read_value_reads_back_any_label_value() {
        let m = Metrics::new();
        let odd = "w-1,tier=\"ram\"} 9\\x\ny";
        m.counter_add("x", "h", &[("worker", odd), ("tier", "ssd")], 3.0);
        m.counter_add("x", "h", &[("worker", "w-1"), ("tier", "ssd")], 5.0);
        let text = m.render();
        assert_eq!(
            read_value(&text, "x", &[("tier", "ssd"), ("worker", odd)]),
            Some(3.0)
        );
        assert_eq!(
            read_value(&text, "x", &[("worker", "w-1"), ("tier", "ssd")]),
            Some(5.0)
        );
        assert_eq!(read_value(&text, "x", &[("worker", "w-1")]), None);
        assert_eq!(
            read_value("x{worker=w-1} 2\n", "x", &[("worker", "w-1")]),
            None
        );
        assert_eq!(
            read_value("x{worker=\"w-1 2\n", "x", &[("worker", "w-1")]),
            None
        );
    }
}
