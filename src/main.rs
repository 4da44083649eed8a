//! The `tritonrt` binary (feature `cli`): parsing and subcommands live in [`cli`]; the
//! work is done by the `tritonrt` library.

mod cli;

fn main() {
    std::process::exit(cli::main());
}
