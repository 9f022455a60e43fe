//! `redrivectl`: [`redrivectl::main_with_args`] with this process's
//! arguments; exit codes are in [`redrivectl::error`].

fn main() -> std::process::ExitCode {
    redrivectl::main_with_args(std::env::args_os())
}
