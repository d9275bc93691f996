#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    tributary::cli::main()
}
