//! Keeping context-wide driver calls out of graph captures on other threads.
//!
//! While a thread captures a CUDA graph (thread-local capture mode, as
//! [`crate::driver::KernelGraph::capture`] does), a wait on the whole context
//! (`cuCtxSynchronize`) or a module load or unload on *another* thread is refused by the
//! driver, invalidates that capture and, racing the capture's end, once crashed the
//! process inside libcuda (driver 580, H200; NOTES.md "graph captures beside other
//! threads"). So the crate makes those calls wait until no capture is running: each
//! capture holds this process-wide gate shared ([`capture_scope`]), each context-wide
//! call holds it exclusively ([`exclusive`]). Captures run side by side; a context-wide
//! call waits for the captures running when it asks (microseconds to milliseconds), and
//! captures begun after it asks wait for it.
//!
//! A thread inside a capture of its own skips the gate (it would wait for itself): its
//! context-wide call reaches the driver, which refuses it and invalidates that capture,
//! as before (and [`crate::driver::KernelGraph::capture`] begins it again).

use std::cell::Cell;

use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};

static GATE: RwLock<()> = RwLock::new(());

thread_local! {
    /// Captures this thread holds the gate for (nested scopes count once each).
    static CAPTURING: Cell<u32> = const { Cell::new(0) };
    /// Whether this thread holds the gate exclusively (a context-wide call that makes
    /// another, e.g. a module unloaded while a kernel's scratch is drained).
    static EXCLUSIVE: Cell<bool> = const { Cell::new(false) };
}

/// Held while a thread captures a CUDA graph that may contain tritonrt launches: until it
/// is dropped, tritonrt's context-wide waits, module loads and module unloads on other
/// threads wait. [`crate::driver::KernelGraph::capture`] holds one itself; an engine that
/// captures tritonrt launches into a graph of its own (`cuStreamBeginCapture` on its
/// stream) holds one from before its begin to after its end. Not `Send`: drop it on the
/// thread that made it.
#[must_use = "the gate is held only while the scope lives"]
pub struct CaptureScope {
    _shared: RwLockReadGuard<'static, ()>,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl std::fmt::Debug for CaptureScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CaptureScope")
    }
}

impl Drop for CaptureScope {
    fn drop(&mut self) {
        CAPTURING.with(|c| c.set(c.get().saturating_sub(1)));
    }
}

/// Enter a capture scope on this thread (see [`CaptureScope`]). Blocks while a
/// context-wide call on another thread holds the gate (for as long as that call takes).
pub fn capture_scope() -> CaptureScope {
    let nested = CAPTURING.with(|c| c.get()) > 0;
    let shared = if nested {
        // already shared by this thread: a second shared lock may not wait behind a
        // queued writer (that writer waits for this thread's first scope)
        GATE.read_recursive()
    } else {
        GATE.read()
    };
    CAPTURING.with(|c| c.set(c.get() + 1));
    CaptureScope {
        _shared: shared,
        _not_send: std::marker::PhantomData,
    }
}

/// The gate held exclusively for one context-wide call (a context wait, a module load or
/// unload).
pub(crate) struct Exclusive {
    _write: RwLockWriteGuard<'static, ()>,
}

impl Drop for Exclusive {
    fn drop(&mut self) {
        EXCLUSIVE.with(|e| e.set(false));
    }
}

/// Hold the gate exclusively for one context-wide call; `None` on a thread inside a
/// capture scope of its own (see the module docs) or already holding it. Blocks while any
/// other thread is inside a capture scope.
pub(crate) fn exclusive() -> Option<Exclusive> {
    if CAPTURING.with(|c| c.get()) > 0 || EXCLUSIVE.with(|e| e.get()) {
        return None;
    }
    let write = GATE.write();
    EXCLUSIVE.with(|e| e.set(true));
    Some(Exclusive { _write: write })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn exclusive_waits_for_captures_on_other_threads_and_skips_its_own() {
        let scope = capture_scope();
        // on the capturing thread itself: no wait (None), nested scopes allowed
        assert!(exclusive().is_none());
        let inner = capture_scope();
        drop(inner);
        assert!(exclusive().is_none());
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        let t = std::thread::spawn(move || {
            let g = exclusive();
            assert!(g.is_some(), "another thread gets the gate");
            d.store(true, Ordering::SeqCst);
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !done.load(Ordering::SeqCst),
            "a context-wide call ran while another thread captured"
        );
        drop(scope);
        t.join().unwrap();
        assert!(done.load(Ordering::SeqCst));
        // out of every scope: this thread waits like any other (the gate is free now);
        // a second exclusive call inside the first does not wait for itself
        let g = exclusive();
        assert!(g.is_some());
        assert!(exclusive().is_none());
        drop(g);
        assert!(exclusive().is_some());
    }
}
