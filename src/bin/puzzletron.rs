//! The `puzzletron` command line: see [`puzzletron::cli`] (feature `cli`).

fn main() {
    // A reader that stops early (`puzzletron ... | head`) ends the output quietly, as for any
    // Unix tool: Rust ignores SIGPIPE, which turns the next write into a panic in `println!`.
    // SAFETY: restoring a signal's default disposition before any thread starts.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    std::process::exit(puzzletron::cli::main());
}
