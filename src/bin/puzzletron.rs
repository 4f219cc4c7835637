//! The `puzzletron` command line: see [`puzzletron::cli`] (feature `cli`).

fn main() {
    std::process::exit(puzzletron::cli::main());
}
