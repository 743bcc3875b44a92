//! Colour themes: `themes/<name>.toml`. Every colour the console draws comes from here.
//!
//! Built-in themes (`dark`, the default, `light` and `high-contrast`) are compiled into
//! the binary, so it works anywhere; a file `$XDG_CONFIG_HOME/den/themes/<name>.toml`
//! overrides a built-in of the same name or adds a new one, and `--theme PATH.toml`
//! loads a file directly. Every key is required and unknown keys are refused, so a typo
//! is reported instead of silently falling back: the error names the file and the key.
//!
//! Colours are `#rrggbb`, a terminal colour name (`red`, `lightblue`, `darkgray`, …),
//! an index `0`–`255` of the 256-colour palette, or `reset` (the terminal's default).

use std::path::{Path, PathBuf};

use ratatui::style::{Color, Modifier, Style};

use crate::model::{Level, Mark};

/// The names of the themes compiled into the binary.
pub const BUILT_IN: [&str; 3] = ["dark", "light", "high-contrast"];

const DARK: &str = include_str!("../../themes/dark.toml");
const LIGHT: &str = include_str!("../../themes/light.toml");
const HIGH_CONTRAST: &str = include_str!("../../themes/high-contrast.toml");

/// A theme that cannot be used. Every message names the file and, where it applies, the
/// key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ThemeError {
    #[error("theme {name:?} not found (looked for {path}); built-in themes: {}", BUILT_IN.join(", "))]
    NotFound { name: String, path: String },
    #[error("theme file {file}: cannot read it: {detail}")]
    Unreadable { file: String, detail: String },
    #[error("theme file {file}: invalid TOML: {detail}")]
    Syntax { file: String, detail: String },
    #[error("theme file {file}: missing key `{key}`")]
    Missing { file: String, key: String },
    #[error("theme file {file}: key `{key}` is not a known theme key (check its spelling)")]
    Unknown { file: String, key: String },
    #[error(
        "theme file {file}: key `{key}` has invalid colour {value}: expected #rrggbb, a colour name such as red, an index 0-255, or reset"
    )]
    Colour {
        file: String,
        key: String,
        value: String,
    },
}

macro_rules! section {
    ($(#[$meta:meta])* $name:ident = $section:literal { $($field:ident),* $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name {
            $(pub $field: Color,)*
        }

        impl $name {
            const KEYS: &'static [&'static str] = &[$(stringify!($field)),*];

            fn read(root: &toml::Table, file: &str) -> Result<Self, ThemeError> {
                let section = section_table(root, $section, file)?;
                for key in section.keys() {
                    if !Self::KEYS.contains(&key.as_str()) {
                        return Err(ThemeError::Unknown {
                            file: file.to_owned(),
                            key: format!("{}.{}", $section, key),
                        });
                    }
                }
                Ok($name {
                    $($field: colour(section, $section, stringify!($field), file)?,)*
                })
            }
        }
    };
}

section!(
    /// Frame, text and tables.
    UiColors = "ui" {
        fg, bg, dim, border, border_focus, title, header_fg, header_bg,
        selection_fg, selection_bg, tab_fg, tab_active_fg, tab_active_bg, key, flash,
    }
);
section!(
    /// What a value says: good, not yet, bad, unknown or contradicted, stale, missing.
    StatusColors = "status" {
        good, info, warn, bad, unknown, stale, missing,
    }
);
section!(
    /// Bars and sparklines.
    ChartColors = "charts" {
        free, reserved, resident, durable, evictable, sparkline, progress, progress_empty,
    }
);
section!(
    /// Palette, dialogs, help and detail views.
    OverlayColors = "overlay" {
        fg, bg, border, input, matched, danger,
    }
);

/// A loaded theme.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Theme {
    pub name: String,
    pub ui: UiColors,
    pub status: StatusColors,
    pub charts: ChartColors,
    pub overlay: OverlayColors,
}

impl Default for Theme {
    fn default() -> Self {
        Theme::built_in("dark").unwrap_or_else(|_| Theme::fallback())
    }
}

impl Theme {
    /// Parse a theme from TOML text; `file` names it in errors.
    pub fn parse(text: &str, file: &str) -> Result<Theme, ThemeError> {
        let root: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| ThemeError::Syntax {
                file: file.to_owned(),
                detail: e.message().to_owned(),
            })?;
        for key in root.keys() {
            if !["name", "ui", "status", "charts", "overlay"].contains(&key.as_str()) {
                return Err(ThemeError::Unknown {
                    file: file.to_owned(),
                    key: key.clone(),
                });
            }
        }
        let name = match root.get("name") {
            Some(toml::Value::String(s)) => s.clone(),
            Some(_) => {
                return Err(ThemeError::Colour {
                    file: file.to_owned(),
                    key: "name".to_owned(),
                    value: "(not a string)".to_owned(),
                });
            }
            None => {
                return Err(ThemeError::Missing {
                    file: file.to_owned(),
                    key: "name".to_owned(),
                });
            }
        };
        Ok(Theme {
            name,
            ui: UiColors::read(&root, file)?,
            status: StatusColors::read(&root, file)?,
            charts: ChartColors::read(&root, file)?,
            overlay: OverlayColors::read(&root, file)?,
        })
    }

    /// A theme compiled into the binary.
    pub fn built_in(name: &str) -> Result<Theme, ThemeError> {
        let text = match name {
            "dark" => DARK,
            "light" => LIGHT,
            "high-contrast" => HIGH_CONTRAST,
            _ => {
                return Err(ThemeError::NotFound {
                    name: name.to_owned(),
                    path: "the built-in themes".to_owned(),
                });
            }
        };
        Theme::parse(text, &format!("themes/{name}.toml (built in)"))
    }

    /// Load by name or path: `PATH.toml` (or anything with a `/`) is read as a file; a
    /// name is looked up in `user_dir` first, then among the built-ins.
    pub fn load(name_or_path: &str, user_dir: Option<&Path>) -> Result<Theme, ThemeError> {
        if name_or_path.contains('/') || name_or_path.ends_with(".toml") {
            return Theme::from_file(Path::new(name_or_path));
        }
        let user_file = user_dir.map(|d| d.join(format!("{name_or_path}.toml")));
        if let Some(file) = &user_file
            && file.is_file()
        {
            return Theme::from_file(file);
        }
        match Theme::built_in(name_or_path) {
            Err(ThemeError::NotFound { .. }) => Err(ThemeError::NotFound {
                name: name_or_path.to_owned(),
                path: user_file.map_or_else(
                    || "no user theme directory".to_owned(),
                    |f| f.display().to_string(),
                ),
            }),
            other => other,
        }
    }

    /// `$XDG_CONFIG_HOME/den/themes` (or the platform's equivalent).
    pub fn user_dir() -> Option<PathBuf> {
        dirs::config_dir().map(|d| d.join("den").join("themes"))
    }

    fn from_file(path: &Path) -> Result<Theme, ThemeError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ThemeError::Unreadable {
            file: file.clone(),
            detail: e.to_string(),
        })?;
        Theme::parse(&text, &file)
    }

    /// Plain terminal colours, should the built-in dark theme ever fail to parse (a
    /// test guards that it does not).
    fn fallback() -> Theme {
        let c = Color::Reset;
        Theme {
            name: "fallback".to_owned(),
            ui: UiColors {
                fg: c,
                bg: c,
                dim: Color::DarkGray,
                border: c,
                border_focus: Color::Blue,
                title: Color::Blue,
                header_fg: c,
                header_bg: c,
                selection_fg: Color::Black,
                selection_bg: Color::Blue,
                tab_fg: c,
                tab_active_fg: Color::Black,
                tab_active_bg: Color::Blue,
                key: Color::Yellow,
                flash: Color::Yellow,
            },
            status: StatusColors {
                good: Color::Green,
                info: Color::Cyan,
                warn: Color::Yellow,
                bad: Color::Red,
                unknown: Color::Magenta,
                stale: Color::DarkGray,
                missing: Color::DarkGray,
            },
            charts: ChartColors {
                free: Color::DarkGray,
                reserved: Color::Yellow,
                resident: Color::Blue,
                durable: Color::Cyan,
                evictable: Color::Green,
                sparkline: Color::Cyan,
                progress: Color::Green,
                progress_empty: Color::DarkGray,
            },
            overlay: OverlayColors {
                fg: c,
                bg: c,
                border: Color::Blue,
                input: Color::Yellow,
                matched: Color::Green,
                danger: Color::Red,
            },
        }
    }

    // ----- styles the widgets use -----

    pub fn base(&self) -> Style {
        Style::new().fg(self.ui.fg).bg(self.ui.bg)
    }

    pub fn dim(&self) -> Style {
        self.base().fg(self.ui.dim)
    }

    pub fn level(&self, level: Level) -> Style {
        self.base().fg(self.level_colour(level))
    }

    pub fn level_colour(&self, level: Level) -> Color {
        match level {
            Level::Good => self.status.good,
            Level::Info => self.status.info,
            Level::Warn => self.status.warn,
            Level::Bad => self.status.bad,
            Level::Unknown => self.status.unknown,
        }
    }

    pub fn mark(&self, mark: Mark) -> Style {
        let style = self.level(mark.level());
        if mark == Mark::Contradiction {
            style.add_modifier(Modifier::BOLD | Modifier::REVERSED)
        } else {
            style
        }
    }

    /// A value that is missing (drawn `—` or `?`), distinct from zero.
    pub fn missing(&self) -> Style {
        self.base()
            .fg(self.status.missing)
            .add_modifier(Modifier::ITALIC)
    }

    /// A row or value older than the staleness bound.
    pub fn stale(&self) -> Style {
        self.base()
            .fg(self.status.stale)
            .add_modifier(Modifier::DIM)
    }

    pub fn header(&self) -> Style {
        Style::new()
            .fg(self.ui.header_fg)
            .bg(self.ui.header_bg)
            .add_modifier(Modifier::BOLD)
    }

    pub fn selection(&self) -> Style {
        Style::new()
            .fg(self.ui.selection_fg)
            .bg(self.ui.selection_bg)
    }

    pub fn border(&self, focused: bool) -> Style {
        self.base().fg(if focused {
            self.ui.border_focus
        } else {
            self.ui.border
        })
    }

    pub fn title(&self) -> Style {
        self.base().fg(self.ui.title).add_modifier(Modifier::BOLD)
    }

    pub fn key(&self) -> Style {
        self.base().fg(self.ui.key).add_modifier(Modifier::BOLD)
    }

    pub fn overlay(&self) -> Style {
        Style::new().fg(self.overlay.fg).bg(self.overlay.bg)
    }
}

fn section_table<'a>(
    root: &'a toml::Table,
    section: &str,
    file: &str,
) -> Result<&'a toml::Table, ThemeError> {
    match root.get(section) {
        Some(toml::Value::Table(t)) => Ok(t),
        _ => Err(ThemeError::Missing {
            file: file.to_owned(),
            key: section.to_owned(),
        }),
    }
}

fn colour(table: &toml::Table, section: &str, key: &str, file: &str) -> Result<Color, ThemeError> {
    let full = format!("{section}.{key}");
    let value = table.get(key).ok_or_else(|| ThemeError::Missing {
        file: file.to_owned(),
        key: full.clone(),
    })?;
    let bad = |shown: String| ThemeError::Colour {
        file: file.to_owned(),
        key: full.clone(),
        value: shown,
    };
    match value {
        toml::Value::String(s) => parse_colour(s).ok_or_else(|| bad(format!("{s:?}"))),
        toml::Value::Integer(i) => u8::try_from(*i)
            .map(Color::Indexed)
            .map_err(|_| bad(i.to_string())),
        other => Err(bad(other.to_string())),
    }
}

/// `#rrggbb`, a name, an index or `reset`.
pub fn parse_colour(text: &str) -> Option<Color> {
    let t = text.trim().to_ascii_lowercase();
    if let Some(hex) = t.strip_prefix('#') {
        if hex.len() != 6 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        let v = u32::from_str_radix(hex, 16).ok()?;
        return Some(Color::Rgb((v >> 16) as u8, (v >> 8) as u8, v as u8));
    }
    if let Ok(i) = t.parse::<u8>() {
        return Some(Color::Indexed(i));
    }
    Some(match t.replace(['-', '_', ' '], "").as_str() {
        "reset" | "default" => Color::Reset,
        "black" => Color::Black,
        "red" => Color::Red,
        "green" => Color::Green,
        "yellow" => Color::Yellow,
        "blue" => Color::Blue,
        "magenta" => Color::Magenta,
        "cyan" => Color::Cyan,
        "gray" | "grey" => Color::Gray,
        "darkgray" | "darkgrey" => Color::DarkGray,
        "lightred" => Color::LightRed,
        "lightgreen" => Color::LightGreen,
        "lightyellow" => Color::LightYellow,
        "lightblue" => Color::LightBlue,
        "lightmagenta" => Color::LightMagenta,
        "lightcyan" => Color::LightCyan,
        "white" => Color::White,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_themes_parse_and_differ() {
        let themes: Vec<Theme> = BUILT_IN
            .iter()
            .map(|n| Theme::built_in(n).unwrap())
            .collect();
        assert_eq!(themes[0].name, "dark");
        assert_ne!(themes[0], themes[1]);
        assert_ne!(themes[0], themes[2]);
        assert_eq!(Theme::default(), themes[0]);
    }

    #[test]
    fn a_missing_key_is_named_with_its_file() {
        let text = DARK.replace("good =", "# good =");
        let err = Theme::parse(&text, "my.toml").unwrap_err();
        assert_eq!(
            err,
            ThemeError::Missing {
                file: "my.toml".into(),
                key: "status.good".into()
            }
        );
        assert_eq!(
            err.to_string(),
            "theme file my.toml: missing key `status.good`"
        );
    }

    #[test]
    fn a_missing_section_is_named() {
        let text: String = DARK
            .lines()
            .take_while(|l| !l.starts_with("[overlay]"))
            .collect::<Vec<_>>()
            .join("\n");
        let err = Theme::parse(&text, "x.toml").unwrap_err();
        assert!(err.to_string().contains("missing key `overlay`"), "{err}");
    }

    #[test]
    fn an_invalid_colour_is_named_with_its_key_and_value() {
        let text = DARK.replacen("bad = \"", "bad = \"#zz", 1);
        let err = Theme::parse(&text, "x.toml").unwrap_err().to_string();
        assert!(err.contains("key `status.bad`"), "{err}");
        assert!(err.contains("#zz"), "{err}");
    }

    #[test]
    fn an_unknown_key_is_refused() {
        let text = DARK.replace("[status]", "[status]\ngood_ish = \"red\"");
        let err = Theme::parse(&text, "x.toml").unwrap_err();
        assert_eq!(
            err,
            ThemeError::Unknown {
                file: "x.toml".into(),
                key: "status.good_ish".into()
            }
        );
    }

    #[test]
    fn bad_toml_is_a_syntax_error() {
        let err = Theme::parse("name = ", "x.toml").unwrap_err();
        assert!(matches!(err, ThemeError::Syntax { .. }), "{err}");
    }

    #[test]
    fn user_themes_override_built_ins_and_unknown_names_list_them() {
        let dir = tempfile::tempdir().unwrap();
        let custom = LIGHT.replace("name = \"light\"", "name = \"mine\"");
        std::fs::write(dir.path().join("dark.toml"), &custom).unwrap();
        assert_eq!(Theme::load("dark", Some(dir.path())).unwrap().name, "mine");
        assert_eq!(
            Theme::load("light", Some(dir.path())).unwrap().name,
            "light"
        );
        let path = dir.path().join("dark.toml");
        assert_eq!(
            Theme::load(path.to_str().unwrap(), None).unwrap().name,
            "mine"
        );
        let err = Theme::load("solarized", Some(dir.path()))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("solarized") && err.contains("high-contrast"),
            "{err}"
        );
        let err = Theme::load("/nonexistent/t.toml", None).unwrap_err();
        assert!(matches!(err, ThemeError::Unreadable { .. }));
    }

    #[test]
    fn colours_parse_in_every_notation() {
        assert_eq!(parse_colour("#ff0080"), Some(Color::Rgb(255, 0, 128)));
        assert_eq!(parse_colour("Light-Blue"), Some(Color::LightBlue));
        assert_eq!(parse_colour("42"), Some(Color::Indexed(42)));
        assert_eq!(parse_colour("reset"), Some(Color::Reset));
        assert_eq!(parse_colour("#fff"), None);
        assert_eq!(parse_colour("chartreuse"), None);
    }
}
