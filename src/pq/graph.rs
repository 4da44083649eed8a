//! The step graph cache of [`crate::pq::gpu::LaunchMode::Graph`]: one captured CUDA
//! graph per indexer, replayed as is, updated in place, or captured anew.

use std::sync::Arc;

use cudarc::driver::CudaStream;

use crate::driver::KernelGraph;
use crate::error::Result;
use crate::pq::launch::{issue, DeviceTensorRef, Launch};
use crate::pq::plan::StepInfo;

/// What a captured graph was captured for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GraphKey {
    pub s: usize,
    /// The step's sink, window and heavy sizes resolved at `s` (the kernels' integer
    /// arguments): a replay never runs with another step's sizes, even where `s` alone
    /// would not tell (it does today: the config is fixed per indexer).
    pub sizes: [usize; 3],
    pub query: DeviceTensorRef,
    pub key: DeviceTensorRef,
    /// `DeviceState::buffer_ptrs`.
    pub buffers: Vec<u64>,
}

struct Captured<I> {
    key: GraphKey,
    /// `N_cached` at capture: replays re-quantize keys from here, so a replay is exact
    /// while the state holds at least this many codes.
    n_old: usize,
    info: I,
    /// Whether the graph's kernel nodes line up with its launches (else it is only
    /// replayed, never updated).
    updatable: bool,
    /// Variant id of each node's kernel.
    kernels: Vec<String>,
    graph: KernelGraph,
}

/// The indexer's captured step graph, if any, with what the step reports (`I`: the
/// fixed-`S` step's [`StepInfo`], or the ragged step's).
pub(crate) struct StepGraph<I = StepInfo>(Option<Captured<I>>);

impl<I> Default for StepGraph<I> {
    fn default() -> Self {
        StepGraph(None)
    }
}

impl<I: Copy> StepGraph<I> {
    /// Forget the captured graph (the state it was captured on is being replaced).
    pub fn clear(&mut self) {
        self.0 = None;
    }

    /// One step in graph mode on `stream`: replay the captured graph when it was captured
    /// for this very step (`key`, and at most `n_old` keys quantized then); else, when
    /// only `S` / `N_cached` moved (same buffers, same kernels), update the captured
    /// kernel nodes' arguments and grids to `build()`'s launches in place and replay;
    /// else capture `build()`'s launches anew. Returns the step's info and whether it
    /// captured.
    ///
    /// Errors: `build`'s errors, driver errors of capture, update or launch.
    pub fn step(
        &mut self,
        stream: &Arc<CudaStream>,
        gkey: GraphKey,
        n_old: usize,
        build: impl FnOnce() -> Result<(I, Vec<Launch>)>,
    ) -> Result<(I, bool)> {
        if let Some(c) = &self.0 {
            if c.key == gkey && c.n_old <= n_old {
                c.graph.launch()?;
                return Ok((c.info, false));
            }
        }
        let (info, launches) = build()?;
        if let Some(c) = self.0.as_mut() {
            let same_kernels = c.updatable
                && c.kernels.len() == launches.len()
                && c.kernels
                    .iter()
                    .zip(&launches)
                    .all(|(id, l)| id == l.kernel.id());
            if same_kernels
                && c.key.query == gkey.query
                && c.key.key == gkey.key
                && c.key.buffers == gkey.buffers
            {
                // Bounds: `StepLaunches::build` built the arguments for buffers sized for
                // this step (its `Bounds:` comments); a node of another kernel is refused
                let graph = &mut c.graph;
                let updated = launches
                    .iter()
                    .enumerate()
                    .try_for_each(|(i, l)| graph.update(i, &l.kernel, l.grid, &l.args));
                if updated.is_ok() {
                    c.key = gkey;
                    c.n_old = n_old;
                    c.info = info;
                    c.graph.launch()?;
                    return Ok((info, false));
                }
                // an update the driver refused (or a node of another kernel): capture anew
            }
        }
        self.0 = None;
        let graph = KernelGraph::capture(stream, |st| issue(st, &launches))?;
        graph.launch()?;
        self.0 = Some(Captured {
            key: gkey,
            n_old,
            info,
            // a graph whose kernel nodes do not line up with its launches is only replayed
            updatable: graph.kernel_nodes() == launches.len(),
            kernels: launches.iter().map(|l| l.kernel.id().to_string()).collect(),
            graph,
        });
        Ok((info, true))
    }
}
