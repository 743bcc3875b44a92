//! The `:` command palette: commands, their parser, completion and history.

use std::fmt;

use super::intent::PlaceIntent;

use super::panel::Panel;
use crate::model::KnownIds;
use crate::theme::BUILT_IN;

/// What the operator can ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Place a model on exactly these nodes (all nodes the previews allow when empty).
    Place {
        model: String,
        nodes: Vec<String>,
        /// Context, expiry, expected management node, approved digest, wait.
        intent: PlaceIntent,
    },
    /// `DELETE /instance/{id}` on the management API.
    Delete {
        instance: String,
    },
    /// Cancel a request at the router.
    Cancel {
        request: String,
    },
    /// Stop new offers to a worker and let its work finish.
    Drain {
        worker: String,
    },
    Focus(Panel),
    Theme(String),
    Help,
    Quit,
}

/// Every command word, for completion and the help.
pub const COMMANDS: [(&str, &str); 13] = [
    (
        "place",
        "place MODEL [NODE…] [--FLAG V…]  place a model on exactly these nodes",
    ),
    ("delete", "delete INSTANCE  delete a model instance"),
    ("cancel", "cancel REQUEST  cancel a request at the router"),
    ("drain", "drain WORKER  stop new offers, let work finish"),
    ("nodes", "show the Nodes panel"),
    ("downloads", "show the Downloads panel"),
    ("instances", "show the Instances panel"),
    ("pages", "show the Pages panel"),
    ("routes", "show the Routes panel"),
    ("events", "show the Events panel"),
    (
        "theme",
        "theme NAME  switch colours (dark, light, high-contrast)",
    ),
    ("help", "help for the focused panel"),
    ("quit", "leave den"),
];

impl Command {
    /// Commands that change the cluster: confirmed first, refused in read-only mode.
    pub fn is_mutating(&self) -> bool {
        matches!(
            self,
            Command::Place { .. }
                | Command::Delete { .. }
                | Command::Cancel { .. }
                | Command::Drain { .. }
        )
    }

    /// The command word.
    pub fn verb(&self) -> &'static str {
        match self {
            Command::Place { .. } => "place",
            Command::Delete { .. } => "delete",
            Command::Cancel { .. } => "cancel",
            Command::Drain { .. } => "drain",
            Command::Focus(p) => p.alias(),
            Command::Theme(_) => "theme",
            Command::Help => "help",
            Command::Quit => "quit",
        }
    }

    /// What the confirmation dialog says will happen.
    pub fn consequence(&self) -> String {
        match self {
            Command::Place {
                model,
                nodes,
                intent,
            } => {
                let target = if nodes.is_empty() {
                    "where the previews allow".to_owned()
                } else {
                    format!("on exactly {}", nodes.join(", "))
                };
                let flags = intent.flags();
                let with = if flags.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", flags.join(" "))
                };
                format!(
                    "Place {model} {target}{with}: preview, choose, fence, submit, then watch the reconciliation."
                )
            }
            Command::Delete { instance } => format!(
                "Delete instance {instance}: its runners stop and requests to it fail. (DELETE /instance/{instance})"
            ),
            Command::Cancel { request } => format!(
                "Cancel request {request}: the client gets a cancellation and the worker stops. (POST /v1/requests/{request}/cancel)"
            ),
            Command::Drain { worker } => format!(
                "Drain worker {worker}: it takes no new offers and finishes what it has. (POST /v1/workers/{worker}/drain)"
            ),
            other => other.to_string(),
        }
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Command::Place {
                model,
                nodes,
                intent,
            } => {
                write!(f, "place {model}")?;
                for n in nodes {
                    write!(f, " {n}")?;
                }
                for flag in intent.flags() {
                    write!(f, " {flag}")?;
                }
                Ok(())
            }
            Command::Delete { instance } => write!(f, "delete {instance}"),
            Command::Cancel { request } => write!(f, "cancel {request}"),
            Command::Drain { worker } => write!(f, "drain {worker}"),
            Command::Theme(name) => write!(f, "theme {name}"),
            other => f.write_str(other.verb()),
        }
    }
}

/// A palette line that is not a command.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("type a command, e.g. `delete INSTANCE`; tab completes, ? lists them")]
    Empty,
    #[error(
        "unknown command `{0}`: try place, delete, cancel, drain, a panel name, theme, help or quit"
    )]
    Unknown(String),
    #[error("`{verb}` needs {what}: `{usage}`")]
    MissingArgument {
        verb: &'static str,
        what: &'static str,
        usage: &'static str,
    },
    #[error("`{verb}` takes one argument; unexpected `{extra}`")]
    TooMany { verb: &'static str, extra: String },
    #[error("`place`: {0}")]
    BadFlag(String),
}

/// Parse one palette line.
pub fn parse(line: &str) -> Result<Command, ParseError> {
    let mut words = line.split_whitespace();
    let Some(verb) = words.next() else {
        return Err(ParseError::Empty);
    };
    let rest: Vec<String> = words.map(str::to_owned).collect();
    let one = |verb: &'static str, what: &'static str, usage: &'static str| match rest.as_slice() {
        [] => Err(ParseError::MissingArgument { verb, what, usage }),
        [x] => Ok(x.clone()),
        [_, extra, ..] => Err(ParseError::TooMany {
            verb,
            extra: extra.clone(),
        }),
    };
    let none = |verb: &'static str, cmd: Command| match rest.first() {
        None => Ok(cmd),
        Some(extra) => Err(ParseError::TooMany {
            verb,
            extra: extra.clone(),
        }),
    };
    match verb.to_lowercase().as_str() {
        "place" => {
            let (positional, intent) = PlaceIntent::split(&rest).map_err(ParseError::BadFlag)?;
            match positional.split_first() {
                None => Err(ParseError::MissingArgument {
                    verb: "place",
                    what: "a model id",
                    usage: "place MODEL [NODE…] [--context-tokens N] …",
                }),
                Some((model, nodes)) => Ok(Command::Place {
                    model: model.clone(),
                    nodes: nodes.to_vec(),
                    intent,
                }),
            }
        }
        "delete" | "del" => Ok(Command::Delete {
            instance: one("delete", "an instance id", "delete INSTANCE")?,
        }),
        "cancel" => Ok(Command::Cancel {
            request: one("cancel", "a request id", "cancel REQUEST")?,
        }),
        "drain" => Ok(Command::Drain {
            worker: one("drain", "a worker id", "drain WORKER")?,
        }),
        "theme" => Ok(Command::Theme(one("theme", "a theme name", "theme NAME")?)),
        "help" | "?" => none("help", Command::Help),
        "quit" | "q" | "q!" | "exit" => none("quit", Command::Quit),
        other => match Panel::from_alias(other) {
            Some(panel) => none(panel.alias(), Command::Focus(panel)),
            None => Err(ParseError::Unknown(other.to_owned())),
        },
    }
}

/// Candidates for the last word of `line`: command words first, then ids by command.
pub fn completions(line: &str, ids: &KnownIds) -> Vec<String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let typing_new_word = line.is_empty() || line.ends_with(' ');
    let (position, prefix) = match (words.len(), typing_new_word) {
        (n, true) => (n, ""),
        (n, false) => (n.saturating_sub(1), words.last().copied().unwrap_or("")),
    };
    let pool: Vec<String> = if position == 0 {
        COMMANDS.iter().map(|(c, _)| (*c).to_owned()).collect()
    } else {
        let verb = words.first().map(|w| w.to_lowercase()).unwrap_or_default();
        match (verb.as_str(), position) {
            ("delete" | "del", 1) => ids.instances.clone(),
            ("cancel", 1) => ids.requests.clone(),
            ("drain", 1) => ids.workers.clone(),
            ("place", 1) => ids.models.clone(),
            ("place", _) => ids
                .nodes
                .iter()
                .filter(|n| !words.contains(&n.as_str()))
                .cloned()
                .collect(),
            ("theme", 1) => BUILT_IN.iter().map(|s| (*s).to_owned()).collect(),
            _ => Vec::new(),
        }
    };
    let lower = prefix.to_lowercase();
    let mut starts: Vec<String> = pool
        .iter()
        .filter(|c| c.to_lowercase().starts_with(&lower))
        .cloned()
        .collect();
    // Then ids containing the text (ids are long; operators type a fragment).
    if position > 0 {
        let contains = pool.iter().filter(|c| {
            let c = c.to_lowercase();
            !c.starts_with(&lower) && c.contains(&lower)
        });
        starts.extend(contains.cloned());
    }
    starts
}

/// Replace the last word of `line` by `word` (or append it after a space).
pub fn apply_completion(line: &str, word: &str) -> String {
    if line.is_empty() || line.ends_with(' ') {
        return format!("{line}{word}");
    }
    match line.rfind(' ') {
        Some(i) => format!("{}{word}", line.get(..=i).unwrap_or(line)),
        None => word.to_owned(),
    }
}

/// Palette input with completion cycling and history browsing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PaletteState {
    pub input: String,
    /// Candidates for the word being typed.
    pub candidates: Vec<String>,
    /// The candidate applied by the last tab, while cycling.
    pub chosen: Option<usize>,
    /// The line as typed before cycling began.
    base: Option<String>,
    /// Position while browsing history (0 = newest).
    history_pos: Option<usize>,
    /// What was typed before browsing history.
    draft: String,
}

impl PaletteState {
    pub fn edit(&mut self, ids: &KnownIds, f: impl FnOnce(&mut String)) {
        f(&mut self.input);
        self.base = None;
        self.chosen = None;
        self.history_pos = None;
        self.candidates = completions(&self.input, ids);
    }

    /// Tab: apply the next candidate.
    pub fn complete(&mut self, ids: &KnownIds, backwards: bool) {
        let base = self.base.get_or_insert_with(|| self.input.clone()).clone();
        if self.chosen.is_none() {
            self.candidates = completions(&base, ids);
        }
        let n = self.candidates.len();
        if n == 0 {
            return;
        }
        let next = match (self.chosen, backwards) {
            (None, false) => 0,
            (None, true) => n - 1,
            (Some(i), false) => (i + 1) % n,
            (Some(i), true) => (i + n - 1) % n,
        };
        self.chosen = Some(next);
        if let Some(word) = self.candidates.get(next) {
            self.input = apply_completion(&base, word);
        }
    }

    /// Up (older) or down (newer) through `history` (oldest first).
    pub fn browse(&mut self, history: &[String], older: bool, ids: &KnownIds) {
        if history.is_empty() {
            return;
        }
        let pos = match (self.history_pos, older) {
            (None, true) => {
                self.draft = self.input.clone();
                Some(0)
            }
            (None, false) => None,
            (Some(p), true) => Some((p + 1).min(history.len() - 1)),
            (Some(0), false) => None,
            (Some(p), false) => Some(p - 1),
        };
        self.history_pos = pos;
        self.input = match pos {
            Some(p) => history
                .get(history.len() - 1 - p)
                .cloned()
                .unwrap_or_default(),
            None => self.draft.clone(),
        };
        self.base = None;
        self.chosen = None;
        self.candidates = completions(&self.input, ids);
    }
}

/// Keep `line` in `history` (oldest first, no consecutive duplicates, bounded).
pub fn remember(history: &mut Vec<String>, line: &str, cap: usize) {
    let line = line.trim();
    if line.is_empty() || history.last().is_some_and(|l| l == line) {
        return;
    }
    history.push(line.to_owned());
    if history.len() > cap {
        let excess = history.len() - cap;
        history.drain(..excess);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids() -> KnownIds {
        KnownIds {
            instances: vec!["85bbd162-8da4".into(), "cff479d0-3939".into()],
            requests: vec!["req-2".into(), "req-1".into()],
            workers: vec!["gpu-a".into(), "gpu-b".into()],
            models: vec!["llama-1b".into()],
            nodes: vec!["alpha".into(), "bravo".into()],
        }
    }

    #[test]
    fn commands_parse_with_one_line_errors() {
        assert_eq!(
            parse("delete abc").unwrap(),
            Command::Delete {
                instance: "abc".into()
            }
        );
        assert_eq!(
            parse(" place m n1 n2 ").unwrap(),
            Command::Place {
                model: "m".into(),
                nodes: vec!["n1".into(), "n2".into()],
                intent: PlaceIntent::default(),
            }
        );
        let with = parse("place m n1 --context-tokens 4096 --expires 1h").unwrap();
        assert_eq!(
            with.to_string(),
            "place m n1 --context-tokens 4096 --expires 3600s"
        );
        assert_eq!(parse(&with.to_string()).unwrap(), with);
        assert_eq!(
            parse("place m --context-tokens x").unwrap_err().to_string(),
            "`place`: --context-tokens \"x\": give a positive number of tokens"
        );
        assert_eq!(parse("ro").unwrap(), Command::Focus(Panel::Routes));
        assert_eq!(parse("q").unwrap(), Command::Quit);
        let err = parse("cancel").unwrap_err().to_string();
        assert_eq!(err, "`cancel` needs a request id: `cancel REQUEST`");
        assert!(matches!(
            parse("drain a b"),
            Err(ParseError::TooMany { .. })
        ));
        assert!(matches!(parse("frobnicate"), Err(ParseError::Unknown(_))));
        assert_eq!(parse("   "), Err(ParseError::Empty));
        for cmd in [
            "delete x",
            "cancel y",
            "drain z",
            "place m a b",
            "theme light",
        ] {
            assert_eq!(parse(cmd).unwrap().to_string(), cmd);
        }
    }

    #[test]
    fn completion_knows_words_and_ids_by_position() {
        let ids = ids();
        assert_eq!(completions("d", &ids), ["delete", "drain", "downloads"]);
        assert_eq!(completions("delete ", &ids), ids.instances);
        assert_eq!(completions("delete cff", &ids), ["cff479d0-3939"]);
        // a fragment inside an id matches too
        assert_eq!(completions("cancel 2", &ids), ["req-2"]);
        assert_eq!(completions("place llama-1b alpha ", &ids), ["bravo"]);
        assert!(completions("quit x", &ids).is_empty());
    }

    #[test]
    fn tab_cycles_candidates_and_typing_resets() {
        let ids = ids();
        let mut p = PaletteState::default();
        p.edit(&ids, |s| s.push_str("drain "));
        p.complete(&ids, false);
        assert_eq!(p.input, "drain gpu-a");
        p.complete(&ids, false);
        assert_eq!(p.input, "drain gpu-b");
        p.complete(&ids, false);
        assert_eq!(p.input, "drain gpu-a");
        p.complete(&ids, true);
        assert_eq!(p.input, "drain gpu-b");
        p.edit(&ids, |s| {
            s.pop();
        });
        assert_eq!(p.input, "drain gpu-");
        assert_eq!(p.chosen, None);
    }

    #[test]
    fn history_browses_newest_first_and_restores_the_draft() {
        let ids = ids();
        let mut history = Vec::new();
        for line in ["nodes", "delete a", "delete a", "cancel b"] {
            remember(&mut history, line, 10);
        }
        assert_eq!(history, ["nodes", "delete a", "cancel b"]);
        let mut p = PaletteState::default();
        p.edit(&ids, |s| s.push_str("dr"));
        p.browse(&history, true, &ids);
        assert_eq!(p.input, "cancel b");
        p.browse(&history, true, &ids);
        assert_eq!(p.input, "delete a");
        p.browse(&history, true, &ids);
        p.browse(&history, true, &ids);
        assert_eq!(p.input, "nodes");
        p.browse(&history, false, &ids);
        p.browse(&history, false, &ids);
        p.browse(&history, false, &ids);
        assert_eq!(p.input, "dr");
        let mut capped = Vec::new();
        for i in 0..5 {
            remember(&mut capped, &format!("c{i}"), 3);
        }
        assert_eq!(capped, ["c2", "c3", "c4"]);
    }
}
