//! TODO: module `device` (see DESIGN.md).
