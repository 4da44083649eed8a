//! Launch argument checking and packing, launch planning: pure functions, no GPU.

use std::path::{Path, PathBuf};

use tritonrt::abi::{arg_positions, pack_args, plan_launch, KernelArg};
use tritonrt::artifact::{Arg, ArgType, ArtifactStore, Dtype, Variant};
use tritonrt::driver::Device;
use tritonrt::driver::Kernel;
use tritonrt::runtime::Runtime;
use tritonrt::Error;

fn fixtures() -> PathBuf {
    std::env::var_os("TRITONRT_TEST_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures"))
}

fn axpy() -> Variant {
    let s = ArtifactStore::open(fixtures().join("ptx_cache")).unwrap();
    s.variant("axpy_kernel.BLOCK=1024.w4.s1.sm90")
        .unwrap()
        .clone()
}

fn good_args() -> Vec<KernelArg> {
    vec![
        KernelArg::RawPtr(0x7f00_0000_1000),
        KernelArg::RawPtr(0x7f00_0000_2000),
        KernelArg::RawPtr(0x7f00_0000_3000),
        KernelArg::F32(-1.5),
        KernelArg::I32(-7),
    ]
}

#[test]
fn packs_in_signature_order_with_exact_bits() {
    let slots = pack_args(&axpy(), &good_args()).unwrap();
    assert_eq!(
        slots,
        vec![
            0x7f00_0000_1000,
            0x7f00_0000_2000,
            0x7f00_0000_3000,
            (-1.5f32).to_bits() as u64,
            (-7i32) as u32 as u64,
        ]
    );
    // Each slot holds the value in its low bytes (what the kernel reads).
    assert_eq!(&slots[4].to_le_bytes()[..4], &(-7i32).to_le_bytes());
    assert_eq!(KernelArg::F64(2.5).slot(), 2.5f64.to_bits());
    assert_eq!(KernelArg::I16(-2).slot(), 0xfffe);
    assert_eq!(KernelArg::Bf16(half::bf16::from_f32(1.0)).slot(), 0x3f80);
}

#[test]
fn arity_errors_name_the_kernel_and_signature() {
    let v = axpy();
    let mut args = good_args();
    args.pop();
    let err = pack_args(&v, &args).unwrap_err();
    assert!(
        matches!(
            err,
            Error::ArgCount {
                expected: 5,
                got: 4,
                ..
            }
        ),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(msg.contains(&v.id) && msg.contains("n: i32"), "{msg}");
    args.extend([KernelArg::I32(1), KernelArg::I32(2)]);
    assert!(matches!(
        pack_args(&v, &args).unwrap_err(),
        Error::ArgCount {
            expected: 5,
            got: 6,
            ..
        }
    ));
}

#[test]
fn type_errors_name_the_argument_expected_and_got() {
    let v = axpy();
    let cases: Vec<(usize, KernelArg, &str, &str, &str)> = vec![
        (4, KernelArg::I64(7), "n", "i32", "I64"),
        (4, KernelArg::U32(7), "n", "i32", "U32"),
        (3, KernelArg::F64(1.0), "a", "fp32", "F64"),
        (3, KernelArg::RawPtr(0x1000), "a", "fp32", "RawPtr"),
        (1, KernelArg::U64(0x1000), "y_ptr", "*fp32", "U64"),
    ];
    for (i, bad, name, expected, got) in cases {
        let mut args = good_args();
        args[i] = bad;
        let err = pack_args(&v, &args).unwrap_err();
        match &err {
            Error::ArgType {
                kernel,
                index,
                name: n,
                expected: e,
                ..
            } => {
                assert_eq!(
                    (kernel.as_str(), *index, n.as_str(), e.as_str()),
                    (v.id.as_str(), i, name, expected)
                );
            }
            e => panic!("expected ArgType, got {e:?}"),
        }
        let msg = err.to_string();
        assert!(
            msg.contains(&format!(
                "argument {i} ({name}) expects {expected}, got {got}"
            )),
            "{msg}"
        );
    }
}

#[test]
fn divisibility_is_enforced_for_pointers_and_ints() {
    let v = axpy();
    let mut args = good_args();
    args[2] = KernelArg::RawPtr(0x7f00_0000_3004);
    let err = pack_args(&v, &args).unwrap_err();
    assert!(
        matches!(
            err,
            Error::ArgDivisibility {
                index: 2,
                divisibility: 16,
                ..
            }
        ),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("out_ptr") && msg.contains("0x7f0000003004") && msg.contains("16"),
        "{msg}"
    );
    // a null pointer and any aligned address are fine; `n` has no assumption.
    args[2] = KernelArg::RawPtr(0);
    args[4] = KernelArg::I32(1_000_003);
    pack_args(&v, &args).unwrap();

    // An integer compiled with divisibility 16.
    let mut v16 = v.clone();
    v16.signature[4] = Arg {
        name: "n".into(),
        ty: ArgType::Scalar(Dtype::I32),
        divisibility: 16,
    };
    let mut args = good_args();
    for (n, ok) in [
        (32, true),
        (-48, true),
        (0, true),
        (24, false),
        (1_000_003, false),
    ] {
        args[4] = KernelArg::I32(n);
        let r = pack_args(&v16, &args);
        assert_eq!(r.is_ok(), ok, "n = {n}: {r:?}");
        if !ok {
            assert!(r.unwrap_err().to_string().contains("argument 4 (n)"));
        }
    }
}

#[test]
fn launch_plan_follows_triton_abi() {
    let v = axpy();
    let p = plan_launch(&v, [977, 1, 1]).unwrap();
    assert_eq!(p.grid, [977, 1, 1]);
    assert_eq!(p.block, [128, 1, 1]);
    assert_eq!(p.shared_bytes, 0);
    assert_eq!(
        (p.cluster, p.pdl, p.cooperative, p.empty),
        (None, false, false, false)
    );
    assert!(!p.needs_ex());
    assert_eq!((p.global_scratch_bytes, p.profile_scratch_bytes), (0, 0));
    assert!(plan_launch(&v, [0, 1, 1]).unwrap().empty);

    let mut c = v.clone();
    c.num_ctas = 2;
    c.num_warps = 8;
    c.shared = 64 * 1024;
    c.global_scratch_size = 256;
    c.profile_scratch_size = 8;
    c.launch_pdl = true;
    let p = plan_launch(&c, [3, 2, 5]).unwrap();
    assert_eq!(p.grid, [6, 2, 5], "grid.x * num_ctas");
    assert_eq!(p.block, [256, 1, 1]);
    assert_eq!(p.shared_bytes, 64 * 1024);
    assert_eq!(p.cluster, Some([2, 1, 1]));
    assert!(p.pdl && p.needs_ex());
    assert_eq!(p.global_scratch_bytes, 3 * 2 * 5 * 2 * 256);
    assert_eq!(p.profile_scratch_bytes, 3 * 2 * 5 * 2 * 8);

    let e = plan_launch(&v, [1, 70000, 1]).unwrap_err().to_string();
    assert!(e.contains(&v.id) && e.contains("65535"), "{e}");
    let e = plan_launch(&c, [u32::MAX / 2 + 1, 1, 1])
        .unwrap_err()
        .to_string();
    assert!(e.contains("2^31-1"), "{e}");
}

/// A one-CTA program that asks for clusters (`cluster_dims`, num_ctas 1) is launched on
/// its own grid in clusters of those dimensions; a grid that is not a whole number of
/// clusters is refused naming both.
#[test]
fn launch_plan_clusters_one_cta_programs() {
    let mut v = axpy();
    v.cluster_dims = [8, 1, 1];
    let p = plan_launch(&v, [16, 3, 1]).unwrap();
    assert_eq!(p.grid, [16, 3, 1], "one CTA a program");
    assert_eq!(p.cluster, Some([8, 1, 1]));
    assert!(p.needs_ex());
    let e = plan_launch(&v, [12, 3, 1]).unwrap_err().to_string();
    assert!(
        e.contains(&v.id) && e.contains("[12, 3, 1]") && e.contains("[8, 1, 1]"),
        "{e}"
    );
    // Triton's own clusters: num_ctas decides, cluster_dims recorded alike
    v.num_ctas = 2;
    v.cluster_dims = [2, 1, 1];
    let p = plan_launch(&v, [3, 1, 1]).unwrap();
    assert_eq!((p.grid, p.cluster), ([6, 1, 1], Some([2, 1, 1])));
}

#[test]
fn runtime_types_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Runtime>();
    check::<Kernel>();
    check::<Device>();
    check::<std::sync::Arc<Runtime>>();
}

#[test]
fn arg_positions_follow_the_signature_and_name_what_is_wrong() {
    let sig = axpy().signature; // x_ptr, y_ptr, out_ptr, a, n
    let named = ["n", "a", "out_ptr", "x_ptr", "y_ptr"];
    assert_eq!(
        arg_positions(&sig, &named, false).unwrap(),
        vec![3, 4, 2, 1, 0]
    );
    // a subset list may carry names the signature lacks; a strict one may not
    let wider = ["extra", "n", "a", "out_ptr", "x_ptr", "y_ptr"];
    assert_eq!(
        arg_positions(&sig, &wider, true).unwrap(),
        vec![4, 5, 3, 2, 1]
    );
    let e = arg_positions(&sig, &wider, false).unwrap_err();
    assert!(e.contains("no argument named extra"), "{e}");
    let e = arg_positions(&sig, &["x_ptr", "y_ptr", "a", "n"], true).unwrap_err();
    assert!(e.contains("out_ptr (*fp32) was not supplied"), "{e}");
    let e = arg_positions(&sig, &["x_ptr", "y_ptr", "out_ptr", "a", "n", "a"], false).unwrap_err();
    assert!(e.contains("a was given twice"), "{e}");
}
