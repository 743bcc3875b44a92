//! Actions: what a key means, as data. Which key means which action is the key table's
//! business (`keymap.rs`).

use serde::{Deserialize, Serialize};

use super::panel::Panel;

/// Everything the operator can do, independent of the key that does it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", content = "arg", rename_all = "kebab-case")]
pub enum Action {
    Quit,
    NextPanel,
    PrevPanel,
    Focus(Panel),
    Up,
    Down,
    PageUp,
    PageDown,
    Top,
    Bottom,
    /// Drill into the selected row.
    Enter,
    /// Close the overlay or clear the filter.
    Back,
    /// Sort by the next column.
    SortNext,
    /// Reverse the sort direction.
    SortReverse,
    StartFilter,
    StartPalette,
    Help,
    /// Delete the selected instance / cancel the selected request / drain the selected
    /// worker, depending on the panel (asks for confirmation).
    RowCommand,
    /// Typed text in the filter or the palette.
    Input(char),
    Backspace,
    /// Clear the input line (ctrl-u).
    ClearInput,
    Submit,
    Complete,
    CompleteBack,
    HistoryOlder,
    HistoryNewer,
    Confirm,
    Deny,
    // --- den replay only ---
    /// Pause or resume playback.
    PlayPause,
    /// One event forward (pauses).
    StepForward,
    /// One event back (pauses).
    StepBack,
    /// Ten seconds forward.
    JumpForward,
    /// Ten seconds back.
    JumpBack,
    /// Ask for a time to go to.
    GoToTime,
    /// Ask for what to find.
    Find,
    NextMatch,
    PrevMatch,
    Faster,
    Slower,
}
