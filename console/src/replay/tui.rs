//! den replay.
