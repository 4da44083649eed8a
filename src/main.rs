//! The `tritonrt` binary: a thin wrapper around [`tritonrt::cli`].

fn main() {
    std::process::exit(tritonrt::cli::main());
}
