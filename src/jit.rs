//! TODO: module `jit` (see DESIGN.md).
