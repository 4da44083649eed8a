//! Every launch argument kind Triton 3.6 emits on sm_80 / sm_90: parsing (manifest types,
//! `import` of Triton cache entries), packing into kernel parameters (fp16 / bf16 / int /
//! uint / fp64 scalars, host tensor descriptors in TMA and decomposed form) and the
//! refusals, each naming the kernel, the argument and what was expected. No GPU.

use std::path::{Path, PathBuf};

use tritonrt::abi::{
    expand_arg, kernel_params, pack_args, pack_params, KernelArg, ParamKind, TensorDescArg,
};
use tritonrt::artifact::{
    import_triton_cache_entry, ArgType, ArtifactStore, DescType, Dtype, SignatureSource, Variant,
};
use tritonrt::driver::DeviceBuf;
use tritonrt::Error;

fn entry(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/triton_cache_args")
        .join(name)
}

/// Import one fixture entry into a fresh ptx_cache and read it back through the store
/// (so the manifest round trip and its validation are part of every test).
fn imported(name: &str) -> (tempfile::TempDir, Variant, SignatureSource) {
    let t = tempfile::tempdir().unwrap();
    let r = import_triton_cache_entry(&entry(name), t.path()).unwrap();
    let store = ArtifactStore::open(t.path()).unwrap();
    let v = store.variant(&r.variant.id).unwrap().clone();
    assert_eq!(v, r.variant);
    (t, v, r.signature_source)
}

fn buf(addr: u64, bytes: usize, dtype: Dtype) -> DeviceBuf {
    // SAFETY: these buffers never reach a driver; only packing reads their address.
    unsafe { DeviceBuf::from_raw_parts(addr, bytes, dtype) }
}

fn types(v: &Variant) -> Vec<String> {
    v.signature
        .iter()
        .map(|a| format!("{}: {}", a.name, a.ty))
        .collect()
}

#[test]
fn tensordesc_type_parses_and_prints_as_triton_spells_it() {
    let t = ArgType::parse("tensordesc<fp16[64, 64]>").unwrap();
    assert_eq!(
        t,
        ArgType::TensorDesc(DescType::new(Dtype::Fp16, &[64, 64]).unwrap())
    );
    assert_eq!(t.to_string(), "tensordesc<fp16[64, 64]>");
    // Triton 3.6 spells a bool `u1`; it is the same one-byte i1 parameter.
    assert_eq!(ArgType::parse("u1").unwrap(), ArgType::Scalar(Dtype::I1));
    assert_eq!(ArgType::parse("*u1").unwrap().to_string(), "*i1");
    assert_eq!(
        ArgType::parse("tensordesc<bf16[8,16,32]>")
            .unwrap()
            .to_string(),
        "tensordesc<bf16[8, 16, 32]>"
    );
    for bad in [
        "tensordesc<fp16>",
        "tensordesc<fp16[]>",
        "tensordesc<fp16[0, 4]>",
        "tensordesc<fp17[4]>",
        "tensordesc<fp16[1,2,3,4,5,6]>",
        "tensordesc<fp16[4]",
    ] {
        let e = ArgType::parse(bad).unwrap_err();
        assert!(
            e.contains("tensor descriptor") || e.contains("tensordesc"),
            "{bad}: {e}"
        );
    }
}

#[test]
fn expansion_of_each_kind() {
    use ParamKind as P;
    let d = ArgType::parse("tensordesc<fp32[32, 16]>").unwrap();
    let meta = tritonrt::artifact::TmaMeta {
        swizzle: 3,
        elem_size: 4,
        elem_type: 7,
        block_size: vec![32, 16],
        fp4_padded: false,
    };
    let i32_ = P::Scalar(Dtype::I32);
    let i64_ = P::Scalar(Dtype::I64);
    assert_eq!(
        expand_arg(d, Some(&meta)),
        vec![P::TmaDesc, i32_, i32_, i64_, i64_]
    );
    assert_eq!(
        expand_arg(d, None),
        vec![
            P::Ptr,
            i64_,
            i64_,
            i64_,
            i64_,
            P::Scalar(Dtype::I1),
            i32_,
            i32_,
            i64_,
            i64_
        ]
    );
    assert_eq!(
        expand_arg(ArgType::parse("*bf16").unwrap(), None),
        vec![P::Ptr]
    );
    assert_eq!(P::TmaDesc.bytes(), 128);
    assert_eq!(P::Scalar(Dtype::Bf16).bytes(), 2);
}

#[test]
fn import_scalars_of_every_width() {
    let (_t, v, src) = imported("scalars_sm90");
    assert_eq!(src, SignatureSource::Ttir);
    // TTIR integers are signless: u32 imports as i32 (same bits at launch).
    assert_eq!(
        types(&v),
        [
            "x_ptr: *fp16",
            "y_ptr: *fp16",
            "a: fp16",
            "b: bf16",
            "n: i32",
            "flag: i1",
            "c64: fp64",
            "i8v: i8",
            "i16v: i16",
            "i64v: i64",
            "u32v: i32"
        ]
    );
    assert_eq!(v.signature[0].divisibility, 16);
    assert_eq!(v.signature[1].divisibility, 1);
    assert!(v.tensordesc_meta.is_empty());

    let args = [
        KernelArg::RawPtr(0x1000),
        KernelArg::RawPtr(0x2002),
        KernelArg::F16(half::f16::from_f32(-2.0)),
        KernelArg::Bf16(half::bf16::from_f32(0.5)),
        KernelArg::I32(-3),
        KernelArg::Bool(true),
        KernelArg::F64(0.25),
        KernelArg::I8(-1),
        KernelArg::I16(-2),
        KernelArg::I64(-5),
        KernelArg::I32(7),
    ];
    let slots = pack_args(&v, &args).unwrap();
    assert_eq!(
        slots,
        vec![
            0x1000,
            0x2002,
            0xc000,
            0x3f00,
            0xffff_fffd,
            1,
            0.25f64.to_bits(),
            0xff,
            0xfffe,
            (-5i64) as u64,
            7
        ]
    );
    // A wrong scalar kind names the kernel, the argument and the type expected.
    let mut bad = args;
    bad[3] = KernelArg::F16(half::f16::ONE);
    let e = pack_args(&v, &bad).unwrap_err().to_string();
    assert!(
        e.contains(&v.id) && e.contains("argument 3 (b) expects bf16, got F16"),
        "{e}"
    );
    bad[3] = KernelArg::F32(1.0);
    let e = pack_args(&v, &bad).unwrap_err().to_string();
    assert!(e.contains("argument 3 (b) expects bf16, got F32"), "{e}");
    // Divisibility still applies to x_ptr.
    let mut bad = args;
    bad[0] = KernelArg::RawPtr(0x1008);
    let e = pack_args(&v, &bad).unwrap_err().to_string();
    assert!(e.contains("x_ptr") && e.contains("16"), "{e}");
}

#[test]
fn import_host_tensor_descriptors_lowered_to_tma() {
    let (_t, v, _) = imported("desc_scale_sm90");
    assert_eq!(
        types(&v),
        [
            "in_desc: tensordesc<fp16[64, 64]>",
            "out_desc: tensordesc<fp16[64, 64]>",
            "scale: fp16"
        ]
    );
    assert_eq!(v.tensordesc_meta.len(), 2);
    assert_eq!(v.tensordesc_meta[0].block_size, vec![64, 64]);
    assert_eq!(v.tensordesc_meta[0].swizzle, 3);
    assert_eq!(kernel_params(&v).len(), 11);

    let src = buf(0x10_0000, 256 * 128 * 2, Dtype::Fp16);
    let dst = buf(0x20_0000, 256 * 128 * 2, Dtype::Fp16);
    let args = [
        KernelArg::TensorDesc(TensorDescArg::contiguous(src, &[256, 128]).unwrap()),
        KernelArg::TensorDesc(TensorDescArg::contiguous(dst, &[256, 128]).unwrap()),
        KernelArg::F16(half::f16::from_f32(2.0)),
    ];
    let p = pack_params(&v, &args).unwrap();
    assert_eq!(
        p.slots,
        vec![0, 256, 128, 128, 1, 0, 256, 128, 128, 1, 0x4000]
    );
    assert_eq!(p.tma.len(), 2);
    let (slot, e) = p.tma[0];
    assert_eq!(slot, 0);
    assert_eq!(p.tma[1].0, 5);
    // As Triton's fill_tma_descriptor: innermost first, strides in bytes.
    assert_eq!(e.rank, 2);
    assert_eq!(e.data_type, 6); // CU_TENSOR_MAP_DATA_TYPE_FLOAT16
    assert_eq!(e.global_address, 0x10_0000);
    assert_eq!(&e.global_dim[..2], &[128, 256]);
    assert_eq!(e.global_strides[0], 256);
    assert_eq!(&e.box_dim[..2], &[64, 64]);
    assert_eq!(e.swizzle, 3);
    assert!(!e.oob_nan);
    let nan = TensorDescArg::contiguous(src, &[256, 128])
        .unwrap()
        .with_nan_padding();
    let mut a2 = args;
    a2[0] = KernelArg::TensorDesc(nan);
    assert!(pack_params(&v, &a2).unwrap().tma[0].1.oob_nan);
}

#[test]
fn import_host_tensor_descriptors_decomposed_on_sm80() {
    let (_t, v, _) = imported("desc_scale_sm80");
    assert_eq!(types(&v)[0], "in_desc: tensordesc<fp16[64, 64]>");
    assert!(v.tensordesc_meta.is_empty());
    assert_eq!(kernel_params(&v).len(), 21);
    let src = buf(0x10_0000, 256 * 128 * 2, Dtype::Fp16);
    let d = TensorDescArg::contiguous(src, &[256, 128]).unwrap();
    let args = [
        KernelArg::TensorDesc(d),
        KernelArg::TensorDesc(d.with_nan_padding()),
        KernelArg::F16(half::f16::ONE),
    ];
    let p = pack_params(&v, &args).unwrap();
    assert!(p.tma.is_empty());
    assert_eq!(
        p.slots,
        vec![
            0x10_0000, 256, 128, 128, 1, 0, 256, 128, 128, 1, //
            0x10_0000, 256, 128, 128, 1, 1, 256, 128, 128, 1, //
            0x3c00
        ]
    );
}

#[test]
fn tensor_descriptor_refusals_name_kernel_argument_and_rule() {
    let (_t, v, _) = imported("desc_scale_sm90");
    let good = buf(0x10_0000, 256 * 128 * 2, Dtype::Fp16);
    let other = buf(0x20_0000, 256 * 128 * 2, Dtype::Fp16);
    let check = |d: Result<TensorDescArg, String>, want: &str| {
        let args = [
            KernelArg::TensorDesc(d.unwrap()),
            KernelArg::TensorDesc(TensorDescArg::contiguous(other, &[256, 128]).unwrap()),
            KernelArg::F16(half::f16::ONE),
        ];
        let e = pack_params(&v, &args).unwrap_err();
        assert!(matches!(e, Error::ArgDesc { .. }), "{e:?}");
        let m = e.to_string();
        assert!(
            m.contains(&v.id)
                && m.contains("argument 0 (in_desc: tensordesc<fp16[64, 64]>)")
                && m.contains(want),
            "want {want:?} in: {m}"
        );
    };
    // element dtype
    check(
        TensorDescArg::contiguous(good.as_dtype(Dtype::Bf16), &[256, 128]),
        "holds bf16 elements, the descriptor type needs fp16",
    );
    // rank
    check(
        TensorDescArg::contiguous(good, &[256 * 128]),
        "takes 2 dimensions",
    );
    // innermost stride
    check(
        TensorDescArg::new(good, &[128, 128], &[1, 128]),
        "innermost stride must be 1",
    );
    // beyond the buffer
    check(
        TensorDescArg::contiguous(good, &[512, 128]),
        "the buffer has 65536",
    );
    // a row stride that is not a multiple of 16 bytes
    check(
        TensorDescArg::new(good, &[100, 100], &[100, 1]),
        "not a multiple of 16",
    );
    // base alignment
    let off = buf(0x10_0008, 256 * 128 * 2, Dtype::Fp16);
    check(
        TensorDescArg::contiguous(off, &[128, 128]),
        "not 16-byte aligned",
    );
    // a zero extent
    check(
        TensorDescArg::contiguous(good, &[0, 128]),
        "every extent must be 1",
    );
    // Not a descriptor at all.
    let args = [
        KernelArg::Buf(good),
        KernelArg::Buf(other),
        KernelArg::F16(half::f16::ONE),
    ];
    let m = pack_params(&v, &args).unwrap_err().to_string();
    assert!(
        m.contains("argument 0 (in_desc) expects tensordesc<fp16[64, 64]>, got Buf of *fp16"),
        "{m}"
    );
    // A descriptor where a scalar goes.
    let d = KernelArg::TensorDesc(TensorDescArg::contiguous(good, &[256, 128]).unwrap());
    let m = pack_params(&v, &[d, d, d]).unwrap_err().to_string();
    assert!(
        m.contains("argument 2 (scale) expects fp16, got TensorDesc of fp16 [256, 128]"),
        "{m}"
    );
    // Rank and stride lists of different lengths are refused when made.
    assert!(TensorDescArg::new(good, &[4, 4], &[4]).is_err());
}

#[test]
fn import_refuses_what_it_cannot_type() {
    // Without the TTIR (.source / .ttir) a 2-byte .b8 array may be fp16 or bf16.
    let t = tempfile::tempdir().unwrap();
    let e = t.path().join("entry");
    std::fs::create_dir(&e).unwrap();
    for ext in ["json", "ptx"] {
        std::fs::copy(
            entry("scalars_sm90").join(format!("scalars.{ext}")),
            e.join(format!("scalars.{ext}")),
        )
        .unwrap();
    }
    let m = import_triton_cache_entry(&e, &t.path().join("pc"))
        .unwrap_err()
        .to_string();
    assert!(
        m.contains("parameter 2") && m.contains("fp16 or bf16") && m.contains(".source"),
        "{m}"
    );

    // Same for a TMA descriptor.
    let e2 = t.path().join("entry2");
    std::fs::create_dir(&e2).unwrap();
    for ext in ["json", "ptx"] {
        std::fs::copy(
            entry("desc_scale_sm90").join(format!("desc_scale.{ext}")),
            e2.join(format!("desc_scale.{ext}")),
        )
        .unwrap();
    }
    let m = import_triton_cache_entry(&e2, &t.path().join("pc"))
        .unwrap_err()
        .to_string();
    assert!(
        m.contains("parameter 0") && m.contains("TMA descriptor"),
        "{m}"
    );

    // A TTIR that disagrees with the PTX (an fp16 argument where the PTX has bf16's
    // neighbour removed): the descriptor's trailing shape/stride arguments are missing.
    let e3 = t.path().join("entry3");
    std::fs::create_dir(&e3).unwrap();
    for ext in ["json", "ptx"] {
        std::fs::copy(
            entry("desc_scale_sm90").join(format!("desc_scale.{ext}")),
            e3.join(format!("desc_scale.{ext}")),
        )
        .unwrap();
    }
    let src = std::fs::read_to_string(entry("desc_scale_sm90").join("desc_scale.source")).unwrap();
    let cut = src.replace("%in_desc_0: i32 loc(\"in_desc\"), ", "");
    assert_ne!(cut, src, "fixture changed: update the test");
    std::fs::write(e3.join("desc_scale.source"), cut).unwrap();
    let m = import_triton_cache_entry(&e3, &t.path().join("pc"))
        .unwrap_err()
        .to_string();
    assert!(
        m.contains("in_desc") && m.contains("2 i32 shapes and 2 i64 strides"),
        "{m}"
    );

    // tensordesc_meta that does not match the signature.
    let e4 = t.path().join("entry4");
    std::fs::create_dir(&e4).unwrap();
    for ext in ["ptx", "source"] {
        std::fs::copy(
            entry("desc_scale_sm90").join(format!("desc_scale.{ext}")),
            e4.join(format!("desc_scale.{ext}")),
        )
        .unwrap();
    }
    let json = std::fs::read_to_string(entry("desc_scale_sm90").join("desc_scale.json")).unwrap();
    let mut md: serde_json::Value = serde_json::from_str(&json).unwrap();
    md["tensordesc_meta"].as_array_mut().unwrap().pop();
    std::fs::write(e4.join("desc_scale.json"), md.to_string()).unwrap();
    let m = import_triton_cache_entry(&e4, &t.path().join("pc"))
        .unwrap_err()
        .to_string();
    assert!(m.contains("desc_scale") && m.contains("PTX"), "{m}");
}

#[test]
fn manifest_refuses_tensordesc_meta_of_the_wrong_count() {
    let (t, _v, _) = imported("desc_scale_sm90");
    let path = t.path().join("manifest.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let mut m: serde_json::Value = serde_json::from_str(&text).unwrap();
    m["variants"][0]["tensordesc_meta"]
        .as_array_mut()
        .unwrap()
        .pop();
    std::fs::write(&path, m.to_string()).unwrap();
    let e = ArtifactStore::open(t.path()).unwrap_err().to_string();
    assert!(
        e.contains("1 tensordesc_meta entries for 2 tensor descriptor arguments"),
        "{e}"
    );
}

#[test]
fn tma_encoding_of_a_strided_3d_descriptor() {
    use tritonrt::abi::tma_host_dtype;
    // Triton's device-side numbering -> the driver's CUtensorMapDataType.
    assert_eq!(tma_host_dtype(6), 6); // fp16
    assert_eq!(tma_host_dtype(10), 9); // bf16
    assert_eq!(tma_host_dtype(9), 8); // fp64
    assert_eq!(tma_host_dtype(8), 10); // fp32 (ftz)
    let (_t, mut v, _) = imported("desc_scale_sm90");
    // The same kernel, pretending the compiler made it 3-D fp32 with a box of 8 x 16 x 32.
    let t3 = ArgType::parse("tensordesc<fp32[8, 16, 32]>").unwrap();
    v.signature[0].ty = t3;
    v.tensordesc_meta[0].block_size = vec![8, 16, 32];
    v.tensordesc_meta[0].elem_size = 4;
    v.tensordesc_meta[0].elem_type = 7;
    // A [4, 64, 96] view of a [4, 64, 128] buffer (row stride 128, plane stride 8192).
    let base = buf(0x40_0000, 4 * 64 * 128 * 4, Dtype::Fp32);
    let d = TensorDescArg::new(base, &[4, 64, 96], &[8192, 128, 1]).unwrap();
    let other = buf(0x80_0000, 128 * 128 * 2, Dtype::Fp16);
    let args = [
        KernelArg::TensorDesc(d),
        KernelArg::TensorDesc(TensorDescArg::contiguous(other, &[128, 128]).unwrap()),
        KernelArg::F16(half::f16::ONE),
    ];
    let p = pack_params(&v, &args).unwrap();
    assert_eq!(&p.slots[..7], &[0, 4, 64, 96, 8192, 128, 1]);
    let e = p.tma[0].1;
    assert_eq!((e.rank, e.data_type), (3, 7));
    assert_eq!(&e.global_dim[..3], &[96, 64, 4]);
    assert_eq!(&e.global_strides[..2], &[512, 32768]);
    assert_eq!(&e.box_dim[..3], &[32, 16, 8]);
    // One plane more than the buffer holds is refused.
    let d = TensorDescArg::new(base, &[5, 64, 96], &[8192, 128, 1]).unwrap();
    let e = pack_params(&v, &[KernelArg::TensorDesc(d), args[1], args[2]]).unwrap_err();
    assert!(
        e.to_string()
            .contains("reaches 163712 bytes, the buffer has 131072"),
        "{e}"
    );
}
