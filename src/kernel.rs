//! TODO: module `kernel` (see DESIGN.md).
