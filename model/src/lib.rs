//! den-model (in progress).
