//! Helpers shared by the integration tests.

/// Say that a test was skipped, and why, on the real stderr (`format!` arguments):
/// libtest captures `eprintln!` of passing tests, and a skip must never look like a
/// silent pass.
macro_rules! skip {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr().lock(), "SKIP: {}", format!($($arg)*));
    }};
}
