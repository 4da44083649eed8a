//! `tritonrt launch`: run one variant of a ptx_cache from the command line. Tensors come
//! from a safetensors file by argument name, scalars and the grid from flags; the named
//! output arguments are written to a safetensors file after the first launch; `--repeat`
//! times further launches with CUDA events.
//!
//! Every argument is bound and checked against the variant's signature ([`bind`]) before
//! the GPU is touched, so a missing tensor, a wrong dtype or a malformed scalar is
//! reported (naming the kernel, the argument and what was expected) even on a machine
//! without one.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{anyhow, bail, Context};
use safetensors::tensor::{Dtype as StDtype, TensorView};
use safetensors::SafeTensors;

use crate::cli::core_cmds::PtxCacheArg;
use crate::cli::EXIT_OK;
use tritonrt::abi::{KernelArg, TensorDescArg};
use tritonrt::artifact::{ArgType, ArtifactStore, Dtype, Variant};
use tritonrt::driver::{Device, DeviceBuf};
use tritonrt::jit::CubinCache;
use tritonrt::runtime::Runtime;

/// Arguments of `tritonrt launch`.
///
/// Each argument of the kernel's signature is bound by name: a pointer (`*fp16`) or tensor
/// descriptor (`tensordesc<fp16[64, 64]>`) argument takes the tensor of that name from
/// `--inputs` (or a zero-filled one from `--zeros`), whose dtype must be the argument's
/// element type (a descriptor sees the tensor as contiguous row-major, with its shape);
/// a scalar argument takes `--arg NAME=VALUE`, or a one-element tensor of its exact dtype
/// from `--inputs`. Example:
///
///   tritonrt launch add_kernel --ptx-cache my_cache --inputs in.safetensors
///   --arg n=4096 --grid 4 --outputs out_ptr --out out.safetensors --repeat 100
#[derive(Debug, clap::Args)]
pub struct LaunchArgs {
    /// A variant id (`inspect` lists them), or a kernel name: its default variant for this
    /// GPU.
    #[arg(value_name = "KERNEL_OR_VARIANT")]
    pub kernel: String,
    #[command(flatten)]
    pub ptx: PtxCacheArg,
    /// Triton's program grid: `X`, `X,Y` or `X,Y,Z` programs.
    #[arg(long, value_name = "X[,Y[,Z]]")]
    pub grid: String,
    /// A safetensors file holding the input tensors, named as the kernel's arguments.
    #[arg(long, value_name = "FILE")]
    pub inputs: Option<PathBuf>,
    /// A scalar argument's value: `n=4096`, `scale=0.5`, `flag=true`. Integers may be
    /// given in the unsigned range of their width (`-1` and `4294967295` are the same
    /// i32 bits), floats as decimal, `inf`, `-inf` or `nan`. Repeat for each scalar.
    #[arg(long = "arg", value_name = "NAME=VALUE")]
    pub args: Vec<String>,
    /// A zero-filled tensor for a pointer or descriptor argument missing from `--inputs`:
    /// `out_ptr=fp16:4096` or `out_desc=fp32:256x128` (dtype in Triton's spelling, shape
    /// in elements). Repeat for each.
    #[arg(long, value_name = "NAME=DTYPE:SHAPE")]
    pub zeros: Vec<String>,
    /// Arguments whose tensors are written to `--out` after the first launch
    /// (comma-separated or repeated).
    #[arg(long, value_name = "NAME", value_delimiter = ',')]
    pub outputs: Vec<String>,
    /// Where the `--outputs` tensors are written (safetensors; same names, dtypes and
    /// shapes as their inputs).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// After the first launch, time this many more (CUDA events around each launch on
    /// the stream) and print the median and the minimum in microseconds. Outputs are
    /// those of the first launch.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub repeat: usize,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    pub device: usize,
}

/// A host tensor bound to a pointer or descriptor argument.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    /// Element dtype.
    pub dtype: Dtype,
    /// Shape in elements.
    pub shape: Vec<usize>,
    /// The bytes (little-endian elements, row-major).
    pub bytes: Vec<u8>,
}

/// One signature argument, bound.
#[derive(Debug, Clone, PartialEq)]
pub enum Bound {
    /// A tensor for a `*dtype` argument.
    Ptr(HostTensor),
    /// A tensor for a `tensordesc<...>` argument (seen contiguous, with its shape).
    Desc(HostTensor),
    /// A scalar.
    Scalar(KernelArg),
}

/// Triton dtype of a safetensors dtype (`None`: no Triton equivalent).
pub fn triton_dtype(d: StDtype) -> Option<Dtype> {
    Some(match d {
        StDtype::BOOL => Dtype::I1,
        StDtype::I8 => Dtype::I8,
        StDtype::U8 => Dtype::U8,
        StDtype::I16 => Dtype::I16,
        StDtype::U16 => Dtype::U16,
        StDtype::F16 => Dtype::Fp16,
        StDtype::BF16 => Dtype::Bf16,
        StDtype::I32 => Dtype::I32,
        StDtype::U32 => Dtype::U32,
        StDtype::F32 => Dtype::Fp32,
        StDtype::F64 => Dtype::Fp64,
        StDtype::I64 => Dtype::I64,
        StDtype::U64 => Dtype::U64,
        StDtype::F8_E4M3 => Dtype::Fp8E4Nv,
        StDtype::F8_E5M2 => Dtype::Fp8E5,
        _ => return None,
    })
}

/// Safetensors dtype of a Triton dtype.
pub fn st_dtype(d: Dtype) -> StDtype {
    match d {
        Dtype::I1 => StDtype::BOOL,
        Dtype::I8 => StDtype::I8,
        Dtype::U8 => StDtype::U8,
        Dtype::I16 => StDtype::I16,
        Dtype::U16 => StDtype::U16,
        Dtype::Fp16 => StDtype::F16,
        Dtype::Bf16 => StDtype::BF16,
        Dtype::I32 => StDtype::I32,
        Dtype::U32 => StDtype::U32,
        Dtype::Fp32 => StDtype::F32,
        Dtype::Fp64 => StDtype::F64,
        Dtype::I64 => StDtype::I64,
        Dtype::U64 => StDtype::U64,
        Dtype::Fp8E4Nv => StDtype::F8_E4M3,
        Dtype::Fp8E5 => StDtype::F8_E5M2,
    }
}

/// Parse a scalar flag value as Triton type `d`. Errors: what was expected.
pub fn parse_scalar(d: Dtype, s: &str) -> Result<KernelArg, String> {
    let s = s.trim();
    let int = |bits: u32, signed: bool| -> Result<u64, String> {
        let v: i128 = s
            .parse()
            .map_err(|_| format!("{s:?} is not an integer ({} expected)", d.name()))?;
        let (lo, hi) = if signed {
            (-(1i128 << (bits - 1)), (1i128 << bits) - 1)
        } else {
            (0, (1i128 << bits) - 1)
        };
        if v < lo || v > hi {
            return Err(format!(
                "{v} does not fit {} ({lo} ..= {hi}{})",
                d.name(),
                if signed {
                    ", the upper half read as the same bits"
                } else {
                    ""
                }
            ));
        }
        Ok(v as u64)
    };
    let float = || -> Result<f64, String> {
        match s.to_ascii_lowercase().as_str() {
            "inf" | "+inf" => Ok(f64::INFINITY),
            "-inf" => Ok(f64::NEG_INFINITY),
            "nan" => Ok(f64::NAN),
            _ => s
                .parse::<f64>()
                .map_err(|_| format!("{s:?} is not a number ({} expected)", d.name())),
        }
    };
    Ok(match d {
        Dtype::I1 => match s {
            "1" | "true" | "True" => KernelArg::Bool(true),
            "0" | "false" | "False" => KernelArg::Bool(false),
            _ => return Err(format!("{s:?} is not a bool (i1: true, false, 1 or 0)")),
        },
        Dtype::I8 => KernelArg::I8(int(8, true)? as u8 as i8),
        Dtype::I16 => KernelArg::I16(int(16, true)? as u16 as i16),
        Dtype::I32 => KernelArg::I32(int(32, true)? as u32 as i32),
        Dtype::I64 => KernelArg::I64(int(64, true)? as i64),
        Dtype::U8 => KernelArg::U8(int(8, false)? as u8),
        Dtype::U16 => KernelArg::U16(int(16, false)? as u16),
        Dtype::U32 => KernelArg::U32(int(32, false)? as u32),
        Dtype::U64 => KernelArg::U64(int(64, false)?),
        Dtype::Fp16 => KernelArg::F16(half::f16::from_f64(float()?)),
        Dtype::Bf16 => KernelArg::Bf16(half::bf16::from_f64(float()?)),
        Dtype::Fp32 => KernelArg::F32(float()? as f32),
        Dtype::Fp64 => KernelArg::F64(float()?),
        Dtype::Fp8E4Nv | Dtype::Fp8E5 => {
            return Err(format!("{} is a pointer element type only", d.name()))
        }
    })
}

/// A scalar from the bytes of a one-element tensor of dtype `d` (little-endian).
fn scalar_from_bytes(d: Dtype, b: &[u8]) -> KernelArg {
    let mut w = [0u8; 8];
    w[..b.len().min(8)].copy_from_slice(&b[..b.len().min(8)]);
    let u = u64::from_le_bytes(w);
    match d {
        Dtype::I1 => KernelArg::Bool(u & 0xff != 0),
        Dtype::I8 => KernelArg::I8(u as u8 as i8),
        Dtype::I16 => KernelArg::I16(u as u16 as i16),
        Dtype::I32 => KernelArg::I32(u as u32 as i32),
        Dtype::I64 => KernelArg::I64(u as i64),
        Dtype::U8 => KernelArg::U8(u as u8),
        Dtype::U16 => KernelArg::U16(u as u16),
        Dtype::U32 => KernelArg::U32(u as u32),
        Dtype::U64 => KernelArg::U64(u),
        Dtype::Fp16 => KernelArg::F16(half::f16::from_bits(u as u16)),
        Dtype::Bf16 => KernelArg::Bf16(half::bf16::from_bits(u as u16)),
        Dtype::Fp32 => KernelArg::F32(f32::from_bits(u as u32)),
        Dtype::Fp64 | Dtype::Fp8E4Nv | Dtype::Fp8E5 => KernelArg::F64(f64::from_bits(u)),
    }
}

/// Parse `--zeros NAME=DTYPE:D0xD1...`.
pub fn parse_zeros(s: &str) -> Result<(String, HostTensor), String> {
    let bad = || format!("--zeros {s:?}: expected NAME=DTYPE:SHAPE, e.g. out_ptr=fp16:256x128");
    let (name, rest) = s.split_once('=').ok_or_else(bad)?;
    let (dtype, shape) = rest.split_once(':').ok_or_else(bad)?;
    let dtype = Dtype::parse(dtype.trim()).ok_or_else(|| {
        format!(
            "--zeros {s:?}: unknown dtype {:?} (Triton's spelling: fp32, fp16, bf16, i32, u8, ...)",
            dtype.trim()
        )
    })?;
    let shape = shape
        .split('x')
        .map(|d| d.trim().parse::<usize>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| bad())?;
    let n = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .and_then(|n| n.checked_mul(dtype.size_bytes()))
        .ok_or_else(|| format!("--zeros {s:?}: shape too large"))?;
    Ok((
        name.trim().to_string(),
        HostTensor {
            dtype,
            shape,
            bytes: vec![0; n],
        },
    ))
}

/// Parse `--grid X[,Y[,Z]]`.
pub fn parse_grid(s: &str) -> Result<[u32; 3], String> {
    let parts: Vec<&str> = s.split(',').collect();
    if parts.is_empty() || parts.len() > 3 {
        return Err(format!("--grid {s:?}: expected X, X,Y or X,Y,Z"));
    }
    let mut g = [1u32; 3];
    for (i, p) in parts.iter().enumerate() {
        g[i] = p
            .trim()
            .parse()
            .map_err(|_| format!("--grid {s:?}: {p:?} is not a non-negative integer"))?;
    }
    Ok(g)
}

/// Bind every signature argument of `v` by name: tensors from `inputs` (then `zeros`),
/// scalars from `scalars` (`NAME=VALUE`, then one-element tensors of `inputs`); check
/// `outputs` name tensor arguments. Nothing touches a GPU.
///
/// Errors (each naming the variant, the argument and what was expected): an argument
/// given nowhere, a name that is no argument of the kernel, a tensor of the wrong dtype,
/// a scalar that does not parse as its type, an argument given twice.
pub fn bind(
    v: &Variant,
    inputs: Option<&SafeTensors>,
    scalars: &[String],
    zeros: &[String],
    outputs: &[String],
) -> anyhow::Result<Vec<Bound>> {
    let k = &v.id;
    let arg_of = |name: &str| v.signature.iter().find(|a| a.name == name);
    let names = || v.signature_string();
    let mut flags: BTreeMap<String, String> = BTreeMap::new();
    for s in scalars {
        let (n, val) = s
            .split_once('=')
            .ok_or_else(|| anyhow!("--arg {s:?}: expected NAME=VALUE"))?;
        let n = n.trim().to_string();
        match arg_of(&n) {
            None => bail!("kernel {k}: --arg {n}: the kernel has no argument {n} (its arguments: {})", names()),
            Some(a) if !matches!(a.ty, ArgType::Scalar(_)) => bail!(
                "kernel {k}: --arg {n}: argument {n} is {}, not a scalar: give it as a tensor in --inputs or --zeros",
                a.ty
            ),
            _ => {}
        }
        if flags.insert(n.clone(), val.to_string()).is_some() {
            bail!("kernel {k}: --arg {n} was given twice");
        }
    }
    let mut zero: BTreeMap<String, HostTensor> = BTreeMap::new();
    for z in zeros {
        let (n, t) = parse_zeros(z).map_err(|m| anyhow!("kernel {k}: {m}"))?;
        match arg_of(&n) {
            None => bail!(
                "kernel {k}: --zeros {n}: the kernel has no argument {n} (its arguments: {})",
                names()
            ),
            Some(a) if matches!(a.ty, ArgType::Scalar(_)) => {
                bail!(
                    "kernel {k}: --zeros {n}: argument {n} is a scalar ({}); use --arg",
                    a.ty
                )
            }
            _ => {}
        }
        if inputs.is_some_and(|st| st.tensor(&n).is_ok()) {
            bail!("kernel {k}: argument {n} is both in --inputs and in --zeros");
        }
        if zero.insert(n.clone(), t).is_some() {
            bail!("kernel {k}: --zeros {n} was given twice");
        }
    }
    for o in outputs {
        match arg_of(o) {
            None => bail!(
                "kernel {k}: --outputs {o}: the kernel has no argument {o} (its arguments: {})",
                names()
            ),
            Some(a) if matches!(a.ty, ArgType::Scalar(_)) => {
                bail!(
                    "kernel {k}: --outputs {o}: argument {o} is a scalar ({}), not a tensor",
                    a.ty
                )
            }
            _ => {}
        }
    }
    let mut out = Vec::with_capacity(v.signature.len());
    for (i, a) in v.signature.iter().enumerate() {
        let what =
            |rest: String| anyhow!("kernel {k}: argument {i} ({}: {}): {rest}", a.name, a.ty);
        let from_file = inputs.and_then(|st| st.tensor(&a.name).ok());
        match a.ty {
            ArgType::Scalar(d) => {
                let flag = flags.get(&a.name);
                let b = match (flag, from_file) {
                    (Some(_), Some(_)) => {
                        return Err(what("given both by --arg and in --inputs".into()))
                    }
                    (Some(s), None) => {
                        parse_scalar(d, s).map_err(|m| what(format!("--arg: {m}")))?
                    }
                    (None, Some(t)) => {
                        let td = triton_dtype(t.dtype());
                        let n: usize = t.shape().iter().product();
                        if td != Some(d) || n != 1 {
                            return Err(what(format!(
                                "the tensor in --inputs is {:?} {:?}; a scalar input must be one {} element",
                                t.dtype(),
                                t.shape(),
                                d.name()
                            )));
                        }
                        scalar_from_bytes(d, t.data())
                    }
                    (None, None) => {
                        return Err(what(format!("not given: pass --arg {}=VALUE", a.name)))
                    }
                };
                out.push(Bound::Scalar(b));
            }
            ArgType::Ptr(_) | ArgType::TensorDesc(_) => {
                let t = match (from_file, zero.remove(&a.name)) {
                    (Some(t), None) => {
                        let dtype = triton_dtype(t.dtype()).ok_or_else(|| {
                            what(format!("the tensor in --inputs has dtype {:?}, which no Triton type matches", t.dtype()))
                        })?;
                        HostTensor {
                            dtype,
                            shape: t.shape().to_vec(),
                            bytes: t.data().to_vec(),
                        }
                    }
                    (None, Some(z)) => z,
                    (None, None) => {
                        return Err(what(format!(
                        "no tensor named {} in {}; give one there or with --zeros {}=DTYPE:SHAPE",
                        a.name,
                        if inputs.is_some() {
                            "--inputs"
                        } else {
                            "the inputs (no --inputs given)"
                        },
                        a.name
                    )))
                    }
                    (Some(_), Some(_)) => unreachable!("refused above"),
                };
                let want = match a.ty {
                    ArgType::Ptr(d) => d,
                    ArgType::TensorDesc(t) => Some(t.dtype),
                    ArgType::Scalar(_) => None,
                };
                if let Some(d) = want {
                    if t.dtype != d {
                        return Err(what(format!(
                            "the tensor is {} {:?}; expected {} elements ({:?} in safetensors)",
                            t.dtype.name(),
                            t.shape,
                            d.name(),
                            st_dtype(d)
                        )));
                    }
                }
                if let ArgType::TensorDesc(dt) = a.ty {
                    if t.shape.len() != dt.ndim() {
                        return Err(what(format!(
                            "the tensor has shape {:?}; a {}-dimensional tensor is expected",
                            t.shape,
                            dt.ndim()
                        )));
                    }
                    out.push(Bound::Desc(t));
                } else {
                    out.push(Bound::Ptr(t));
                }
            }
        }
    }
    Ok(out)
}

/// The variant `name` names: a variant id, or the variants of a kernel name (all share one
/// signature; the one launched is picked for the device later).
fn variants_named<'a>(store: &'a ArtifactStore, name: &str) -> anyhow::Result<Vec<&'a Variant>> {
    if let Ok(v) = store.variant(name) {
        return Ok(vec![v]);
    }
    let vs = store.variants(name);
    if vs.is_empty() {
        let mut kernels: Vec<&str> = store
            .all_variants()
            .iter()
            .map(|v| v.kernel.as_str())
            .collect();
        kernels.dedup();
        bail!(
            "{} has no kernel or variant named {name} (kernels: {}; `tritonrt inspect` lists the variants)",
            store.manifest_path().display(),
            kernels.join(", ")
        );
    }
    Ok(vs)
}

/// `tritonrt launch`.
pub fn launch(a: LaunchArgs) -> anyhow::Result<i32> {
    let grid = parse_grid(&a.grid).map_err(|m| anyhow!(m))?;
    if !a.outputs.is_empty() && a.out.is_none() {
        bail!("--outputs needs --out FILE (where the output tensors are written)");
    }
    let store = ArtifactStore::open(&a.ptx.ptx_cache)
        .with_context(|| format!("opening ptx_cache {}", a.ptx.ptx_cache.display()))?;
    let bytes = match &a.inputs {
        Some(p) => Some(std::fs::read(p).with_context(|| format!("reading {}", p.display()))?),
        None => None,
    };
    let st = match (&bytes, &a.inputs) {
        (Some(b), Some(p)) => Some(
            SafeTensors::deserialize(b)
                .with_context(|| format!("{} is not a safetensors file", p.display()))?,
        ),
        _ => None,
    };
    let candidates = variants_named(&store, &a.kernel)?;
    // Bind against the signature first (shared by every variant of a kernel): errors
    // come before any GPU work.
    bind(candidates[0], st.as_ref(), &a.args, &a.zeros, &a.outputs)?;

    let device = Device::new(a.device)?;
    let variant = if candidates.len() == 1 && candidates[0].id == a.kernel {
        candidates[0].clone()
    } else {
        store.select_for_device(&a.kernel, device.cc())?.clone()
    };
    let bound = bind(&variant, st.as_ref(), &a.args, &a.zeros, &a.outputs)?;
    let rt = Runtime::new(device.clone(), store, CubinCache::from_env()?);
    let kernel = rt.kernel(&variant.id)?;
    let stream = device.new_stream()?;
    let drv = |what: &'static str| move |e| tritonrt::driver::driver_err(what, e);

    let mut bufs = Vec::new();
    for b in &bound {
        if let Bound::Ptr(t) | Bound::Desc(t) = b {
            let mut d = stream
                .alloc_zeros::<u8>(t.bytes.len().max(1))
                .map_err(drv("allocating an argument's tensor"))?;
            if !t.bytes.is_empty() {
                stream
                    .memcpy_htod(&t.bytes, &mut d)
                    .map_err(drv("copying an argument's tensor to the device"))?;
            }
            bufs.push(Some(d));
        } else {
            bufs.push(None);
        }
    }
    let mut args = Vec::with_capacity(bound.len());
    for (i, b) in bound.iter().enumerate() {
        args.push(match b {
            Bound::Scalar(s) => *s,
            Bound::Ptr(t) => {
                let d = bufs[i].as_ref().expect("allocated above");
                KernelArg::Buf(DeviceBuf::of(d, &stream).as_dtype(t.dtype))
            }
            Bound::Desc(t) => {
                let d = bufs[i].as_ref().expect("allocated above");
                let buf = DeviceBuf::of(d, &stream).as_dtype(t.dtype);
                let shape: Vec<i64> = t.shape.iter().map(|&s| s as i64).collect();
                KernelArg::TensorDesc(TensorDescArg::contiguous(buf, &shape).map_err(|m| {
                    anyhow!(
                        "kernel {}: argument {}: {m}",
                        variant.id,
                        variant.signature[i].name
                    )
                })?)
            }
        });
    }
    kernel.launch(&stream, grid, &args)?;
    stream.synchronize().map_err(drv("running the kernel"))?;
    println!(
        "launched {} on {} (sm_{}): grid {:?}, {} warps, {} bytes shared",
        variant.id,
        device.name(),
        device.arch(),
        grid,
        variant.num_warps,
        variant.shared
    );

    if let Some(path) = &a.out {
        let mut host: Vec<(String, HostTensor)> = Vec::new();
        for o in &a.outputs {
            let i = variant
                .signature
                .iter()
                .position(|s| &s.name == o)
                .expect("bind checked the name");
            let (Bound::Ptr(t) | Bound::Desc(t)) = &bound[i] else {
                unreachable!("bind checked it is a tensor")
            };
            let mut bytes = vec![0u8; t.bytes.len()];
            if !bytes.is_empty() {
                stream
                    .memcpy_dtoh(bufs[i].as_ref().expect("allocated"), &mut bytes)
                    .map_err(drv("copying an output to the host"))?;
            }
            host.push((
                o.clone(),
                HostTensor {
                    dtype: t.dtype,
                    shape: t.shape.clone(),
                    bytes,
                },
            ));
        }
        stream.synchronize().map_err(drv("copying outputs"))?;
        let views = host
            .iter()
            .map(|(n, t)| {
                TensorView::new(st_dtype(t.dtype), t.shape.clone(), &t.bytes)
                    .map(|v| (n.clone(), v))
                    .map_err(|e| anyhow!("output {n}: {e}"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let mut meta = std::collections::HashMap::new();
        meta.insert("variant".to_string(), variant.id.clone());
        let data = safetensors::serialize(views, Some(meta))?;
        tritonrt::artifact::write_atomic(path, &data)?;
        println!(
            "wrote {} ({})",
            path.display(),
            host.iter()
                .map(|(n, t)| format!("{n}: {} {:?}", t.dtype.name(), t.shape))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }

    if a.repeat > 0 {
        let (e0, e1) = (device.new_event(true)?, device.new_event(true)?);
        let mut us = Vec::with_capacity(a.repeat);
        for _ in 0..a.repeat {
            e0.record(&stream).map_err(drv("recording an event"))?;
            kernel.launch(&stream, grid, &args)?;
            e1.record(&stream).map_err(drv("recording an event"))?;
            e1.synchronize().map_err(drv("waiting for an event"))?;
            us.push(e0.elapsed_ms(&e1).map_err(drv("reading an event"))? as f64 * 1e3);
        }
        us.sort_by(f64::total_cmp);
        println!(
            "{} launches: median {:.2} us, min {:.2} us (GPU time, CUDA events)",
            a.repeat,
            us[us.len() / 2],
            us[0]
        );
    }
    Ok(EXIT_OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalars_parse_by_type() {
        assert_eq!(parse_scalar(Dtype::I32, "-1").unwrap(), KernelArg::I32(-1));
        assert_eq!(
            parse_scalar(Dtype::I32, "4294967295").unwrap(),
            KernelArg::I32(-1)
        );
        assert!(parse_scalar(Dtype::I32, "4294967296")
            .unwrap_err()
            .contains("does not fit i32"));
        assert!(parse_scalar(Dtype::U8, "-1")
            .unwrap_err()
            .contains("does not fit u8"));
        assert!(parse_scalar(Dtype::I64, "1.5")
            .unwrap_err()
            .contains("not an integer (i64 expected)"));
        assert_eq!(
            parse_scalar(Dtype::I1, "true").unwrap(),
            KernelArg::Bool(true)
        );
        assert!(parse_scalar(Dtype::I1, "2").is_err());
        assert_eq!(
            parse_scalar(Dtype::Fp16, "0.5").unwrap(),
            KernelArg::F16(half::f16::from_f32(0.5))
        );
        assert_eq!(
            parse_scalar(Dtype::Bf16, "-2").unwrap(),
            KernelArg::Bf16(half::bf16::from_f32(-2.0))
        );
        assert!(
            matches!(parse_scalar(Dtype::Fp32, "nan").unwrap(), KernelArg::F32(x) if x.is_nan())
        );
        assert_eq!(
            parse_scalar(Dtype::Fp64, "inf").unwrap(),
            KernelArg::F64(f64::INFINITY)
        );
        assert!(parse_scalar(Dtype::Fp32, "x")
            .unwrap_err()
            .contains("fp32 expected"));
    }

    #[test]
    fn grid_and_zeros() {
        assert_eq!(parse_grid("4").unwrap(), [4, 1, 1]);
        assert_eq!(parse_grid("4, 2,3").unwrap(), [4, 2, 3]);
        assert!(parse_grid("1,2,3,4").is_err());
        assert!(parse_grid("-1").is_err());
        let (n, t) = parse_zeros("o=fp16:4x8").unwrap();
        assert_eq!(
            (n.as_str(), t.dtype, t.shape.clone(), t.bytes.len()),
            ("o", Dtype::Fp16, vec![4, 8], 64)
        );
        assert!(parse_zeros("o=fp17:4")
            .unwrap_err()
            .contains("unknown dtype"));
        assert!(parse_zeros("o:4").is_err());
    }
}
