//! Safetensors input and output of one indexer step (issue 3), in the upstream layouts.
//!
//! Input file: tensors
//! - `query` `[B, H, 1, D]` F32/BF16/F16,
//! - `key` `[B, H_kv, S, D]`, the dtype of `query`,
//! - `pq_centroids` `[B, H_kv, M, K, d_c]` F32 (`d_c = D/M`, or `D/M + 1` for ip),
//! - `pq_codebook` `[B, N, H_kv, M]` I64 (`N <= S - init_offset`),
//! - `pq_ip2l2_phi` `[B * H_kv * M]` F32, required for metric ip (ignored otherwise),
//!
//! and the config as string values in `__metadata__` under `sink_size`, `window_size`,
//! `heavy_size`, `init_offset`, `pq_group_factor`, `pq_bits`, `metric` (optionally
//! `weight_dtype`), each replaced by the matching [`PqConfigOverrides`] field when set.
//! The three sizes are a count (`"128"`) or a ratio of `S` written with a decimal point
//! (`"0.1"`: `floor(0.1 * S)` at each step; spec "Sizes given as ratios"); files written
//! here hold them as [`Size`]'s `Display` writes them, so both forms round-trip and a
//! file with integers keeps meaning counts.
//! `pq_group_factor`, `pq_bits` and `metric` may be left out: they are then read off the
//! centroids' shape (`M`, `K = 2^bits`, `d_c`); when given they must agree with it.
//! `weight_dtype` defaults to the query's dtype (as upstream).
//!
//! A ragged batch (spec "Ragged batches") adds `seq_lens` I64 `[B]` (each `S_b <= S`, the
//! key tensor's length) and optionally `n_cached` I64 `[B]` ([`read_ragged`],
//! [`write_ragged_inputs`]); its outputs are padded ([`write_ragged_outputs`]).
//!
//! Output file: `sparse_list` I64 `[B, H, total]`, `sparse_len` I64 `[B, H]`,
//! `weight_list` `[B, H, S]` in `weight_dtype`, `pq_codebook` I64 `[B, n, H_kv, M]`, plus
//! the config in `__metadata__`. Every file is written atomically: a temporary file in the
//! target directory, synced, then renamed over the target, so a failure never leaves a
//! partial file behind.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors};

use super::config::{DType, Metric, PqConfig, PqConfigOverrides, Shape, Size};
use super::ragged::{RaggedInputs, RaggedOutput};
use super::reference::PqOutput;
use super::workload::PqInputs;
use crate::artifact::write_atomic;
use crate::error::{Error, Result};

/// Input tensor names.
pub const QUERY: &str = "query";
/// Input tensor name of the keys.
pub const KEY: &str = "key";
/// Input tensor name of the centroids.
pub const CENTROIDS: &str = "pq_centroids";
/// Input and output tensor name of the codes (upstream layout).
pub const CODEBOOK: &str = "pq_codebook";
/// Input tensor name of the ip-to-l2 constants.
pub const PHI: &str = "pq_ip2l2_phi";
/// Output tensor name of the sparse index list.
pub const SPARSE_LIST: &str = "sparse_list";
/// Output tensor name of the row lengths.
pub const SPARSE_LEN: &str = "sparse_len";
/// Output tensor name of the 0/1 weights.
pub const WEIGHT_LIST: &str = "weight_list";
/// Input and output tensor name of a ragged batch's lengths, i64 `[B]`.
pub const SEQ_LENS: &str = "seq_lens";
/// Input and output tensor name of a ragged batch's cached-code counts, i64 `[B]`.
pub const N_CACHED: &str = "n_cached";

fn dtype_name(d: Dtype) -> String {
    format!("{d:?}")
}

fn to_st(d: DType) -> Dtype {
    match d {
        DType::F32 => Dtype::F32,
        DType::BF16 => Dtype::BF16,
        DType::F16 => Dtype::F16,
    }
}

fn from_st(d: Dtype) -> Option<DType> {
    match d {
        Dtype::F32 => Some(DType::F32),
        Dtype::BF16 => Some(DType::BF16),
        Dtype::F16 => Some(DType::F16),
        _ => None,
    }
}

/// A whole safetensors file in memory, its header checked.
struct Loaded {
    path: PathBuf,
    bytes: Vec<u8>,
}

impl Loaded {
    fn read(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| Error::io("reading", path, e))?;
        let l = Loaded {
            path: path.to_path_buf(),
            bytes,
        };
        l.preflight()?;
        Ok(l)
    }

    fn file_err(&self, msg: String) -> Error {
        Error::SafetensorsFile {
            path: self.path.clone(),
            msg,
        }
    }

    /// Size checks with messages that say "truncated" when that is what happened.
    fn preflight(&self) -> Result<()> {
        let len = self.bytes.len();
        if len < 8 {
            return Err(self.file_err(format!(
                "file is {len} bytes, shorter than the 8-byte header-length prefix"
            )));
        }
        let n = u64::from_le_bytes(self.bytes[..8].try_into().expect("8 bytes"));
        if n > (len - 8) as u64 {
            return Err(self.file_err(format!(
                "header-length prefix says {n} bytes but only {} bytes follow (truncated, or \
                 not a safetensors file)",
                len - 8
            )));
        }
        let header = &self.bytes[8..8 + n as usize];
        let json: serde_json::Value = std::str::from_utf8(header)
            .ok()
            .and_then(|s| serde_json::from_str(s).ok())
            .ok_or_else(|| {
                self.file_err(format!(
                    "the {n}-byte header is not a JSON object (not a safetensors file?)"
                ))
            })?;
        let obj = json
            .as_object()
            .ok_or_else(|| self.file_err("the header is not a JSON object".into()))?;
        let mut data_end = 0u64;
        for (name, info) in obj {
            if name == "__metadata__" {
                continue;
            }
            if let Some(end) = info
                .get("data_offsets")
                .and_then(|o| o.get(1))
                .and_then(|e| e.as_u64())
            {
                data_end = data_end.max(end);
            }
        }
        let avail = (len - 8) as u64 - n;
        if data_end > avail {
            return Err(self.file_err(format!(
                "truncated: the tensors need {data_end} bytes of data after the {n}-byte \
                 header, but only {avail} are present"
            )));
        }
        Ok(())
    }

    fn tensors(&self) -> Result<SafeTensors<'_>> {
        SafeTensors::deserialize(&self.bytes).map_err(|e| self.file_err(e.to_string()))
    }
}

/// A tensor error naming the file.
fn tensor_err(path: &Path, tensor: &str, expected: String, got: String) -> Error {
    Error::PqTensor {
        file: Some(path.to_path_buf()),
        tensor: tensor.into(),
        expected,
        got,
    }
}

/// A decoded tensor: dtype, shape and values.
struct Tensor<T> {
    dtype: Dtype,
    shape: Vec<usize>,
    values: Vec<T>,
}

/// Look a tensor up, or say which tensors the file has.
fn view<'a>(
    st: &SafeTensors<'a>,
    path: &Path,
    name: &str,
    expected: &str,
) -> Result<Option<safetensors::tensor::TensorView<'a>>> {
    match st.tensor(name) {
        Ok(v) => Ok(Some(v)),
        Err(safetensors::SafeTensorError::TensorNotFound(_)) => Ok(None),
        Err(e) => Err(tensor_err(path, name, expected.into(), e.to_string())),
    }
}

fn missing(st: &SafeTensors<'_>, path: &Path, name: &str, expected: &str) -> Error {
    let mut names = st.names();
    names.sort_unstable();
    tensor_err(
        path,
        name,
        expected.into(),
        format!("no such tensor (the file has: {})", names.join(", ")),
    )
}

/// Decode a float tensor (F32/BF16/F16) to f32.
fn floats(
    st: &SafeTensors<'_>,
    path: &Path,
    name: &str,
    allowed: &[Dtype],
    expected: &str,
    required: bool,
) -> Result<Option<Tensor<f32>>> {
    let Some(v) = view(st, path, name, expected)? else {
        return if required {
            Err(missing(st, path, name, expected))
        } else {
            Ok(None)
        };
    };
    if !allowed.contains(&v.dtype()) {
        return Err(tensor_err(
            path,
            name,
            expected.into(),
            format!("dtype {} with shape {:?}", dtype_name(v.dtype()), v.shape()),
        ));
    }
    let data = v.data();
    let values: Vec<f32> = match v.dtype() {
        Dtype::F32 => data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect(),
        Dtype::BF16 => data
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::F16 => data
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        _ => unreachable!("dtype checked above"),
    };
    Ok(Some(Tensor {
        dtype: v.dtype(),
        shape: v.shape().to_vec(),
        values,
    }))
}

/// Decode an I64 tensor.
fn ints(st: &SafeTensors<'_>, path: &Path, name: &str, expected: &str) -> Result<Tensor<i64>> {
    let v = view(st, path, name, expected)?.ok_or_else(|| missing(st, path, name, expected))?;
    if v.dtype() != Dtype::I64 {
        return Err(tensor_err(
            path,
            name,
            expected.into(),
            format!("dtype {} with shape {:?}", dtype_name(v.dtype()), v.shape()),
        ));
    }
    let values = v
        .data()
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect();
    Ok(Tensor {
        dtype: Dtype::I64,
        shape: v.shape().to_vec(),
        values,
    })
}

/// An I64 tensor whose shape passes `shape_ok`; otherwise the error names the tensor, what
/// was expected and the shape found.
fn ints_shaped(
    st: &SafeTensors<'_>,
    path: &Path,
    name: &str,
    expected: &str,
    shape_ok: impl Fn(&[usize]) -> bool,
) -> Result<Tensor<i64>> {
    let t = ints(st, path, name, expected)?;
    if !shape_ok(&t.shape) {
        return Err(tensor_err(
            path,
            name,
            expected.into(),
            format!("shape {:?}", t.shape),
        ));
    }
    Ok(t)
}

/// One config value: override, else `__metadata__`, else `fallback`, else an error.
fn meta_value<T: std::str::FromStr>(
    path: &Path,
    meta: &HashMap<String, String>,
    key: &'static str,
    flag: &'static str,
    over: Option<T>,
    fallback: Option<T>,
    expected: &str,
) -> Result<T> {
    if let Some(v) = over {
        return Ok(v);
    }
    if let Some(txt) = meta.get(key) {
        return txt.trim().parse::<T>().map_err(|_| Error::PqConfig {
            field: key,
            value: txt.clone(),
            expected: format!("{expected} (__metadata__ of {})", path.display()),
        });
    }
    fallback.ok_or(Error::PqMissingConfig {
        path: path.to_path_buf(),
        key,
        flag,
    })
}

/// A pattern size from `__metadata__` (or its flag's override): a count (`"128"`) or a
/// ratio of `S` (`"0.1"`), as [`Size::parse_field`] reads it.
fn meta_size(
    path: &Path,
    meta: &HashMap<String, String>,
    key: &'static str,
    flag: &'static str,
    over: Option<Size>,
) -> Result<Size> {
    if let Some(v) = over {
        return Ok(v);
    }
    let txt = meta.get(key).ok_or_else(|| Error::PqMissingConfig {
        path: path.to_path_buf(),
        key,
        flag,
    })?;
    Size::parse_field(key, txt).map_err(|e| match e {
        Error::PqConfig {
            field,
            value,
            expected,
        } => Error::PqConfig {
            field,
            value,
            expected: format!("{expected} (__metadata__ of {})", path.display()),
        },
        other => other,
    })
}

/// Read a step's inputs and config from a safetensors file (see the module docs).
///
/// Shapes are inferred from `query` and `key` and cross-checked against the other
/// tensors and the config. Errors: [`Error::Io`] (unreadable file),
/// [`Error::SafetensorsFile`] (too short, truncated, bad header), [`Error::PqTensor`]
/// (missing tensor, wrong dtype or shape, code out of range: names the tensor, the
/// expected dtype/shape and what was found), [`Error::PqMissingConfig`],
/// [`Error::PqConfig`].
pub fn read_inputs(path: &Path, over: &PqConfigOverrides) -> Result<(PqConfig, PqInputs)> {
    let file = Loaded::read(path)?;
    let st = file.tensors()?;
    let (_, md) =
        SafeTensors::read_metadata(&file.bytes).map_err(|e| file.file_err(e.to_string()))?;
    let meta = md.metadata().clone().unwrap_or_default();
    let fl = [Dtype::F32, Dtype::BF16, Dtype::F16];

    let q_exp = "dtype F32, BF16 or F16 with shape [B, H, 1, D]";
    let q = floats(&st, path, QUERY, &fl, q_exp, true)?.expect("required");
    if q.shape.len() != 4 || q.shape[2] != 1 {
        return Err(tensor_err(
            path,
            QUERY,
            q_exp.into(),
            format!("shape {:?}", q.shape),
        ));
    }
    let (b, h, d) = (q.shape[0], q.shape[1], q.shape[3]);
    let k_exp = format!(
        "dtype {} (the dtype of `query`) with shape [B={b}, H_kv, S, D={d}]",
        dtype_name(q.dtype)
    );
    let key = floats(&st, path, KEY, &[q.dtype], &k_exp, true)?.expect("required");
    if key.shape.len() != 4 || key.shape[0] != b || key.shape[3] != d {
        return Err(tensor_err(
            path,
            KEY,
            k_exp,
            format!("shape {:?}", key.shape),
        ));
    }
    let (h_kv, s) = (key.shape[1], key.shape[2]);
    let shape = Shape { b, h, h_kv, s, d };

    let c_exp = format!("dtype F32 with shape [B={b}, H_kv={h_kv}, M, K, d_c]");
    let cent = floats(&st, path, CENTROIDS, &[Dtype::F32], &c_exp, true)?.expect("required");
    if cent.shape.len() != 5 || cent.shape[0] != b || cent.shape[1] != h_kv {
        return Err(tensor_err(
            path,
            CENTROIDS,
            c_exp,
            format!("shape {:?}", cent.shape),
        ));
    }
    let (m_shape, k_shape, dc_shape) = (cent.shape[2], cent.shape[3], cent.shape[4]);
    let bits_shape = (k_shape.is_power_of_two() && k_shape >= 2)
        .then(|| k_shape.trailing_zeros())
        .filter(|&b| b <= 8);
    let metric_shape = if m_shape > 0 && d.is_multiple_of(m_shape) {
        if dc_shape == d / m_shape {
            Some(Metric::Euclidean)
        } else if dc_shape == d / m_shape + 1 {
            Some(Metric::Ip)
        } else {
            None
        }
    } else {
        None
    };

    let uint = "an unsigned integer";
    let input_dtype = from_st(q.dtype).expect("float dtype");
    if let Some(want) = over.input_dtype {
        if want != input_dtype {
            return Err(tensor_err(
                path,
                QUERY,
                format!("dtype {want} (as requested by --dtype)"),
                format!("dtype {input_dtype}"),
            ));
        }
    }
    let cfg = PqConfig {
        sink_size: meta_size(path, &meta, "sink_size", "sink-size", over.sink_size)?,
        window_size: meta_size(path, &meta, "window_size", "window-size", over.window_size)?,
        heavy_size: meta_size(path, &meta, "heavy_size", "heavy-size", over.heavy_size)?,
        init_offset: meta_value(
            path,
            &meta,
            "init_offset",
            "init-offset",
            over.init_offset,
            None,
            uint,
        )?,
        pq_group_factor: meta_value(
            path,
            &meta,
            "pq_group_factor",
            "pq-group-factor",
            over.pq_group_factor,
            Some(m_shape),
            uint,
        )?,
        pq_bits: meta_value(
            path,
            &meta,
            "pq_bits",
            "pq-bits",
            over.pq_bits,
            bits_shape,
            "an integer in 1..=8",
        )?,
        metric: meta_value(
            path,
            &meta,
            "metric",
            "metric",
            over.metric,
            metric_shape,
            "euclidean or ip",
        )?,
        input_dtype,
        weight_dtype: meta_value(
            path,
            &meta,
            "weight_dtype",
            "weight-dtype",
            over.weight_dtype,
            Some(input_dtype),
            "fp32, bf16 or fp16",
        )?,
    };
    cfg.validate(&shape)?;
    let (mm, kk, dc) = (cfg.pq_group_factor, cfg.k_centroids(), cfg.d_c(d));
    if cent.shape[2..] != [mm, kk, dc] {
        return Err(tensor_err(
            path,
            CENTROIDS,
            format!(
                "dtype F32 with shape [B={b}, H_kv={h_kv}, M={mm}, K={kk}, d_c={dc}] (from \
                 pq_group_factor={mm}, pq_bits={}, metric {} with D={d})",
                cfg.pq_bits, cfg.metric
            ),
            format!("shape {:?}", cent.shape),
        ));
    }

    let n_max = cfg.n_quantized(s);
    let cb_exp = format!(
        "dtype I64 with shape [B={b}, N, H_kv={h_kv}, M={mm}], N <= S - init_offset = {n_max}"
    );
    let cb = ints_shaped(&st, path, CODEBOOK, &cb_exp, |s| {
        s.len() == 4 && s[0] == b && s[2] == h_kv && s[3] == mm && s[1] <= n_max
    })?;
    let n_cached = cb.shape[1];
    if let Some((i, &c)) = cb
        .values
        .iter()
        .enumerate()
        .find(|&(_, &c)| c < 0 || c >= kk as i64)
    {
        return Err(tensor_err(
            path,
            CODEBOOK,
            format!("codes in 0..K = 0..{kk}"),
            format!("{c} at flat index {i}"),
        ));
    }

    let p_exp = format!(
        "dtype F32 with {} values [B*H_kv*M = {b}*{h_kv}*{mm}]",
        b * h_kv * mm
    );
    let phi = floats(&st, path, PHI, &[Dtype::F32], &p_exp, false)?;
    let phi = match (cfg.metric, phi) {
        (Metric::Ip, None) => {
            return Err(missing(&st, path, PHI, &format!("{p_exp} for metric ip")));
        }
        (Metric::Ip, Some(t)) => {
            if t.values.len() != b * h_kv * mm {
                return Err(tensor_err(path, PHI, p_exp, format!("shape {:?}", t.shape)));
            }
            Some(t.values)
        }
        (Metric::Euclidean, _) => None,
    };
    let inputs = PqInputs {
        shape,
        query: q.values,
        key: key.values,
        centroids: cent.values,
        codes: cb.values,
        n_cached,
        phi,
    };
    inputs.validate(&cfg).map_err(|e| match e {
        Error::PqTensor {
            file: None,
            tensor,
            expected,
            got,
        } => Error::PqTensor {
            file: Some(path.to_path_buf()),
            tensor,
            expected,
            got,
        },
        other => other,
    })?;
    Ok((cfg, inputs))
}

/// An owned tensor ready to be serialized.
struct OwnedTensor {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl OwnedTensor {
    fn floats(values: &[f32], dtype: DType, shape: Vec<usize>) -> Self {
        let mut bytes = Vec::with_capacity(values.len() * dtype.size_bytes());
        match dtype {
            DType::F32 => values.iter().for_each(|v| bytes.extend(v.to_le_bytes())),
            DType::BF16 => values
                .iter()
                .for_each(|&v| bytes.extend(half::bf16::from_f32(v).to_le_bytes())),
            DType::F16 => values
                .iter()
                .for_each(|&v| bytes.extend(half::f16::from_f32(v).to_le_bytes())),
        }
        OwnedTensor {
            dtype: to_st(dtype),
            shape,
            bytes,
        }
    }

    fn ints(values: &[i64], shape: Vec<usize>) -> Self {
        let mut bytes = Vec::with_capacity(values.len() * 8);
        values.iter().for_each(|v| bytes.extend(v.to_le_bytes()));
        OwnedTensor {
            dtype: Dtype::I64,
            shape,
            bytes,
        }
    }
}

/// Serialize tensors + metadata and write them atomically to `path`.
fn write_tensors(
    path: &Path,
    tensors: Vec<(&str, OwnedTensor)>,
    meta: HashMap<String, String>,
) -> Result<()> {
    let mut views = Vec::with_capacity(tensors.len());
    for (name, t) in &tensors {
        let v = safetensors::tensor::TensorView::new(t.dtype, t.shape.clone(), &t.bytes).map_err(
            |e| Error::PqTensor {
                file: Some(path.to_path_buf()),
                tensor: name.to_string(),
                expected: format!("{} bytes for shape {:?}", t.bytes.len(), t.shape),
                got: e.to_string(),
            },
        )?;
        views.push((*name, v));
    }
    let bytes = safetensors::serialize(views, Some(meta)).map_err(|e| Error::SafetensorsFile {
        path: path.to_path_buf(),
        msg: format!("serializing: {e}"),
    })?;
    write_atomic(path, &bytes)
}

fn config_metadata(cfg: &PqConfig) -> HashMap<String, String> {
    [
        ("sink_size", cfg.sink_size.to_string()),
        ("window_size", cfg.window_size.to_string()),
        ("heavy_size", cfg.heavy_size.to_string()),
        ("init_offset", cfg.init_offset.to_string()),
        ("pq_group_factor", cfg.pq_group_factor.to_string()),
        ("pq_bits", cfg.pq_bits.to_string()),
        ("metric", cfg.metric.to_string()),
        ("weight_dtype", cfg.weight_dtype.to_string()),
        ("input_dtype", cfg.input_dtype.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// Write a step's inputs and config in the input format (see the module docs), for
/// example to feed the same step to `kernels_triton/reference.py`. `query`/`key` are
/// written in `cfg.input_dtype`. Errors: invalid inputs, [`Error::Io`].
pub fn write_inputs(path: &Path, cfg: &PqConfig, inputs: &PqInputs) -> Result<()> {
    write_tensors(path, input_tensors(cfg, inputs)?, config_metadata(cfg))
}

/// The input tensors of `inputs` (validated first).
fn input_tensors(cfg: &PqConfig, inputs: &PqInputs) -> Result<Vec<(&'static str, OwnedTensor)>> {
    inputs.validate(cfg)?;
    let Shape { b, h, h_kv, s, d } = inputs.shape;
    let (mm, k, dc) = (cfg.pq_group_factor, cfg.k_centroids(), cfg.d_c(d));
    let mut tensors = vec![
        (
            QUERY,
            OwnedTensor::floats(&inputs.query, cfg.input_dtype, vec![b, h, 1, d]),
        ),
        (
            KEY,
            OwnedTensor::floats(&inputs.key, cfg.input_dtype, vec![b, h_kv, s, d]),
        ),
        (
            CENTROIDS,
            OwnedTensor::floats(&inputs.centroids, DType::F32, vec![b, h_kv, mm, k, dc]),
        ),
        (
            CODEBOOK,
            OwnedTensor::ints(&inputs.codes, vec![b, inputs.n_cached, h_kv, mm]),
        ),
    ];
    if let (Metric::Ip, Some(phi)) = (cfg.metric, &inputs.phi) {
        tensors.push((
            PHI,
            OwnedTensor::floats(phi, DType::F32, vec![b * h_kv * mm]),
        ));
    }
    Ok(tensors)
}

/// A ragged batch's lengths as a file holds them: `seq_lens` and, when present,
/// `n_cached` (i64 `[B]` each, not yet validated).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RaggedLens {
    /// `S_b` per entry.
    pub seq_lens: Vec<i64>,
    /// `N_cached[b]` per entry; None: every entry has the codes tensor's `N`.
    pub n_cached: Option<Vec<i64>>,
}

/// The ragged-batch tensors of an input file (spec "Ragged batches"): `seq_lens` i64
/// `[B]` and, when present, `n_cached` i64 `[B]`; None when the file has no `seq_lens`
/// (a fixed-`S` step). Validate them with [`RaggedInputs::new`].
///
/// Errors: as [`read_inputs`] (a tensor of another dtype or shape: [`Error::PqTensor`]).
pub fn read_ragged(path: &Path) -> Result<Option<RaggedLens>> {
    let file = Loaded::read(path)?;
    let st = file.tensors()?;
    let names = st.names();
    let has = |n: &str| names.contains(&n);
    if !has(SEQ_LENS) {
        return Ok(None);
    }
    let one_dim = |name: &str| {
        ints_shaped(&st, path, name, "dtype I64 with shape [B]", |s| {
            s.len() == 1
        })
        .map(|t| t.values)
    };
    let seq_lens = one_dim(SEQ_LENS)?;
    let n_cached = if has(N_CACHED) {
        Some(one_dim(N_CACHED)?)
    } else {
        None
    };
    Ok(Some(RaggedLens { seq_lens, n_cached }))
}

/// Write a ragged step's inputs: the fixed-shape tensors at `S_alloc`, `seq_lens` and
/// `n_cached` (i64 `[B]`), and the config. Errors: invalid inputs, [`Error::Io`].
pub fn write_ragged_inputs(path: &Path, cfg: &PqConfig, x: &RaggedInputs) -> Result<()> {
    let mut tensors = input_tensors(cfg, &x.inputs)?;
    let b = x.batch();
    let as_i64 = |v: &[usize]| v.iter().map(|&x| x as i64).collect::<Vec<i64>>();
    tensors.push((SEQ_LENS, OwnedTensor::ints(&as_i64(&x.seq_lens), vec![b])));
    tensors.push((N_CACHED, OwnedTensor::ints(&as_i64(&x.n_cached), vec![b])));
    write_tensors(path, tensors, config_metadata(cfg))
}

/// Write a ragged step's outputs: `sparse_list` I64 `[B, H, max total_b]` (`-1` past
/// each row's length), `sparse_len` I64 `[B, H]`, `weight_list` `[B, H, S_alloc]` in
/// `cfg.weight_dtype`, `pq_codebook` I64 `[B, max n_b, H_kv, M]`, `n_cached` I64 `[B]`
/// and `seq_lens` I64 `[B]`. Errors: inconsistent output sizes ([`Error::PqTensor`]),
/// [`Error::Io`].
pub fn write_ragged_outputs(path: &Path, cfg: &PqConfig, out: &RaggedOutput) -> Result<()> {
    let as_i64 = |v: &[usize]| v.iter().map(|&x| x as i64).collect::<Vec<i64>>();
    let (n_cached, seq_lens) = (as_i64(&out.n_cached), as_i64(&out.seq_lens));
    let parts = OutputParts {
        b: out.b,
        h: out.h,
        h_kv: out.h_kv,
        m: out.m,
        total: out.total,
        s: out.s_alloc,
        n: out.n_max,
        sparse_list: &out.sparse_list,
        sparse_len: &out.sparse_len,
        weight_list: &out.weight_list,
        codes: &out.codes,
    };
    write_output_parts(
        path,
        cfg,
        &parts,
        vec![(N_CACHED, &n_cached[..]), (SEQ_LENS, &seq_lens[..])],
    )
}

/// Write a step's outputs (see the module docs); `weight_list` in `cfg.weight_dtype`.
/// Errors: inconsistent output sizes ([`Error::PqTensor`]), [`Error::Io`].
pub fn write_outputs(path: &Path, cfg: &PqConfig, out: &PqOutput) -> Result<()> {
    let parts = OutputParts {
        b: out.b,
        h: out.h,
        h_kv: out.h_kv,
        m: out.m,
        total: out.total,
        s: out.s,
        n: out.n_cached,
        sparse_list: &out.sparse_list,
        sparse_len: &out.sparse_len,
        weight_list: &out.weight_list,
        codes: &out.codes,
    };
    write_output_parts(path, cfg, &parts, Vec::new())
}

/// The tensors of a step's outputs and their dimensions (`s`: the row length of
/// `weight_list`; `n`: the second dimension of the codes).
struct OutputParts<'a> {
    b: usize,
    h: usize,
    h_kv: usize,
    m: usize,
    total: usize,
    s: usize,
    n: usize,
    sparse_list: &'a [i64],
    sparse_len: &'a [i64],
    weight_list: &'a [f32],
    codes: &'a [i64],
}

/// Write `p` and `per_row` (i64 `[B]` tensors), each size checked first, with the config
/// and `seq_len = p.s` in the metadata.
fn write_output_parts(
    path: &Path,
    cfg: &PqConfig,
    p: &OutputParts<'_>,
    per_row: Vec<(&'static str, &[i64])>,
) -> Result<()> {
    let mut checks = vec![
        (SPARSE_LIST, p.sparse_list.len(), p.b * p.h * p.total),
        (SPARSE_LEN, p.sparse_len.len(), p.b * p.h),
        (WEIGHT_LIST, p.weight_list.len(), p.b * p.h * p.s),
        (CODEBOOK, p.codes.len(), p.b * p.n * p.h_kv * p.m),
    ];
    checks.extend(per_row.iter().map(|&(name, v)| (name, v.len(), p.b)));
    for (name, got, want) in checks {
        if got != want {
            return Err(Error::PqTensor {
                file: Some(path.to_path_buf()),
                tensor: name.into(),
                expected: format!("{want} values"),
                got: format!("{got} values"),
            });
        }
    }
    let mut meta = config_metadata(cfg);
    meta.insert("seq_len".into(), p.s.to_string());
    let mut tensors = vec![
        (
            SPARSE_LIST,
            OwnedTensor::ints(p.sparse_list, vec![p.b, p.h, p.total]),
        ),
        (SPARSE_LEN, OwnedTensor::ints(p.sparse_len, vec![p.b, p.h])),
        (
            WEIGHT_LIST,
            OwnedTensor::floats(p.weight_list, cfg.weight_dtype, vec![p.b, p.h, p.s]),
        ),
        (
            CODEBOOK,
            OwnedTensor::ints(p.codes, vec![p.b, p.n, p.h_kv, p.m]),
        ),
    ];
    tensors.extend(
        per_row
            .into_iter()
            .map(|(name, v)| (name, OwnedTensor::ints(v, vec![p.b]))),
    );
    write_tensors(path, tensors, meta)
}

/// Read a step's outputs back (as written by [`write_outputs`] or by
/// `kernels_triton/reference.py`): `weight_list` may be F32, BF16 or F16 and is returned
/// as f32. Errors: as [`read_inputs`].
pub fn read_outputs(path: &Path) -> Result<PqOutput> {
    let file = Loaded::read(path)?;
    let st = file.tensors()?;
    let sl = ints_shaped(
        &st,
        path,
        SPARSE_LIST,
        "dtype I64 with shape [B, H, total]",
        |s| s.len() == 3,
    )?;
    let (b, h, total) = (sl.shape[0], sl.shape[1], sl.shape[2]);
    let len_exp = format!("dtype I64 with shape [B={b}, H={h}]");
    let len = ints_shaped(&st, path, SPARSE_LEN, &len_exp, |s| s == [b, h])?;
    let w_exp = format!("dtype F32, BF16 or F16 with shape [B={b}, H={h}, S]");
    let w = floats(
        &st,
        path,
        WEIGHT_LIST,
        &[Dtype::F32, Dtype::BF16, Dtype::F16],
        &w_exp,
        true,
    )?
    .expect("required");
    if w.shape.len() != 3 || w.shape[..2] != [b, h] {
        return Err(tensor_err(
            path,
            WEIGHT_LIST,
            w_exp,
            format!("shape {:?}", w.shape),
        ));
    }
    let cb_exp = format!("dtype I64 with shape [B={b}, N, H_kv, M]");
    let cb = ints_shaped(&st, path, CODEBOOK, &cb_exp, |s| s.len() == 4 && s[0] == b)?;
    Ok(PqOutput {
        b,
        h,
        h_kv: cb.shape[2],
        m: cb.shape[3],
        s: w.shape[2],
        total,
        sparse_list: sl.values,
        sparse_len: len.values,
        weight_list: w.values,
        codes: cb.values,
        n_cached: cb.shape[1],
    })
}
