//! TODO: module `artifact` (see DESIGN.md).
