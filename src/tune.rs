//! TODO: module `tune` (see DESIGN.md).
