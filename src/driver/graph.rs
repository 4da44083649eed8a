//! CUDA graphs of kernel launches: [`KernelGraph`] captures what a closure issues on a
//! stream, replays it, and points its kernel nodes at new arguments and grids in place
//! (`cuGraphExecKernelNodeSetParams`), so a captured decode step can follow a growing
//! sequence without a new capture.

use std::sync::Arc;

use cudarc::driver::{sys, CudaGraph, CudaStream};

use super::device::driver_err;
use super::kernel::Kernel;
use crate::abi::KernelArg;
use crate::error::{Error, Result};

/// An instantiated CUDA graph captured from one stream, with its kernel nodes in launch
/// order. Owns the graph (and so every handle it hands the driver).
pub struct KernelGraph {
    graph: CudaGraph,
    nodes: Vec<sys::CUgraphNode>,
    attempts: u32,
}

impl std::fmt::Debug for KernelGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelGraph")
            .field("kernel_nodes", &self.nodes.len())
            .field("capture_attempts", &self.attempts)
            .finish()
    }
}

/// Pause before the second capture attempt; it doubles for each further one (0.5 ms ..
/// 32 ms, 63.5 ms in all over [`KernelGraph::CAPTURE_ATTEMPTS`]).
const CAPTURE_RETRY_PAUSE: std::time::Duration = std::time::Duration::from_micros(500);

impl KernelGraph {
    /// Captures [`KernelGraph::capture`] begins before it gives up on a capture that keeps
    /// being invalidated.
    pub const CAPTURE_ATTEMPTS: u32 = 8;

    /// Capture what `issue` launches on `stream` (thread-local capture mode) into a graph
    /// and instantiate it. Nothing runs until [`KernelGraph::launch`].
    ///
    /// A capture the driver invalidates is begun again: after a pause of 0.5 ms, doubling
    /// each time, up to [`KernelGraph::CAPTURE_ATTEMPTS`] captures in all. Nothing
    /// captured has run, so `issue` must only enqueue work on the stream it is given (it
    /// may be called more than once); [`KernelGraph::capture_attempts`] says how many it
    /// took. The driver invalidates a capture when a capture-unsafe call reaches the
    /// context meanwhile: from the capturing thread, or from any thread for a wait on the
    /// whole context (`cuCtxSynchronize`) or a module load or unload, whatever the capture
    /// mode; on an H200 with driver 580 such a call on another thread also failed itself
    /// and, racing the capture's end, once crashed inside libcuda (NOTES.md "graph
    /// captures beside other threads"). So each attempt runs in a
    /// [`crate::driver::CaptureScope`]: tritonrt's own context-wide calls on other threads
    /// ([`crate::driver::Device::synchronize`], module loads, runtime and kernel drops)
    /// wait until it ends. Calls that bypass tritonrt (an engine's own
    /// `cuCtxSynchronize`) are not held back, and are what the retries are for.
    ///
    /// Errors: `issue`'s error (the capture is ended first); the driver's, beginning or
    /// ending the capture; where every attempt broke, the last one's
    /// `CUDA_ERROR_STREAM_CAPTURE_*` naming the attempts and what `issue` said;
    /// [`Error::Invalid`] when nothing was captured.
    pub fn capture(
        stream: &Arc<CudaStream>,
        mut issue: impl FnMut(&Arc<CudaStream>) -> Result<()>,
    ) -> Result<KernelGraph> {
        let mut pause = CAPTURE_RETRY_PAUSE;
        let mut attempt = 1;
        loop {
            let scope = super::gate::capture_scope();
            stream
                .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
                .map_err(|e| driver_err("beginning graph capture", e))?;
            let issued = issue(stream);
            let ended = stream.end_capture(sys::CUgraphInstantiate_flags(0));
            drop(scope);
            let invalidated = matches!(&ended, Err(e) if capture_broke(e.0));
            if invalidated && attempt < Self::CAPTURE_ATTEMPTS {
                std::thread::sleep(pause);
                pause *= 2;
                attempt += 1;
                continue;
            }
            let graph = match ended {
                Err(e) if invalidated => {
                    let said = issued
                        .err()
                        .map(|i| format!("; the last attempt's issue said: {i}"))
                        .unwrap_or_default();
                    return Err(driver_err(
                        format!(
                            "ending graph capture ({} attempts, each invalidated by a \
                             capture-unsafe call: a context-wide wait or module unload on this \
                             device, or one made while issuing){said}",
                            Self::CAPTURE_ATTEMPTS
                        ),
                        e,
                    ));
                }
                Err(e) => {
                    issued?;
                    return Err(driver_err("ending graph capture", e));
                }
                Ok(graph) => {
                    issued?;
                    graph.ok_or_else(|| {
                        Error::invalid("graph capture", "the captured graph is empty")
                    })?
                }
            };
            // SAFETY: `graph` was just instantiated, is owned here and nothing else holds it.
            let nodes = unsafe { graph_kernel_nodes(graph.cu_graph())? };
            return Ok(KernelGraph {
                graph,
                nodes,
                attempts: attempt,
            });
        }
    }

    /// Captures begun to make this graph: 1, or more where another thread invalidated
    /// earlier ones (see [`KernelGraph::capture`]).
    pub fn capture_attempts(&self) -> u32 {
        self.attempts
    }

    /// Kernel nodes, in launch order.
    pub fn kernel_nodes(&self) -> usize {
        self.nodes.len()
    }

    /// Replay the graph on the stream it was captured from. Errors: the driver's.
    pub fn launch(&self) -> Result<()> {
        self.graph
            .launch()
            .map_err(|e| driver_err("replaying a graph", e))
    }

    /// Point kernel node `i` (launch order) at `grid` and `args`; the node must have been
    /// captured from a launch of `kernel`. Arguments are checked as for
    /// [`Kernel::launch`] (device buffers, scalars and tensor descriptors; no bare
    /// addresses). A PDL variant's node keeps
    /// its programmatic edge.
    ///
    /// Errors: [`Error::Invalid`] (no node `i`), argument errors, [`Error::Launch`] (a
    /// node of another kernel, a variant that needs scratch, a cluster or a cooperative
    /// grid, or the driver refusing the update).
    pub fn update(
        &mut self,
        i: usize,
        kernel: &Kernel,
        grid: [u32; 3],
        args: &[KernelArg],
    ) -> Result<()> {
        let node = *self.nodes.get(i).ok_or_else(|| {
            Error::invalid(
                "graph node",
                format!("node {i} of a graph with {} kernel nodes", self.nodes.len()),
            )
        })?;
        kernel.refuse_raw(args)?;
        // SAFETY: the exec and node handles are this graph's own (alive as long as
        // `self`); `&mut self` keeps any other update of them out, and a replay
        // (`launch`) copies the parameters at launch time; the arguments are device
        // buffers of live allocations and checked scalars (`refuse_raw` and the
        // signature check in `update_graph_node`).
        unsafe { kernel.update_graph_node(self.graph.cu_graph_exec(), node, grid, args) }
    }
}

/// Whether `code` says the capture sequence itself broke (`CUDA_ERROR_STREAM_CAPTURE_*`:
/// invalidated, an unsupported or implicit-dependency call during it), so that beginning
/// it again may succeed.
fn capture_broke(code: sys::cudaError_enum) -> bool {
    use sys::cudaError_enum as E;
    matches!(
        code,
        E::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
            | E::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
            | E::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
    )
}

/// The kernel nodes of `graph`, in the order the driver lists them (for a graph
/// captured from one stream: launch order).
///
/// # Safety
///
/// `graph` must be a live graph handle not modified concurrently.
unsafe fn graph_kernel_nodes(graph: sys::CUgraph) -> Result<Vec<sys::CUgraphNode>> {
    let err = |what: &str, e: cudarc::driver::DriverError| Error::Launch {
        kernel: "(graph)".to_string(),
        msg: format!("{what}: {e}"),
    };
    let mut n = 0usize;
    sys::cuGraphGetNodes(graph, std::ptr::null_mut(), &mut n)
        .result()
        .map_err(|e| err("counting graph nodes", e))?;
    let mut nodes = vec![std::ptr::null_mut(); n];
    sys::cuGraphGetNodes(graph, nodes.as_mut_ptr(), &mut n)
        .result()
        .map_err(|e| err("listing graph nodes", e))?;
    nodes.truncate(n);
    let mut out = Vec::new();
    for node in nodes {
        let mut ty = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
        sys::cuGraphNodeGetType(node, &mut ty)
            .result()
            .map_err(|e| err("reading a graph node's type", e))?;
        if ty == sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL {
            out.push(node);
        }
    }
    Ok(out)
}
