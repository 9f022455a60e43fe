//! `redrive-tests-executor`: `redrive-executor` (its entry function,
//! [`redrive_executor::main_with_args`]) as a binary of this package, so that cargo
//! builds it before this package's tests and benchmarks
//! ([`redrive_tests::scenario::Binaries::of_tests`]). It runs under the real
//! binary's name: its help, usage lines and messages are `redrive-executor`'s.

fn main() -> std::process::ExitCode {
    redrive_executor::main_with_args(redrive_tests::scenario::args_as("redrive-executor"))
}
