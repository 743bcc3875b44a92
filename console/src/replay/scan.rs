//! Streaming passes over every line of a recording.
